"""Metadata of the arithmetic template."""

from templates import _params
from templates._meta import ParamSpec, ParamTarget, TemplateMeta

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
    capabilities=("single-turn chat", "answer with a bare number"),
    parameters=(
        ParamSpec(
            name="level",
            type="int",
            default=1,
            minimum=1,
            maximum=5,
            description="Difficulty: 1 a+b (digits), 2 two-digit a+b, 3 two-digit a±b, 4 a×b, 5 (a op b) op c.",
            target=ParamTarget.DATA,
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
