"""What a user's request names, and the check of any provider's plan against it (`check_request`).

A request names its task by a template's name or a keyword only that template has (`specific_matches`,
`named_tasks`), and may give settings as ``name=value`` pairs (`PAIR`). Whoever planned it (the
offline planner or an LLM), the plan must answer that request: one task, and every pair a parameter of
the plan's template or a training setting, with the value the request gave. Anything else is refused
in one line, never dropped silently.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from pydantic import ValidationError

import templates
from a3r.errors import PlanError
from a3r.study.plans import PlanDraft, TrainingSettings
from a3r.study.teacher import read_teacher
from swarm.client import ServeOptions

__all__ = [
    "DESCRIPTIVE_KEYWORDS",
    "GENERIC_KEYWORDS",
    "PAIR",
    "check_one_dataset",
    "check_one_task",
    "check_pair_names",
    "check_request",
    "generic_found",
    "named_datasets",
    "named_tasks",
    "specific_matches",
]

PAIR = re.compile(r"(?<![\w.-])([a-z][a-z0-9_]*)\s*=\s*([^\s,;]+)")
"""An explicit ``name=value`` pair of a request (``batch_size=3``, ``lr=1e-3``), read lower-cased."""

GENERIC_KEYWORDS = frozenset(
    {
        "game",
        "multi agent",
        "multiagent",
        "self play",
        "social deduction",
        "party game",
        "word game",
        "deception",
        "puzzle",
        "search",
        "reasoning",
        "difficulty",
        "curriculum",
        "equation",
        "word problems",
    }
)
"""Template keywords that name a kind of task, not a task: alone they never choose a template."""

DESCRIPTIVE_KEYWORDS = frozenset(
    {
        "toy",
        "easy",
        "small model",
        "synthetic",
        "sanity check",
        "smoke test",
        "pass@k",
        "addition",
        "subtraction",
        "multiplication",
        "sums",
        "target number",
        "reach a target",
    }
)
"""Template keywords that describe a task's size, purpose, operations or metric rather than name it:
alone they may choose a template ("train a toy task"), but beside another task's name they do not name
a second task ("countdown on a small model", "countdown with multiplication only")."""


def _phrase(text: str) -> tuple[str, ...]:
    return tuple(re.sub(r"[^a-z0-9@]+", " ", text.lower()).split())


def _spans(tokens: tuple[str, ...], phrase: tuple[str, ...]) -> list[tuple[int, int]]:
    n = len(phrase)
    return [(i, i + n) for i in range(len(tokens) - n + 1) if n and tokens[i : i + n] == phrase]


def generic_found(request: str) -> list[str]:
    """The `GENERIC_KEYWORDS` the request says, quoted."""
    tokens = _phrase(request)
    return [repr(k) for k in sorted(GENERIC_KEYWORDS) if _spans(tokens, _phrase(k))]


def _specific_phrases() -> dict[str, set[tuple[str, ...]]]:
    """Per template: its name and the keywords no other template shares that are not a kind of task."""
    metas = templates.list_templates()
    counts: dict[tuple[str, ...], int] = {}
    for meta in metas:
        for keyword in {_phrase(k) for k in meta.keywords}:
            counts[keyword] = counts.get(keyword, 0) + 1
    generic = {_phrase(k) for k in GENERIC_KEYWORDS}
    return {
        meta.name: ({_phrase(k) for k in meta.keywords if counts[_phrase(k)] == 1} - generic)
        | {_phrase(meta.name.replace("_", " "))}
        for meta in metas
    }


def specific_matches(request: str) -> list[tuple[str, float]]:
    """`templates.match`, kept to templates the request names by a *specific* phrase: the template's
    name or a keyword that no other template shares and that is not a kind of task
    (`GENERIC_KEYWORDS`). "train a game" or "multi-agent training" alone choose no template."""
    tokens = _phrase(request)
    specific = {
        name for name, phrases in _specific_phrases().items() if any(_spans(tokens, p) for p in phrases)
    }
    return [(name, score) for name, score in templates.match(request) if name in specific]


def named_tasks(request: str) -> list[str]:
    """The templates the request names as a task, in the order it names them: by a specific phrase
    (`specific_matches`) that is not a description (`DESCRIPTIVE_KEYWORDS`) and not part of a longer
    phrase of another template ("arithmetic puzzle" names countdown, not arithmetic)."""
    tokens = _phrase(request)
    descriptive = {_phrase(k) for k in DESCRIPTIVE_KEYWORDS}
    found = [
        (start, end, name)
        for name, phrases in _specific_phrases().items()
        for phrase in phrases - descriptive
        for start, end in _spans(tokens, phrase)
    ]
    named: list[str] = []
    for start, end, name in sorted(found):
        inside = any(s <= start and end <= e and e - s > end - start and n != name for s, e, n in found)
        if not inside and name not in named:
            named.append(name)
    return named


def check_one_task(request: str) -> None:
    """Refuse a request that names two or more tasks: a study or a training run is on one task.

    Raises:
        PlanError: One line naming them.
    """
    named = named_tasks(request)
    if len(named) > 1:
        raise PlanError(
            f"the request names {len(named)} tasks ({', '.join(named)}); a study runs on one task: ask one "
            "question per task"
        )


_DATASETS = (
    (r"\baime\s*(?:20)?24\b", "aime24"),
    (r"\baime\s*(?:20)?25\b", "aime25"),
    (r"\baime\b", "aime"),
    (r"\bgsm8?k?\b", "gsm8k"),
)
"""How a request names a dataset of the math template (``dataset``): pattern, dataset."""


def named_datasets(text: str) -> list[str]:
    """The datasets ``text`` (lower-cased) names (`_DATASETS`), each once, in the order it names them; a name inside a
    longer one ("aime" in "aime 2024") is that one."""
    found = [(m.start(), m.end(), value) for pattern, value in _DATASETS for m in re.finditer(pattern, text)]
    named: list[str] = []
    for start, end, value in sorted(found):
        inside = any(s <= start and end <= e and e - s > end - start for s, e, _ in found)
        if not inside and value not in named:
            named.append(value)
    return named


def check_one_dataset(request: str) -> None:
    """Refuse a request that names two or more datasets, unless a ``dataset=`` pair chooses one: a plan
    runs on one (``aime`` and ``all`` are the datasets that join them).

    Raises:
        PlanError: One line naming them and the pairs that join them.
    """
    text = request.lower()
    datasets = named_datasets(text)
    if len(datasets) > 1 and not re.search(r"\bdataset\s*=", text):
        raise PlanError(
            f"the request names {len(datasets)} datasets ({', '.join(datasets)}); a plan runs on one: "
            "name one, or write dataset=aime (aime 2024 and 2025) or dataset=all (aime and gsm8k)"
        )


def _not_a_number(value: str) -> bool:
    try:
        return not math.isfinite(float(value))
    except ValueError:
        return False


def check_pair_names(text: str, params: list[str], *, owner: str, varied: str | None = None) -> None:
    """Refuse a ``name=value`` pair of ``text`` that a plan could not use: a value that is nan or inf, a
    name that is neither one of ``params`` nor a training setting (with the nearest known names), a
    ``swarm serve`` option (with the ``--serve-option`` that sets it), or a name given twice with
    different values (except ``varied``, the setting a research question compares); and a
    parameter-like name written alone (``leak_penalty 0.3`` on arithmetic) that is neither.

    Args:
        text: The request (lower-cased).
        params: The parameters of the plan's template (or of its generated code).
        owner: Whose parameters they are, for the refusal (``countdown``, ``the generated code``).
        varied: The setting a research question varies.

    Raises:
        PlanError: One line naming the pair and what to write instead.
    """
    training = list(TrainingSettings.model_fields)
    known = params + training
    seen: dict[str, str] = {}
    for name, value in PAIR.findall(text):
        if _not_a_number(value):
            raise PlanError(f"{name}={value}: nan and inf are not numbers; give a finite value")
        if name in seen and seen[name] != value and name != varied:
            raise PlanError(
                f"{name} is given twice with different values ({seen[name]}, {value}); give it once"
            )
        seen[name] = value
        if name in known:
            continue
        if name in ServeOptions.model_fields:
            raise PlanError(
                f"{name}={value} is an option of swarm serve, not a parameter of {owner} or a training setting: "
                f"pass it as --serve-option {name.replace('_', '-')}={value}"
            )
        raise _unknown(f"{name}={value}", name, params, owner=owner)
    for name in _NAME.findall(PAIR.sub(" ", text)):
        if name not in known and name.replace("_", "") not in _template_names():
            raise _unknown(name, name, params, owner=owner)


_NAME = re.compile(r"(?<![\w./-])([a-z]+(?:_[a-z0-9]+)+)(?![\w/-])")
"""A parameter-like name written alone in a request (``leak_penalty 0.3``): words joined by ``_``."""


def _template_names() -> set[str]:
    return {meta.name.replace("_", "") for meta in templates.list_templates()}


def _unknown(shown: str, name: str, params: list[str], *, owner: str) -> PlanError:
    """The refusal of an unknown setting ``name`` (written ``shown``), with the nearest known names."""
    training = list(TrainingSettings.model_fields)
    near = difflib.get_close_matches(name, params + training, n=3, cutoff=0.5)
    hint = f": did you mean {' or '.join(near)}?" if near else ""
    return PlanError(
        f"unknown setting {shown} in the request, neither a parameter of {owner} nor a training "
        f"setting{hint} (parameters of {owner}: {', '.join(params) or 'none'}; training settings: "
        f"{', '.join(training)})"
    )


def _training_value(name: str, value: str, training: TrainingSettings) -> Any:
    raw: Any = (
        list(range(int(float(value)))) if name == "seeds" and re.fullmatch(r"[0-9.e+-]+", value) else value
    )
    try:
        return getattr(TrainingSettings.model_validate({**training.model_dump(), name: raw}), name)
    except ValidationError as exc:
        raise PlanError(
            "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors(include_input=False))
        ) from None
    except ValueError as exc:
        raise PlanError(f"{name}={value}: {exc}") from None


def _check_distillation(teacher: str | None, plan: PlanDraft) -> None:
    """The plan distils the teacher the request names (`a3r.study.teacher.read_teacher`), in every run
    or as the arm a research question compares; and names no teacher the request does not.

    Raises:
        PlanError: One line naming what the plan does not answer.
    """
    used = plan.training.teacher
    if teacher != used:
        raise PlanError(
            f"the plan's teacher is {used!r}, the request's {teacher!r}; ask again (the provider dropped or "
            "changed it)"
        )
    compared = plan.sweep is not None and plan.sweep.variable == "distill"
    if teacher is not None and not (plan.training.distill or compared):
        raise PlanError(
            "the request distils a teacher, the plan does not (distill is false and no question compares "
            "it); ask again"
        )


def check_request(request: str, plan: PlanDraft) -> PlanDraft:
    """Check any provider's plan against its request: the request names at most one task
    (`check_one_task`) and one dataset (`check_one_dataset`), and every ``name=value`` pair of it is known (`check_pair_names`) and used: the
    plan's training setting or template parameter has that value (the setting a research question
    varies excepted; a research plan may run more seeds than asked, never fewer).

    Returns:
        ``plan``, unchanged.

    Raises:
        PlanError: One line naming what the plan does not answer.
    """
    teacher, request = read_teacher(request)
    _check_distillation(teacher, plan)
    check_one_task(request)
    check_one_dataset(request)
    text = request.lower()
    varied = plan.sweep.variable if plan.sweep is not None else None
    meta = templates.get_template(plan.template).meta if plan.template is not None else None
    if meta is None:  # generated code: its parameters are the plan's
        check_pair_names(text, list(plan.params), owner="the generated code", varied=varied)
    else:
        check_pair_names(text, [p.name for p in meta.parameters], owner=meta.name, varied=varied)
    for name, value in PAIR.findall(text):
        if name == varied:
            continue
        if name in TrainingSettings.model_fields:
            wanted = _training_value(name, value, plan.training)
            used = getattr(plan.training, name)
            # a research plan may run more seeds than asked (its floor), never fewer
            ok = len(used) >= len(wanted) if name == "seeds" and isinstance(wanted, list) else used == wanted
        elif meta is not None:
            try:
                wanted = meta.param(name).coerce(value, template=meta.name)
            except templates.TemplateParamError as exc:
                raise PlanError(str(exc)) from None
            used = plan.params.get(name)
            ok = used == wanted
        else:
            continue  # generated code: its parameters' types are its own
        if not ok:
            raise PlanError(
                f"the plan does not use {name}={value} of the request: it has {name} = {used!r}; ask again "
                "(the provider dropped or changed it)"
            )
    return plan
