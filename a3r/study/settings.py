"""The settings a research question may vary: a typed registry of training settings and template knobs.

Each `Setting` knows its type, valid range, default coarse grid, how the refine stage splits an
interval, and where its value goes:

* ``training`` settings are `a3r.study.plans.TrainingSettings` fields that every run passes to
  ``swarm serve`` (`serve_flags`: lr, B, G, LoRA rank, KL β, PPO clip ε, PPO epochs, minibatches,
  distillation from the plan's teacher;
  swarm's `swarm.train.TrainerConfig` fields behind those flags);
* ``template`` settings are parameters of the study's template (``max_tokens``, ``temperature``, any
  other numeric or boolean knob of its workflow ``PARAMS``): each configuration runs a copy of the
  rendered workflow with the value substituted, while held-out evaluation keeps the frozen original.

A setting the engine cannot change is refused in one line (`resolve_setting`, `refusal_for`), never
silently ignored: a trainer field without a ``swarm serve`` flag (weight decay, entropy bonus, gradient
clipping), something the trainer does not have (warm-up, schedules, dropout), or a template parameter
that changes the task data (then configurations would not share their tasks or held-out set).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

import templates
from a3r.errors import PlanError

__all__ = [
    "DISTILL_ALIAS",
    "SETTINGS",
    "UNSUPPORTED",
    "Setting",
    "find_setting_in",
    "join_knob_names",
    "refusal_for",
    "resolve_setting",
    "serve_flags",
    "studiable",
    "switch_refusal",
    "template_knobs",
    "value_text",
    "written",
]

Scale = Literal["log", "pow2", "linear"]


class Setting(BaseModel):
    """One setting a study can vary.

    Attributes:
        name: `TrainingSettings` field or template parameter name (``kl_coef``, ``max_tokens``).
        label: Human name, e.g. ``KL coefficient β``.
        kind: Value type.
        minimum: Inclusive lower bound.
        maximum: Inclusive upper bound (exclusive where ``open_max``).
        open_max: The upper bound itself is invalid (the PPO clip ε < 1).
        default: The value runs use when the setting is not varied.
        coarse: Default values of the coarse stage (clipped to the range).
        scale: How refine splits an interval (`midpoint`).
        target: ``training`` (a `TrainingSettings` field sent to ``swarm serve``) or ``template``.
        flag: The ``swarm serve`` flag it sets (training settings).
        aliases: Regular expressions that name it in a sentence (the offline planner's parser).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    label: str
    kind: Literal["int", "float", "bool"]
    minimum: float
    maximum: float
    open_max: bool = False
    default: float
    coarse: tuple[float, ...]
    scale: Scale = "linear"
    target: Literal["training", "template"] = "training"
    flag: str | None = None
    aliases: tuple[str, ...] = ()

    def cast(self, value: float) -> int | float | bool:
        """``value`` as the setting's type (ints rounded, bools from 0/1)."""
        if self.kind == "bool":
            return bool(value)
        return round(value) if self.kind == "int" else float(value)

    def text(self, value: float) -> str:
        """``value`` as the setting's type prints it (``8`` for an int setting, ``0.01`` for a float,
        ``true``/``false`` for a switch)."""
        if self.kind == "bool":
            return "true" if value else "false"
        return str(self.cast(value)) if self.kind != "float" else f"{value:g}"

    def check(self, value: float) -> None:
        """Refuse a value outside the range.

        Raises:
            PlanError: One line naming the setting and its range.
        """
        if not math.isfinite(value):
            raise PlanError(
                f"{self.label} ({self.name}) = {value:g}: nan and inf are not numbers; give a finite value"
            )
        if self.kind == "bool" and value not in (0, 1):
            raise PlanError(f"{self.label} ({self.name}) is true or false (1 or 0), not {value:g}")
        high_ok = value < self.maximum if self.open_max else value <= self.maximum
        if not (self.minimum <= value and high_ok):
            bracket = ")" if self.open_max else "]"
            raise PlanError(
                f"{self.label} ({self.name}) = {value:g} is outside its range [{self.minimum:g}, {self.maximum:g}{bracket}"
            )
        if self.kind != "float" and value != round(value):
            raise PlanError(f"{self.label} ({self.name}) takes whole values, not {value:g}")

    def midpoint(self, low: float, high: float) -> float | None:
        """The value refine tests between two tested values, or ``None`` when nothing fits between.

        ``pow2`` and integer settings: the integer midpoint; ``log``: the geometric mean rounded to two
        significant digits (a quarter of ``high`` when ``low`` is 0); ``linear``: the arithmetic mean.
        """
        low, high = min(low, high), max(low, high)
        if self.kind == "bool":
            return None
        if self.kind == "int":
            middle: float = math.floor((low + high) / 2)
        elif self.scale == "log":
            middle = high / 4 if low <= 0 else math.sqrt(low * high)
            middle = float(f"{middle:.2g}")
        else:
            middle = float(f"{(low + high) / 2:.3g}")
        return middle if low < middle < high else None

    def grid(self, values: list[float]) -> list[float]:
        """``values`` kept within the range, sorted and without repeats."""
        kept: list[float] = []
        for value in sorted(set(values)):
            try:
                self.check(value)
            except PlanError:
                continue
            kept.append(value)
        return kept


def _row(
    name: str,
    label: str,
    kind: Literal["int", "float", "bool"],
    bounds: tuple[float, float],
    default: float,
    coarse: tuple[float, ...],
    scale: Scale,
    aliases: tuple[str, ...],
    target: Literal["training", "template"] = "training",
    open_max: bool = False,
) -> Setting:
    """One row of `SETTINGS`; a training setting's ``swarm serve`` flag is its name with dashes."""
    return Setting(
        name=name,
        label=label,
        kind=kind,
        minimum=bounds[0],
        maximum=bounds[1],
        open_max=open_max,
        default=default,
        coarse=coarse,
        scale=scale,
        target=target,
        flag=name.replace("_", "-") if target == "training" else None,
        aliases=aliases,
    )


_MAX_TOKENS_ALIASES = (
    r"\bmax(?:imum)?[ _-]?(?:response|completion)?[ _-]?(?:tokens|length)\b",
    r"\bresponse[ _-]?length\b",
    r"\bcompletion[ _-]?length\b",
)

DISTILL_ALIAS = r"\bdistil(?:l)?(?:ation|ing|ed|s)?\b"
"""What names distillation in a question ("does distilling <teacher> beat GRPO alone"): the ``distill``
setting, false = GRPO alone, true = on-policy distillation from the plan's teacher (issue 38)."""

# fmt: off
SETTINGS: Mapping[str, Setting] = {
    s.name: s
    for s in (
        # name, label, kind, (minimum, maximum), default, coarse grid, scale, aliases[, target, open maximum]
        _row("lr", "learning rate", "float", (1e-8, 1.0), 2e-4, (1e-5, 1e-4, 1e-3), "log", (r"\blr\b", r"\blearning[ _-]?rates?\b")),
        _row("batch_size", "batch size B", "int", (1, 4096), 2, (1, 2, 4, 8), "pow2", (r"\bbatch[ _-]?sizes?\b", r"\bbatch\b")),
        _row("group_size", "group size G", "int", (2, 256), 4, (2, 4, 8), "pow2", (r"\bgroup[ _-]?sizes?\b", r"\bgroup\b")),
        _row("lora_rank", "LoRA rank", "int", (1, 1024), 16, (4, 16, 64), "pow2", (r"\blora[ _-]?ranks?\b", r"\brank\b")),
        _row("kl_coef", "KL coefficient β", "float", (0.0, 10.0), 0.0, (0.0, 0.01, 0.1, 1.0), "log",
             (r"\bkl\b", r"\bkl[ _-]?(?:coef|coefficient|penalty|beta)\b", r"\bbeta\b")),
        _row("clip_eps", "PPO clip range ε", "float", (0.01, 1.0), 0.2, (0.1, 0.2, 0.3), "linear",
             (r"\bclip(?:ping)?[ _-]?(?:range|eps|epsilon|ratio)?\b",), open_max=True),
        _row("ppo_epochs", "PPO epochs per step", "int", (1, 16), 1, (1, 2, 4), "pow2", (r"\b(?:ppo[ _-]?)?epochs?\b",)),
        _row("minibatches", "minibatches per epoch", "int", (1, 64), 1, (1, 2, 4), "pow2", (r"\bmini[ _-]?batch(?:es)?\b",)),
        _row("distill", "teacher distillation", "bool", (0, 1), 0.0, (0, 1), "linear", (DISTILL_ALIAS,)),
        _row("max_tokens", "max response tokens", "int", (1, 32768), 256, (64, 256, 1024), "pow2", _MAX_TOKENS_ALIASES, "template"),
        _row("temperature", "sampling temperature", "float", (0.0, 2.0), 1.0, (0.6, 1.0, 1.4), "linear", (r"\btemperatures?\b",), "template"),
    )
}
# fmt: on
"""The known settings by name. Template settings here carry the parser's aliases and a default grid;
their range comes from the template's own `ParamSpec` when one is known (`resolve_setting`)."""

UNSUPPORTED: Mapping[str, tuple[str, str]] = {
    "weight decay": (r"weight[ _-]?decay", "swarm serve has no flag for the trainer's weight decay"),
    "entropy bonus": (
        r"entropy[ _-]?(?:bonus|coef|coefficient)",
        "swarm serve has no flag for the entropy bonus",
    ),
    "gradient clipping": (
        r"grad(?:ient)?[ _-]?(?:norm|clip)",
        "swarm serve has no flag for the gradient-norm clip",
    ),
    "warm-up": (r"warm[ _-]?up", "the swarm trainer has no learning-rate warm-up"),
    "lr schedule": (
        r"(?:lr|learning[ _-]?rate)[ _-]?(?:schedule|decay)",
        "the swarm trainer has no lr schedule",
    ),
    "dropout": (r"dropout", "the swarm trainer has no dropout setting"),
    "optimizer": (
        r"\b(?:optimi[sz]er|adam|sgd|momentum)\b",
        "the swarm trainer's optimizer is fixed (AdamW)",
    ),
}
"""Settings a question may name that the engine cannot change: name → (pattern, why)."""


def template_knobs(meta: templates.TemplateMeta) -> list[str]:
    """The parameters of a template a study can vary: the numeric and true/false parameters of its
    workflow. A parameter that changes the task data, or a text one, cannot be varied
    (`resolve_setting` refuses it); ``max_tokens`` and ``temperature`` are varied only where the
    template has them."""
    return [
        p.name
        for p in meta.parameters
        if p.target == templates.ParamTarget.WORKFLOW and p.type in ("int", "float", "bool")
    ]


def studiable(meta: templates.TemplateMeta | None = None) -> str:
    """What a study can vary, for a refusal's line: the training settings and, given a template, its
    knobs (`template_knobs`), each name once."""
    training = ", ".join(s.name for s in SETTINGS.values() if s.target == "training")
    if meta is None:
        return f"a training setting ({training}) or a numeric or true/false knob of the template's workflow"
    knobs = ", ".join(template_knobs(meta)) or "none"
    return f"a training setting ({training}) or a knob of the {meta.name} template ({knobs})"


def switch_refusal(setting: Setting, goal: str) -> str:
    """One line refusing a minimal-stable or best question over a true/false setting (two values: no
    range to search), naming the two questions that work for it: A vs B, and the effect of switching
    it from its default (the reference) to the other value."""
    default, other = setting.text(setting.default), setting.text(1 - setting.default)
    what = "a minimal stable value" if goal == "min_stable" else "a best value"
    return (
        f"{setting.label} ({setting.name}) is true or false, so {what} is not a question to ask of it: compare "
        f"the two ('{setting.name} true vs false') or measure the effect of switching it from its default "
        f"{default} to {other} ('effect of {setting.name}')"
    )


def refusal_for(text: str) -> str | None:
    """One line refusing the first unsupported setting ``text`` names, or ``None``."""
    for name, (pattern, why) in UNSUPPORTED.items():
        if re.search(pattern, text, re.IGNORECASE):
            return f"cannot vary the {name}: {why}; a study can vary {studiable()}"
    return None


def join_knob_names(text: str, meta: templates.TemplateMeta) -> str:
    """``text`` with each parameter name of ``meta`` that has several words, written with spaces or
    dashes ("describe max tokens"), written as the name (``describe_max_tokens``): a registry setting's
    name inside it (max tokens) is then not read as that setting (the aliases stop at ``_``)."""
    for spec in sorted(meta.parameters, key=lambda p: -len(p.name)):
        words = spec.name.split("_")
        if len(words) > 1:
            text = re.sub(r"\b" + "[ _-]".join(map(re.escape, words)) + r"\b", spec.name, text)
    return text


def find_setting_in(text: str, meta: templates.TemplateMeta | None = None) -> str | None:
    """The setting a sentence names (registry aliases first, then a template knob named
    ``name`` or ``name with spaces``), or ``None``."""
    lowered = text.lower()
    found: list[tuple[int, str]] = []
    for setting in SETTINGS.values():
        for alias in setting.aliases:
            match = re.search(alias, lowered)
            if match:
                found.append((match.start(), setting.name))
                break
    if meta is not None:
        for spec in meta.parameters:
            spoken = spec.name.replace("_", "[ _-]?")
            match = re.search(rf"\b{spoken}\b", lowered)
            if match and spec.name not in SETTINGS:
                found.append((match.start(), spec.name))
    if not found:
        return None
    # "the batch size at KL 0.1" names batch size first: the first mention is the varied setting.
    return min(found)[1]


def _template_knob(meta: templates.TemplateMeta, name: str, base: Setting | None) -> Setting:
    spec = next((p for p in meta.parameters if p.name == name), None)
    if spec is None:
        raise PlanError(
            f"the {meta.name} template has no {name} parameter; its knobs: {', '.join(template_knobs(meta)) or 'none'}"
        )
    if spec.target != templates.ParamTarget.WORKFLOW:
        raise PlanError(
            f"cannot vary {name} of {meta.name}: it changes the task data (and the held-out set), so "
            "configurations would not share their tasks; run one study per value instead"
        )
    if spec.type == "str":
        raise PlanError(f"cannot vary {name} of {meta.name}: it is text, not a number or a switch")
    default = spec.default if isinstance(spec.default, int | float) else 0.0
    if spec.type == "bool":
        return Setting(
            name=name,
            label=name.replace("_", " "),
            kind="bool",
            minimum=0,
            maximum=1,
            default=float(bool(spec.default)),
            coarse=(0, 1),
            target="template",
        )
    minimum = spec.minimum if spec.minimum is not None else -math.inf
    maximum = spec.maximum if spec.maximum is not None else math.inf
    if base is not None:
        coarse = tuple(v for v in base.coarse if minimum <= v <= maximum) or (float(default),)
        return base.model_copy(
            update={"minimum": minimum, "maximum": maximum, "default": float(default), "coarse": coarse}
        )
    spread = (0.5 * default, float(default), 2.0 * default) if default else (0.0, 0.5, 1.0)
    coarse = tuple(
        v for v in sorted({round(x) if spec.type == "int" else x for x in spread}) if minimum <= v <= maximum
    )
    return Setting(
        name=name,
        label=name.replace("_", " "),
        kind="int" if spec.type == "int" else "float",
        minimum=minimum,
        maximum=maximum,
        default=float(default),
        coarse=coarse or (float(default),),
        scale="linear",
        target="template",
    )


def resolve_setting(name: str, template: str | None) -> Setting:
    """The `Setting` called ``name`` for a study of ``template``.

    Args:
        name: A registry name (``kl_coef``) or a parameter of the template's workflow.
        template: The study's template (``None``: generated code, whose knobs are unknown).

    Raises:
        PlanError: One line: an unknown setting (with the known ones), a template setting the template
            lacks, a data parameter, or a template setting of generated code.
    """
    base = SETTINGS.get(name)
    if base is not None and base.target == "training":
        return base
    if template is None:
        raise PlanError(
            f"cannot vary {name}: generated code has no declared parameters; vary a training setting "
            f"({', '.join(s for s, v in SETTINGS.items() if v.target == 'training')})"
        )
    try:
        meta = templates.get_template(template).meta
    except templates.TemplateError as exc:
        raise PlanError(str(exc)) from None
    if base is None and not any(p.name == name for p in meta.parameters):
        raise PlanError(f"unknown setting {name!r}: a study varies {studiable(meta)}")
    return _template_knob(meta, name, base)


def written(value: object) -> str:
    """A parameter's value as a request writes it: ``true``/``false`` for a switch, else its repr."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def value_text(name: str, template: str | None, value: float) -> str:
    """A value of the setting ``name`` of a study of ``template`` as it is printed (`Setting.text`:
    ``true``/``false`` for a switch); ``f"{value:g}"`` for a setting that does not resolve."""
    try:
        return resolve_setting(name, template).text(value)
    except PlanError:
        return f"{value:g}"


def serve_flags(settings: BaseModel) -> dict[str, Any]:
    """The ``swarm serve`` options a run's `TrainingSettings` set: every training setting's flag.

    ``distill`` sets ``--distill`` to the mode (``None``, left at swarm's default, when the run does
    not distil), and a distilling run also ``--distill-coef`` and ``--teacher`` (its ``teacher-url``
    field): the teacher as the plan names it, a URL, or a checkpoint directory that the run's
    execution replaces by the URL of the teacher server it starts (`a3r.swarmops.teacher`).

    Args:
        settings: A `a3r.study.plans.TrainingSettings` (typed as its base: plans imports this module).
    """
    values = settings.model_dump()
    flags = {s.flag: values[s.name] for s in SETTINGS.values() if s.flag is not None}
    distill = bool(values["distill"])
    flags["distill"] = values["distill_mode"] if distill else None
    if distill:
        flags["distill-coef"] = values["distill_coef"]
        flags["teacher-url"] = values["teacher"]
    return flags
