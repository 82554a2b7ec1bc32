"""The offline provider: needs no network.

`OfflineProvider` matches the request against the template registry by its name or a keyword specific
to it, reads parameters from the sentence, plans research questions over any setting of the registry
(`a3r.study.settings`: min-stable, best, A-vs-B, effect-of) and proposes rule-based patches. It is honest about its limits: a request no template covers raises
`OfflineUnsupported` naming what is needed (an LLM provider).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import ValidationError

import templates
from a3r.errors import OfflineUnsupported, PlanError
from a3r.providers.protocol import CodeFailure, Mode
from a3r.study.analysis import Diagnosis, DiagnosisKind
from a3r.study.design import SEED_FLOOR, hypotheses_for
from a3r.study.plans import (
    GeneratedCode,
    HypothesisDraft,
    PatchDraft,
    PlanDraft,
    StabilityCriterion,
    SweepSpec,
    TrainingSettings,
    check_plan,
)
from a3r.study.request import (
    PAIR,
    check_one_dataset,
    check_one_task,
    check_pair_names,
    check_request,
    generic_found,
    named_datasets,
    named_tasks,
    specific_matches,
)
from a3r.study.settings import (
    DISTILL_ALIAS,
    SETTINGS,
    Setting,
    find_setting_in,
    join_knob_names,
    refusal_for,
    resolve_setting,
    studiable,
    switch_refusal,
    template_knobs,
    written,
)
from a3r.study.teacher import read_mode, read_teacher, teacher_text

__all__ = ["NEEDS_LLM", "OfflineProvider", "read_params"]

NEEDS_LLM = (
    "an LLM provider: pass --provider anthropic (with ANTHROPIC_API_KEY set) or --provider openai "
    "(with OPENAI_API_KEY set; --base-url for a local vLLM or Ollama server)"
)


# ------------------------------------------------------------------------------------------ helpers
_PARAMS_LITERAL = re.compile(r"# <params>[^\n]*\n(.*?)# </params>", re.DOTALL)


def read_params(workflow_source: str) -> dict[str, Any]:
    """The ``PARAMS`` dict of a rendered workflow (the ``# <params>`` block), read without importing.

    Raises:
        ValueError: No params block, or it is not a literal dict.
    """
    match = _PARAMS_LITERAL.search(workflow_source)
    if match is None:
        raise ValueError("workflow has no '# <params>' block")
    tree = ast.parse(match.group(1))
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if value is not None:
            literal = ast.literal_eval(value)
            if isinstance(literal, dict):
                return cast(dict[str, Any], literal)
    raise ValueError("the params block holds no literal dict")


_NUMBER = r"(-?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?|[-+]?(?:nan|inf(?:inity)?)(?![a-z]))"
"""A signed decimal or scientific number (``-0.5``, ``1e-3``), captured; also ``nan`` and ``inf``, read
so that they are refused as not numbers (`Setting.check`, `_find_number`) rather than passed over."""

_COUNTS = {
    spec.name: spec.counts for meta in templates.list_templates() for spec in meta.parameters if spec.counts
}
"""Template parameters a request may give as a count of things ("6 players", "two spies"): name → the
things' pattern (`templates.ParamSpec.counts`), over every template (a count a template lacks is refused)."""

_VALUE = (
    rf"(?<![\w.]){_NUMBER}(?![\w]|\.[0-9])"
    r"(?!\s*(?:training\s*)?(?:steps?|seeds?|tasks?|episodes?|epochs?|tokens?|"
    + "|".join(_COUNTS.values())
    + r")\b)"
)
"""A number standing alone: not glued to letters (a dataset's name holds no value) and not a count of
something else (``20 steps``, a template's count: ``3 players``)."""

_SWITCH = (
    r"(?<![\w.])(true|false|yes|no|off"
    r"|on(?!\s+(?!(?:on|vs\.?|versus|and|or|against|than|then|better|worse|beats?|outperforms?|loses?|underperforms?)\b)[a-z])"
    rf"|{_NUMBER[1:-1]})(?![\w]|\.[0-9])"
)
"""A value of a true/false setting: one of `BOOL_WORDS`, or a number (1 and 0; `Setting.check` refuses
others). "on" followed by a word other than a joiner or "on" is the preposition ("effect of hide_leaks on
who-is-the-spy"), not a value ("hide_leaks off vs on on who-is-the-spy": the value, then the preposition)."""

_SWITCH_WORDS = {"true": 1.0, "yes": 1.0, "on": 1.0, "false": 0.0, "no": 0.0, "off": 0.0}

_JOINER = (
    r"\s*(?:,|;|=|:|\band\b|\bor\b|\bvs\.?|\bversus\b|\bagainst\b|\bto\b|\bfrom\b|\bof\b|\bthen\b"
    r"|\b(?:better|worse)\s+than\b|\bbeats?\b|\boutperforms?\b|\bloses?\s+to\b|\bunderperforms?\b)?\s*"
)
"""What may stand between a setting's name and its values, or between two values."""


def _mention_end(text: str, aliases: tuple[str, ...]) -> int | None:
    """Where the first mention of a setting (any of its ``aliases``) ends, or ``None``."""
    found = [(m.start(), -m.end()) for a in aliases if (m := re.search(a, text))]
    return -min(found)[1] if found else None  # the longest of the earliest: "batch size", not "batch"


def _aliases(setting: Setting) -> tuple[str, ...]:
    """What names ``setting`` in a sentence: its aliases, or its name (``_`` as a space or a dash)."""
    return setting.aliases or (rf"\b{setting.name.replace('_', '[ _-]?')}\b",)


def _values_after(text: str, setting: Setting) -> list[float]:
    """The run of numbers written right after the setting's first mention (``"kl 0.01, 0.1 and 1"``,
    ``"lr 1e-4 vs 1e-3"``, ``"effect of kl -0.5"``) or, when none follows it, right before it
    (``"compare 1e-4 and 3e-4 learning rates"``); numbers elsewhere in the sentence (steps, seeds, a
    dataset's name) are not its values.

    A later mention with values of its own that is not joined to the earlier values ("lr 1e-4 vs 1e-3
    on arithmetic lr=3e-4") gives the setting twice: refused, unless it repeats them.

    Raises:
        PlanError: A value outside the setting's range (`Setting.check`), or the setting given twice
            with different values; one line.
    """
    aliases = _aliases(setting)
    if _mention_end(text, aliases) is None:
        return []
    pattern = _SWITCH if setting.kind == "bool" else _VALUE
    found: list[float] = []
    last = -1  # where the values read so far end
    for start, position in _mention_spans(text, aliases):  # "batch size 8 beats batch size 2": both mentions
        group: list[float] = []
        while match := re.compile(_JOINER + pattern).match(text, position):
            group.append(_value_of(match.group(1)))
            position = match.end()
        if not group:
            continue
        if found and not re.fullmatch(_JOINER, text[last:start]):
            # "lr 1e-4 vs 1e-3 on arithmetic lr=3e-4": a second giving of the setting, not a third arm
            if group == found:
                continue
            raise PlanError(
                f"{setting.label} ({setting.name}) is given twice with different values "
                f"({', '.join(setting.text(v) for v in found)}; {', '.join(setting.text(v) for v in group)}); "
                "give its values once"
            )
        found += group
        last = position
    if not found:
        found = _values_before(text[: _mention_start(text, aliases)], pattern)
    for value in found:
        setting.check(value)
    return found


def _mention_spans(text: str, aliases: tuple[str, ...]) -> list[tuple[int, int]]:
    """Where each mention of a setting starts and ends, in order (the longest alias at each start)."""
    longest: dict[int, int] = {}
    for alias in aliases:
        for m in re.finditer(alias, text):
            longest[m.start()] = max(longest.get(m.start(), 0), m.end())
    spans: list[tuple[int, int]] = []
    for start in sorted(longest):
        if not spans or start >= spans[-1][1]:
            spans.append((start, longest[start]))
    return spans


def _mention_start(text: str, aliases: tuple[str, ...]) -> int:
    """Where the first mention of a setting starts (it is known to be there)."""
    return min(m.start() for a in aliases if (m := re.search(a, text)))


def _value_of(word: str) -> float:
    """A value as read: a number, or a word of `_SWITCH_WORDS` as 1 or 0."""
    return _SWITCH_WORDS[word] if word in _SWITCH_WORDS else float(word)


def _values_before(prefix: str, value: str = _VALUE) -> list[float]:
    """The run of values (``value``: `_VALUE` or `_SWITCH`) that ends ``prefix`` (only spaces after
    it), joined as in `_JOINER`."""
    matches = list(re.finditer(value, prefix))
    if not matches or prefix[matches[-1].end() :].strip():
        return []
    run = [matches[-1]]
    for earlier in reversed(matches[:-1]):
        if not re.fullmatch(_JOINER, prefix[earlier.end() : run[0].start()]):
            break
        run.insert(0, earlier)
    return [_value_of(m.group(1)) for m in run]


def _is_number(value: str) -> bool:
    return re.fullmatch(_NUMBER, value) is not None


def _find_number(text: str, *patterns: str) -> float | None:
    """The number of the first of ``patterns`` (``NUM`` marks it) found in ``text``, or ``None``.

    Raises:
        PlanError: It is ``nan`` or ``inf`` (one line quoting the phrase).
    """
    for pattern in patterns:
        match = re.search(pattern.replace("NUM", _NUMBER), text)
        if match:
            number = float(match.group(1))
            if not math.isfinite(number):
                raise PlanError(
                    f"'{match.group(0).strip()}': nan and inf are not numbers; give a finite value"
                )
            return number
    return None


_NUMBER_WORDS = {
    word: i
    for i, word in enumerate(
        ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"), 1
    )
}


def _counts(text: str, meta: templates.TemplateMeta) -> dict[str, float]:
    """The `_COUNTS` parameters ``text`` gives as a count, in digits or words ("2 spies", "six players");
    ranges are the template's to check.

    Raises:
        PlanError: A count of nan or inf, or of something the template has no parameter for (never
            dropped silently).
    """
    names = {p.name for p in meta.parameters}
    counts: dict[str, float] = {}
    for name, things in _COUNTS.items():
        number = rf"(?<![\w.-])({_NUMBER[1:-1]}|{'|'.join(_NUMBER_WORDS)})"
        match = re.search(rf"{number}\s*(?:{things})\b", text)
        if match is None:
            continue
        word = match.group(1)
        if name not in names:
            raise PlanError(
                f"'{match.group(0)}': the {meta.name} template has no parameter for it (its parameters: "
                f"{', '.join(sorted(names))})"
            )
        value = float(_NUMBER_WORDS[word]) if word in _NUMBER_WORDS else float(word)
        if not math.isfinite(value):
            raise PlanError(f"'{match.group(0)}': nan and inf are not numbers; give a finite value")
        counts[name] = value
    return counts


BOOL_WORDS = ("true", "false", "yes", "no", "on", "off")
"""Words a request may give a true/false template parameter (`templates.ParamSpec.coerce` reads them)."""


def _bool_param(name: str, template: str, text: str) -> dict[str, str]:
    """A true/false template parameter written in words: its name (``_`` or a space between its words)
    then one of `BOOL_WORDS`, e.g. "with tell roles true", "tell-roles: off".

    Returns:
        ``{name: word}``, or ``{}`` when the request does not name the parameter.

    Raises:
        PlanError: The request names the parameter without a value it can read (never dropped silently).
    """
    phrase = r"[ _-]?".join(re.escape(word) for word in name.split("_"))
    found = re.search(rf"\b{phrase}\b\s*(?:=|:|is|to|set to)?\s*{_SWITCH}", text)
    if found and found.group(1) in BOOL_WORDS:
        return {name: found.group(1)}
    if re.search(rf"\b{phrase}\b", text):
        raise PlanError(
            f"{name!r} is a true/false parameter of {template}: write its value after it "
            f"({name}=true, '{name.replace('_', ' ')} off'; one of {', '.join(BOOL_WORDS)})"
        )
    return {}


def _rationale(
    template: str,
    score: float,
    params: dict[str, Any],
    read: list[str],
    chosen: list[str],
    training: Mapping[str, Any],
) -> str:
    """Why this plan: the template's keyword match, the parameters and training settings read from the
    request (with their values), those the plan chose, and that the rest are the template's defaults."""
    given = ", ".join(f"{k} = {written(params[k])}" for k in read) or "none"
    text = f"template {template!r} matched the request by keywords (score {score:g}); parameters read from the request: {given}"
    if training:
        text += "; training settings read from the request: " + ", ".join(
            f"{k} = {v!r}" for k, v in training.items()
        )
    if chosen:
        text += f"; chosen by the plan: {'; '.join(chosen)}"
    rest = [k for k in sorted(params) if k not in read and not any(c.startswith(f"{k} ") for c in chosen)]
    if rest:
        text += f"; template defaults: {', '.join(rest)}"
    return text


def _effect_example(setting: Setting, variable: str, reference: float) -> str:
    """An effect-of question that works for ``setting`` from ``reference``, quoted."""
    if setting.kind == "bool":
        return (
            f"'effect of {variable}' (it switches {setting.text(reference)} → {setting.text(1 - reference)})"
        )
    changed = next((v for v in reversed(setting.coarse) if v != reference), setting.coarse[-1])
    return f"'effect of {variable} {setting.text(changed)}'"


def _question_forms(setting: Setting, variable: str, reference: float) -> str:
    """The questions the offline planner answers about ``setting``, each with an example that works for
    its type and range: a true/false setting has A vs B and the effect of switching it; a number also
    the best value, and a size (``pow2``) the minimal stable one."""
    if setting.kind == "bool":
        return (
            f"A vs B ('{variable} true vs false') and the effect of switching it from the reference "
            f"{setting.text(reference)} to {setting.text(1 - reference)} ('effect of {variable}')"
        )
    low, high = setting.coarse[0], setting.coarse[-1]
    forms = [f"the best value ('best {variable}')"]
    if setting.scale == "pow2":
        forms.insert(0, f"the minimal stable value ('min stable {variable}')")
    forms.append(f"A vs B ('{variable} {setting.text(low)} vs {setting.text(high)}')")
    forms.append(f"the effect of a change ({_effect_example(setting, variable, reference)})")
    return ", ".join(forms[:-1]) + " and " + forms[-1]


def _matched_template(request: str) -> tuple[str, float]:
    """The template a request names (its name or a keyword specific to it) and its match score.

    Raises:
        OfflineUnsupported: Two tasks or datasets named, no template matches (naming the loose matches
            and the known templates), or two templates match equally; one line.
    """
    check_one_task(request)
    check_one_dataset(request)
    named = named_tasks(request)
    # a description ("a small model") chooses a template only when no task is named
    matches = [m for m in specific_matches(request) if not named or m[0] in named]
    if not matches:
        known = ", ".join(m.name for m in templates.list_templates())
        loose = [name for name, _ in templates.match(request)]
        found = generic_found(request)
        why = ""
        if loose:
            kind_of = (
                f"{' and '.join(found)} name{'s' if len(found) == 1 else ''} a kind of task, not a task; "
                if found
                else ""
            )
            why = f" ({kind_of}loosely matched: {', '.join(loose)})"
        raise OfflineUnsupported(
            f"no task template covers {request!r}{why}; name one (templates: {known}), or writing a new "
            f"workflow, reward and data builder needs {NEEDS_LLM}"
        )
    if len(matches) > 1 and matches[0][1] == matches[1][1]:
        raise OfflineUnsupported(
            f"{request!r} names two templates equally ({matches[0][0]}, {matches[1][0]}); name one"
        )
    return matches[0]


def _training_plan(name: str, params: dict[str, Any], training: TrainingSettings) -> PlanDraft:
    """The plan of a training request on template ``name``: its hypothesis is that the train reward rises
    (by GRPO, or by distilling the plan's teacher into the policy)."""
    teacher = teacher_text(training.teacher) if training.distill and training.teacher else None
    return PlanDraft(
        kind="train",
        template=name,
        params=params,
        objective=(
            f"distil the teacher ({teacher}) into the policy on the {name} template"
            if teacher
            else f"train the policy on the {name} template"
        ),
        training=training,
        hypotheses=[
            HypothesisDraft(
                statement=(
                    f"{training.distill_mode} distillation from {teacher} on {name} raises the mean training reward"
                    if teacher
                    else f"GRPO training on {name} raises the mean training reward"
                ),
                expected_outcome="the mean train reward rises over training by more than its noise",
                decision_rule=(
                    "effect = the change of the per-step mean train reward along its least-squares trend "
                    "(a3r.study.effects): confirmed if its 95% CI (over seeds with >= 2 seeds, else over "
                    "steps with the AR(1) effective sample size) lies above 0.5 σ of the per-step noise; "
                    "refuted if it lies below; otherwise unconfirmed, with the seeds or steps that would "
                    "settle it; never confirmed for a run that cannot learn"
                ),
            )
        ],
    )


def _varied_setting(text: str, template: str) -> tuple[str, Setting, dict[str, float]]:
    """The setting a research question varies and the other training settings it fixes (one value each).

    Raises:
        OfflineUnsupported: No setting named, another setting given several values or named without a
            value (a second question), or a knob the template lacks; one line.
    """
    meta = templates.get_template(template).meta
    fixed: dict[str, float] = {}  # other training settings the question gives one value each
    variable = find_setting_in(text, meta)
    if variable is None:
        raise OfflineUnsupported(
            f"the question names no setting to vary; the offline planner studies {studiable(meta)}; "
            f"open questions need {NEEDS_LLM}"
        )
    setting = resolve_setting(variable, template)
    others: list[str] = []
    knobs = set(template_knobs(meta))
    # the registry's settings, then the template's own knobs (a one-value knob is read as a parameter)
    candidates = [*SETTINGS.values(), *(resolve_setting(k, template) for k in knobs if k not in SETTINGS)]
    for other in candidates:
        if other.name == variable or _mention_end(text, _aliases(other)) is None:
            continue
        given = _values_after(text, other)
        if not given:
            others.append(other.label)
        elif len(set(given)) > 1:
            raise OfflineUnsupported(
                f"the question varies {setting.label} and also gives {other.label} "
                f"{', '.join(other.text(v) for v in given)}; the offline planner varies one setting per "
                "study: ask one question per setting"
            )
        elif other.target == "training":
            fixed[other.name] = given[0]
        elif other.name not in knobs:
            raise OfflineUnsupported(
                f"the question sets {other.label}, which the {template} template has no knob for "
                f"(its knobs: {', '.join(sorted(knobs)) or 'none'})"
            )
    if others:
        # "the best batch size and lr": a second setting named without a value is a second question.
        raise OfflineUnsupported(
            f"the question varies {setting.label} and also names {', '.join(others)} without a value; the "
            "offline planner varies one setting per study: ask one question per setting, or give the "
            f"other a fixed value (e.g. '{setting.label} ... with {others[0]} <value>')"
        )
    return variable, setting, fixed


def _goal_design(
    text: str, setting: Setting, values: list[float], reference: float, training: TrainingSettings
) -> tuple[SweepSpec, StabilityCriterion | None, str]:
    """The sweep, stability criterion and objective of the question's goal over ``setting``: min-stable,
    A vs B or best of several compared (`_compared_design`), effect-of (`_effect_design`), or best.

    Raises:
        OfflineUnsupported: A goal the setting's kind does not allow, or no goal understood; one line.
    """
    variable = setting.name
    switch = setting.kind == "bool"
    if re.search(r"\b(min|minimum|minimal|smallest|lowest)\b", text):
        if switch:
            raise OfflineUnsupported(switch_refusal(setting, "min_stable"))
        if setting.scale != "pow2":
            raise OfflineUnsupported(
                f"a minimal stable {setting.label} is not a question the offline planner asks (stability "
                "rises with sizes: batch size, group size, LoRA rank, epochs, max tokens); ask for the best "
                f"{setting.label}, or use {NEEDS_LLM}"
            )
        coarse = setting.grid(values or list(setting.coarse))
        stability = StabilityCriterion(last_k=max(1, min(3, training.steps // 2)))
        sweep = SweepSpec(variable=variable, coarse=coarse, goal="min_stable")
        return sweep, stability, f"find the minimal stable {setting.label}"
    compared = _compared_design(text, setting, values)
    if compared is not None:
        return compared[0], None, compared[1]
    if re.search(r"\b(effect|impact|does|influence|matter)\b", text):
        sweep, objective = _effect_design(setting, values, reference)
        return sweep, None, objective
    if re.search(r"\b(best|optimal|optimum|good|tune|tuning)\b", text):
        if switch:
            raise OfflineUnsupported(switch_refusal(setting, "best"))
        grid = list(setting.coarse)
        if variable == "lr" and training.lora_rank == 0:
            # LoRA's best rate sits ~10x above full fine-tuning's (Schulman et al. 2025, "LoRA Without Regret").
            grid = [1e-6, 1e-5, 1e-4]
        sweep = SweepSpec(variable=variable, coarse=setting.grid(values or grid), goal="best")
        return sweep, None, f"find the best {setting.label}"
    raise OfflineUnsupported(
        f"which question about {setting.label}? The offline planner answers "
        f"{_question_forms(setting, variable, reference)}; other questions need {NEEDS_LLM}"
    )


def _compared_design(text: str, setting: Setting, values: list[float]) -> tuple[SweepSpec, str] | None:
    """The sweep and objective of a comparison ("vs", "beats", "compare"): two values are A vs B (B the
    value the question expects to win), more than two a best-of over them; ``None`` when the question
    compares nothing or fewer than two values.

    Raises:
        OfflineUnsupported: A best-of over a true/false setting; one line.
    """
    variable, switch = setting.name, setting.kind == "bool"
    shown = ", ".join(setting.text(v) for v in values)
    compared = re.search(
        r"\b(vs\.?|versus|against|compare|or|than|beats?|outperforms?|loses?|underperforms?)\b", text
    )
    if compared and len(values) > 2:
        # "lr 1e-4 vs 1e-3 vs 1e-2": more than two arms is a search for the best of them.
        if switch:
            raise OfflineUnsupported(switch_refusal(setting, "best"))
        sweep = SweepSpec(variable=variable, coarse=setting.grid(values), goal="best")
        return sweep, f"find the best {setting.label} among {shown}"
    if compared and len(values) == 2:
        # The hypothesis of an A-vs-B question is "B beats A": a question that says which value it
        # expects to win ("X beats Y", "X is worse than Y") puts that value in B.
        a, b = values
        first, second = setting.text(a), setting.text(b)
        if re.search(r"\b(better\s+than|beats?|outperforms?)\b", text):
            sweep = SweepSpec(variable=variable, coarse=[b, a], refine=False, goal="a_vs_b")
            return sweep, f"does {setting.label} {first} beat {second}?"
        if re.search(r"\b(worse\s+than|loses?\s+to|underperforms?)\b", text):
            sweep = SweepSpec(variable=variable, coarse=[a, b], refine=False, goal="a_vs_b")
            return sweep, f"does {setting.label} {second} beat {first}?"
        sweep = SweepSpec(variable=variable, coarse=[a, b], refine=False, goal="a_vs_b")
        return sweep, f"compare {setting.label} {first} (A) with {second} (B)"
    return None


_GRPO_ALONE = re.compile(
    r"\b(?:grpo|rl|reinforcement learning)(?:\s+(?:alone|only))?\b"
    r"|\bwithout\s+(?:a\s+|the\s+)?(?:teacher|distil\w*)|\bno\s+(?:teacher|distil\w*)"
)
"""The arm without the teacher in a distillation question ("GRPO alone", "without distillation")."""


def _distill_arms(text: str) -> list[float]:
    """The two arms of a question comparing distillation with GRPO alone, in the order it names them
    (``[1, 0]``: distillation first), so that "X beats Y" puts X in B (`_compared_design`); ``[]``
    when it names no arm without the teacher (an effect-of question then switches distillation on)."""
    alone = _GRPO_ALONE.search(text)
    mention = re.search(DISTILL_ALIAS, text)
    if alone is None or mention is None:
        return []
    return [1.0, 0.0] if mention.start() < alone.start() else [0.0, 1.0]


def _distill_objective(sweep: SweepSpec, training: TrainingSettings) -> str:
    """The objective of a study over ``distill``: whether distilling the plan's teacher beats GRPO
    alone (B, the arm expected to win, is the second value), or the effect of switching it on."""
    teacher = teacher_text(training.teacher) if training.teacher else "the teacher"
    distil = f"{training.distill_mode} distillation from {teacher}"
    if sweep.goal == "effect_of":
        return f"the effect of {distil} against GRPO alone"
    a, b = (distil, "GRPO alone") if sweep.coarse[0] else ("GRPO alone", distil)
    return f"does {b} beat {a}?"


def _with_teacher(
    training: TrainingSettings, teacher: str, text: str, read: list[str], *, distill: bool
) -> tuple[TrainingSettings, str]:
    """``training`` with the request's teacher, distilled in every run when ``distill`` (a training
    request; a research question compares it), in the mode the request asks for (`read_mode`) unless a
    ``distill_mode=`` pair gave it; and what the plan chose, for the rationale."""
    mode = training.distill_mode if "distill_mode" in read else read_mode(text)
    update: dict[str, Any] = {"teacher": teacher, "distill_mode": mode}
    if distill:
        update["distill"] = True
    updated = TrainingSettings.model_validate({**training.model_dump(), **update})
    return updated, f"teacher {teacher_text(teacher)} read from the request ({mode} distillation)"


def _effect_design(setting: Setting, values: list[float], reference: float) -> tuple[SweepSpec, str]:
    """The sweep and objective of an effect-of question: ``setting`` from ``reference`` to the one value
    given (a true/false setting: to the other value).

    Raises:
        OfflineUnsupported: Several values, or none other than the reference; one line.
    """
    variable, switch = setting.name, setting.kind == "bool"
    shown = ", ".join(setting.text(v) for v in values)
    if len(values) > 1:
        raise OfflineUnsupported(
            f"an effect-of question changes {setting.label} to one value, not {shown}; ask "
            f"'{variable} {setting.text(values[0])} vs {setting.text(values[1])}' to compare two"
            + ("" if switch else ", or for the best of several")
        )
    # A switch has one value to change to: the other one.
    changed = values[0] if values else (1.0 - reference if switch else None)
    if changed is None or changed == reference:
        raise OfflineUnsupported(
            f"an effect-of question needs the value to change {setting.label} to, other than the "
            f"reference {setting.text(reference)}, e.g. " + _effect_example(setting, variable, reference)
        )
    sweep = SweepSpec(variable=variable, coarse=[reference, changed], refine=False, goal="effect_of")
    return sweep, f"the effect of {setting.label} {setting.text(reference)} → {setting.text(changed)}"


# ------------------------------------------------------------------------------------------ offline
class OfflineProvider:
    """Deterministic provider: keyword-matched templates, parsed parameters, rule-based patches.

    Research questions understood: min-stable, best, A-vs-B and effect-of over any setting of
    `a3r.study.settings` (training settings and template knobs), each a staged design
    (`a3r.study.design`); values are read right after the setting's name.
    """

    name = "offline"

    def plan(self, request: str, *, mode: Mode) -> PlanDraft:
        """Plan ``request`` from the template registry.

        Raises:
            OfflineUnsupported: No template matches the request, or a research question the offline
                planner does not know; the message names what is needed (an LLM provider).
            PlanError: A parameter read from the request is out of the template's range.
        """
        # a teacher's URL or path names no task, dataset or setting: read it first, plan the rest
        teacher, request_rest = read_teacher(request)
        text = request_rest.lower()
        name, score = _matched_template(request_rest)
        template = templates.get_template(name)
        text = join_knob_names(text, template.meta)  # "describe max tokens" is one knob, not max tokens
        varied = find_setting_in(text, template.meta) if mode == "research" else None
        check_pair_names(text, [p.name for p in template.meta.parameters], owner=name, varied=varied)
        params, read = self._template_params(template.meta, text, varied=varied)
        chosen: list[str] = []  # parameters the plan sets, neither read nor left at their default
        kind: Literal["train", "research"] = "research" if mode == "research" else "train"
        # A research question's numbers after the varied setting are its values, not a training setting.
        training, training_read = self._training(text, skip=varied)
        if teacher is not None:
            training, how = _with_teacher(training, teacher, text, training_read, distill=kind == "train")
            chosen.append(how)
        if kind == "research":
            draft = self._research_plan(text, name, params, training)
            if draft.sweep is not None and draft.sweep.variable in params:  # a template knob
                read = [r for r in read if r != draft.sweep.variable]
                chosen.append(f"{draft.sweep.variable} is the swept knob (each run sets its own value)")
        else:
            draft = _training_plan(name, params, training)
        draft = draft.model_copy(
            update={
                "rationale": _rationale(
                    name, score, params, read, chosen, {k: getattr(draft.training, k) for k in training_read}
                )
            }
        )
        return check_request(request, check_plan(draft))

    def _research_plan(
        self, text: str, name: str, params: dict[str, Any], training: TrainingSettings
    ) -> PlanDraft:
        """The research plan of a question on template ``name``: its sweep (`_research_design`), the
        training settings with the question's fixed values and enough seeds, and its hypotheses. A swept
        template knob keeps the template's default in ``params`` (each run sets its own value).

        Raises:
            OfflineUnsupported: A question the offline planner does not know (`_research_design`).
            PlanError: A value out of range.
        """
        sweep, stability, objective, fixed = self._research_design(text, training, name)
        if sweep.variable == "distill":
            objective = _distill_objective(sweep, training)
        if fixed:  # "… with kl 0.1": a fixed value of another training setting
            try:
                training = TrainingSettings.model_validate({**training.model_dump(), **fixed})
            except ValidationError as exc:
                raise PlanError(
                    "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors(include_input=False))
                ) from None
        seeds = max(stability.min_seeds if stability else SEED_FLOOR, len(training.seeds))
        training = training.model_copy(update={"seeds": list(range(seeds))})
        knob = next(
            (p for p in templates.get_template(name).meta.parameters if p.name == sweep.variable), None
        )
        if knob is not None:  # the workflow keeps the template's default; each run overrides it
            params[sweep.variable] = knob.default
        draft = PlanDraft(
            kind="research",
            template=name,
            params=params,
            objective=objective,
            training=training,
            sweep=sweep,
            stability=stability,
        )
        return draft.model_copy(update={"hypotheses": hypotheses_for(draft)})

    @staticmethod
    def _template_params(
        meta: templates.TemplateMeta, text: str, *, varied: str | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """Every parameter of the template (resolved: types checked, defaults filled in) and the names
        of those the request gave; a true/false knob a research question varies (``varied``) is not
        read here (its values are the question's, `_values_after`)."""
        params: dict[str, Any] = {}
        names = {p.name for p in meta.parameters}
        for spec in meta.parameters:  # "level 3", "temperature of 0.5": the phrases the template declares
            number = (
                _find_number(text, *(phrase + "NUM" for phrase in spec.phrases)) if spec.phrases else None
            )
            if number is not None:
                params[spec.name] = int(number) if spec.type == "int" else number
        if "dataset" in names and not re.search(r"\bdataset\s*=", text):  # a dataset=… pair wins
            datasets = named_datasets(text)  # two were refused (`check_one_dataset`)
            if datasets:
                params["dataset"] = datasets[0]
        params |= _counts(text, meta)
        for spec in meta.parameters:
            match = re.search(rf"\b{re.escape(spec.name)}\s*=\s*([^\s,;]+)", text)
            spoken = r"[ _-]?".join(re.escape(word) for word in spec.name.split("_"))
            if match:  # explicit "name=value" pairs win
                params[spec.name] = match.group(1)
            elif spec.type in ("int", "float") and spec.name not in params:
                # "<name> 0.3", "<name in words> of 0.3": never dropped silently
                number = _find_number(text, rf"\b{spoken}\b\s*(?:of|=|:|to|at)?\s*NUM(?![\w.])")
                if number is not None:
                    params[spec.name] = number
            elif spec.type == "bool" and spec.name != varied:
                params |= _bool_param(spec.name, meta.name, text)
        try:
            return dict(meta.resolve(params)), sorted(params)
        except templates.TemplateParamError as exc:
            raise PlanError(str(exc)) from None

    @staticmethod
    def _training(text: str, *, skip: str | None = None) -> tuple[TrainingSettings, list[str]]:
        """The training settings of ``text`` and the names of those it gave: explicit ``name=value``
        pairs first (``batch_size=3 steps=2``), then phrases (``20 steps``, ``batch size of 8``) read
        from what is left once the pairs are taken out, for the settings no pair gave.

        Raises:
            PlanError: A value out of its setting's range or of the wrong type (one line).
        """
        values: dict[str, Any] = {}
        for name, value in PAIR.findall(text):
            if name in TrainingSettings.model_fields:
                values[name] = (
                    list(range(int(float(value)))) if name == "seeds" and _is_number(value) else value
                )
        rest = PAIR.sub(" ", text)
        phrases = {
            "steps": (r"NUM\s*(?:training\s*)?steps\b(?!\s*[=:])", r"\bsteps?\s*:?\s*NUM"),
            "batch_size": (r"batch[ _-]?size\s*(?:of|:)?\s*NUM",),
            "group_size": (r"group[ _-]?size\s*(?:of|:)?\s*NUM",),
            "lr": (r"(?:\blr|learning rate)\s*(?:of|:)?\s*NUM",),
            "seeds": (r"NUM\s*seeds\b(?!\s*[=:])", r"\bseeds\s*:\s*NUM"),
        }
        for name, patterns in phrases.items():
            number = None if name in values else _find_number(rest, *patterns)
            if number is None:
                continue
            values[name] = (
                list(range(int(number))) if name == "seeds" else number if name == "lr" else int(number)
            )
        values.pop(skip or "", None)
        try:
            return TrainingSettings(**values), sorted(values)
        except ValidationError as exc:
            raise PlanError(
                "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors(include_input=False))
            ) from None

    @staticmethod
    def _research_design(
        text: str, training: TrainingSettings, template: str
    ) -> tuple[SweepSpec, StabilityCriterion | None, str, dict[str, float]]:
        """The sweep of a research question: the setting it names (`a3r.study.settings`), the goal
        (min-stable, best, A-vs-B, effect-of) and the values: the numbers written right after the
        setting (`_values_after`). Two values compared are A vs B; more than two compared ("1e-4 vs 1e-3
        vs 1e-2") are a best-of over them. An effect-of question changes the setting from the plan's
        value (the training default, or the template's default) to the one value given.

        Raises:
            OfflineUnsupported: A setting the engine cannot change, no setting named, a second setting
                named without a value (a second question), an effect-of question with no value other
                than the reference or with several, or no goal understood; one line naming what is
                needed.
            PlanError: A value out of the setting's range.
        """
        refusal = refusal_for(text)
        if refusal is not None:
            raise OfflineUnsupported(refusal)
        variable, setting, fixed = _varied_setting(text, template)
        values = _values_after(text, setting)
        if variable == "distill" and not values:  # "does distilling <teacher> beat GRPO alone": two arms
            values = _distill_arms(text)
        # The reference of an effect-of question: what the plan runs when the setting is not varied (the
        # question's value is the one changed to, so the training settings never take it).
        reference = float(getattr(training, variable)) if setting.target == "training" else setting.default
        sweep, stability, objective = _goal_design(text, setting, values, reference, training)
        return sweep, stability, objective, fixed

    def write_code(
        self, request: str, plan: PlanDraft, *, failure: CodeFailure | None = None
    ) -> GeneratedCode:
        """Always raises: the offline provider writes no new code.

        Raises:
            OfflineUnsupported: Naming what is needed.
        """
        raise OfflineUnsupported(
            f"writing new task code for {request!r} needs {NEEDS_LLM}; the offline provider only renders templates"
        )

    @staticmethod
    def _reward_patch(diagnosis: Diagnosis, workflow: str, *, template: str | None) -> PatchDraft | None:
        """The template's reward patch (`templates.Template.reward_patch`: the weights of its reward
        parts, by their roles) for the part the diagnosis names, or for every weighted part when it names
        none (train reward up while held-out reward falls). The reward's weights are the workflow's
        ``PARAMS``; the frozen evaluator keeps the original ones. A template that weighs no part (one that
        pays only a verified correct answer) gets no patch (the finding is recorded).
        """
        try:
            params = read_params(workflow)
            found = templates.get_template(template) if template else None
        except (ValueError, SyntaxError, templates.TemplateError):
            return None
        remedy = found.reward_patch(params, str(diagnosis.evidence.get("part", ""))) if found else None
        if remedy is None:
            return None
        new = templates.substitute_params(workflow, {**params, **remedy.workflow})
        shown = ", ".join(f"{k} {params.get(k)} → {v:g}" for k, v in remedy.workflow.items())
        return PatchDraft(
            file="workflow.py",
            new_content=new,
            rationale=f"{diagnosis.summary}. Reward patch: {shown}. {remedy.reason}",
        )

    def propose_patch(
        self, diagnosis: Diagnosis, files: Mapping[str, str], *, template: str | None
    ) -> PatchDraft | None:
        """Rule-based fixes of the workflow's ``PARAMS`` (or the tasks) for zero-signal groups, and of
        the reward's weights for reward hacking (`_reward_patch`).

        Rules, in order: identical completions within a group at a low sampling temperature → raise it
        to 1.0; else the template's own remedy for groups with no signal (`templates.Template.no_signal`:
        e.g. a few-shot example turned on, or ``tasks.jsonl`` rebuilt a level easier or harder). Other
        diagnoses get ``None`` (code fixes need an LLM provider).
        """
        if diagnosis.kind is DiagnosisKind.reward_hacking and "workflow.py" in files:
            return self._reward_patch(diagnosis, files["workflow.py"], template=template)
        if diagnosis.kind is not DiagnosisKind.zero_signal or "workflow.py" not in files:
            return None
        workflow = files["workflow.py"]
        try:
            params = read_params(workflow)
        except (ValueError, SyntaxError):
            return None
        evidence = diagnosis.evidence
        all_zero = int(evidence.get("all_zero_groups", 0)) >= int(evidence.get("all_same_positive_groups", 0))
        temperature = params.get("temperature")
        if isinstance(temperature, int | float) and temperature < 0.7:
            new = templates.substitute_params(workflow, {**params, "temperature": 1.0})
            return PatchDraft(
                file="workflow.py",
                new_content=new,
                rationale=(
                    f"{diagnosis.summary}. Sampling temperature is {temperature:g}: the G attempts of a task are "
                    "(nearly) identical, so their rewards are equal and GRPO advantages vanish. Raising the "
                    "temperature to 1.0 makes attempts differ."
                ),
            )
        try:
            found = templates.get_template(template) if template else None
        except templates.TemplateError:
            return None
        if found is None or found.no_signal_for is None:
            return None
        rows = None
        if "tasks.jsonl" in files:
            rows = [json.loads(line) for line in files["tasks.jsonl"].splitlines() if line.strip()]
        remedy = found.no_signal(params, rows, all_zero=all_zero)
        if remedy is None:
            return None
        rationale = f"{diagnosis.summary}. {remedy.reason}"
        if remedy.data:
            tasks = found.build_tasks(remedy.data)
            new = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks)
            return PatchDraft(file="tasks.jsonl", new_content=new, rationale=rationale)
        new = templates.substitute_params(workflow, {**params, **remedy.workflow})
        return PatchDraft(file="workflow.py", new_content=new, rationale=rationale)
