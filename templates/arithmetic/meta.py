"""Metadata of the arithmetic template."""

from typing import Any

from templates import _params
from templates._advice import Remedy
from templates._meta import ParamSpec, TemplateMeta

META = TemplateMeta(
    name="arithmetic",
    title="Synthetic arithmetic with difficulty levels",
    description=(
        "Generated arithmetic questions answered with a bare number. Level 1 is single-digit addition "
        "(the embedded SmolLM2-135M gets some right, so GRPO has signal); levels 2-5 add two-digit "
        "addition, subtraction, multiplication and three-operand expressions. Questions are seeded by "
        "index, so runs repeat and resume. A sanity task for a training setup."
    ),
    keywords=(
        "arithmetic",
        "addition",
        "subtraction",
        "multiplication",
        "sums",
        "synthetic",
        "toy",
        "smoke test",
        "sanity check",
        "easy",
        "small model",
        "difficulty",
        "curriculum",
    ),
    reward_parts={"format_ok": "format", "correct": "goal"},
    starter="at level 1",
    capabilities=("single-turn chat", "answer with a bare number"),
    parameters=(
        _params.data_int(
            "level",
            1,
            1,
            5,
            "Difficulty: 1 a+b (digits), 2 two-digit a+b, 3 two-digit a±b, 4 a×b, 5 (a op b) op c.",
            phrases=(r"level\s*", r"difficulty\s*"),
        ),
        _params.n_tasks(512, "Number of tasks to write."),
        _params.seed("Generator seed (task i depends only on seed, level and i)."),
        ParamSpec(
            name="fewshot",
            type="bool",
            default=True,
            description="Prefix three solved single-digit additions as chat turns.",
        ),
        _params.max_tokens(16, 4096),
        _params.temperature(),
    ),
)


def no_signal(params: dict[str, Any], tasks: list[dict[str, Any]] | None, *, all_zero: bool) -> Remedy | None:
    """The remedy for groups whose attempts all earn the same reward (hook of `templates.Template.no_signal`).

    Every attempt fails with the few-shot example off: turn it on. Else, with the tasks at hand, all fail
    above level 1: rebuild them one level easier; all earn the same positive reward below level 5: one
    level harder.

    Args:
        params: The workflow's ``PARAMS``.
        tasks: The rows of ``tasks.jsonl`` (``None`` when it is not at hand).
        all_zero: The groups all earn 0 (else they all earn the same positive reward).
    """
    if all_zero and params.get("fewshot") is False:
        return Remedy(
            "Every attempt fails; a solved example shows the answer format.", workflow={"fewshot": True}
        )
    if tasks is None:
        return None
    spec = META.param("level")
    level = int(tasks[0].get("level", 1)) if tasks else 1
    target = level - 1 if all_zero else level + 1
    low, high = spec.minimum, spec.maximum
    if low is None or high is None or not low <= target <= high or target == level:
        return None
    direction = "easier" if all_zero else "harder"
    reason = (
        f"Level {level} is too {'hard' if all_zero else 'easy'} for this model; level {target} tasks "
        f"({direction}) give groups with mixed rewards."
    )
    return Remedy(reason, data={"level": target, "n_tasks": len(tasks), "seed": 0})


def easier(params: dict[str, Any]) -> str:
    """What to try on this template when the untrained model scores zero (hook of `templates.Template.easier`):
    an easier level, few-shot examples when they are off, more completion tokens at level 1."""
    fewshot_off = params.get("fewshot") is False
    level = int(params.get("level") or 1)
    if level > 1:
        return f"arithmetic level {level - 1} or 1 (easier questions){', few-shot examples on' if fewshot_off else ''}"
    return ("few-shot examples on, " if fewshot_off else "") + "more completion tokens"
