"""What the planner decides, as pydantic schemas (also the structured-output schemas of LLM providers).

A `PlanDraft` is what a provider proposes for a user's request (template, parameters, training
settings, pre-registered hypotheses, and for research questions the sweep and the operational
definition of "stable"). `check_plan` validates a draft against the template registry, so an LLM's
plan and the offline planner's plan pass the same gate.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import templates
from a3r.errors import PlanError
from a3r.study.effects import MIN_STEPS
from a3r.study.settings import resolve_setting, switch_refusal
from a3r.study.teacher import teacher_text
from a3r.study.wording import counted

__all__ = [
    "MIN_TEMPERATURE",
    "GeneratedCode",
    "Goal",
    "HypothesisDraft",
    "PatchDraft",
    "PlanDraft",
    "StabilityCriterion",
    "SweepSpec",
    "TrainingSettings",
    "check_plan",
    "steps_warning",
    "temperature_warning",
    "training_line",
]

ParamValue = bool | int | float | str | None


class TrainingSettings(BaseModel):
    """Training settings of one run (server and client options).

    Attributes:
        steps: Trainer steps (policy updates) to run; the runner stops at this step.
        batch_size: B, GRPO groups (tasks) per trainer step.
        group_size: G, episodes per task (one GRPO group).
        lr: Learning rate of the policy optimizer (LoRA wants ~10× the full fine-tuning rate).
        lora_rank: LoRA adapter rank; 0 trains all weights (full fine-tuning, float32).
        kl_coef: β of the KL penalty to the reference policy (``swarm serve --kl-coef``); 0 disables it.
        clip_eps: ε of the PPO clip ratio range [1 − ε, 1 + ε] (``--clip-eps``).
        ppo_epochs: Passes over each batch per trainer step (``--ppo-epochs``).
        minibatches: Optimizer updates per pass (``--minibatches``).
        concurrency: Episodes the client runs at once.
        seeds: Seeds to replicate the run on.
        smoke_tasks: Tasks of the smoke run (one group each) before training; 0 skips it.
        teacher: The teacher of on-policy distillation (issue 38): a server URL that scores token ids
            (``swarm serve --teacher``), or a checkpoint directory a3r serves itself; ``None``: none.
        distill: Whether the runs learn from the teacher (``--teacher``, ``--distill``); a research
            question may compare it (false: GRPO alone) against distillation.
        distill_mode: ``pure`` (the teacher's per-token reverse-KL advantage alone) or ``mixed`` (the
            task reward's advantage plus ``distill_coef`` times it) (``--distill``).
        distill_coef: The teacher's share in ``mixed`` distillation (``--distill-coef``).
    """

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=4, ge=1, le=100_000)
    batch_size: int = Field(default=2, ge=1, le=4096)
    group_size: int = Field(default=4, ge=2, le=256)
    lr: float = Field(default=2e-4, gt=0, le=1.0)
    lora_rank: int = Field(default=16, ge=0, le=1024)
    kl_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    clip_eps: float = Field(default=0.2, gt=0.0, lt=1.0)
    ppo_epochs: int = Field(default=1, ge=1, le=16)
    minibatches: int = Field(default=1, ge=1, le=64)
    concurrency: int = Field(default=8, ge=1, le=1024)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, max_length=16)
    smoke_tasks: int = Field(default=1, ge=0, le=64)
    teacher: str | None = Field(default=None, min_length=1, max_length=4096)
    distill: bool = False
    distill_mode: Literal["pure", "mixed"] = "pure"
    distill_coef: float = Field(default=1.0, ge=0.0, le=100.0)

    @model_validator(mode="after")
    def _coef_only_when_mixed(self) -> TrainingSettings:
        # swarm serve refuses a coefficient that pure distillation would ignore: refuse it in the plan
        if self.distill and self.distill_mode == "pure" and self.distill_coef != 1.0:
            raise ValueError(
                "distill_coef weighs the teacher only in mixed distillation: ask for distillation "
                "'with the reward', or leave distill_coef out"
            )
        return self

    def distillation_fields(self) -> dict[str, Any]:
        """The distillation settings as a plan shows them: none when the run has no teacher and does
        not distil (so a plan without a teacher reads as before issue 38)."""
        if self.teacher is None and not self.distill:
            return {}
        return {k: getattr(self, k) for k in ("teacher", "distill", "distill_mode", "distill_coef")}

    def shown_fields(self) -> dict[str, Any]:
        """Every setting as a plan shows them: the distillation settings only when they are used."""
        shown = self.model_dump(exclude={"teacher", "distill", "distill_mode", "distill_coef"})
        return shown | self.distillation_fields()


class HypothesisDraft(BaseModel):
    """A hypothesis registered before any run that tests it.

    Attributes:
        statement: The claim.
        expected_outcome: What the runs show if it holds.
        decision_rule: How results decide, fixed in advance (thresholds, seeds).
    """

    model_config = ConfigDict(extra="forbid")

    statement: str = Field(min_length=1)
    expected_outcome: str = Field(min_length=1)
    decision_rule: str = Field(min_length=1)


class StabilityCriterion(BaseModel):
    """Operational definition of a *stable* training run (pre-registered with the plan).

    A run is stable when (1) it finished without a crash or hang once training began, (2) its held-out
    mean reward after training is at least the untrained model's held-out mean reward on the same
    held-out tasks (the preflight) − ``delta``: held-out against held-out, like for like (a run without
    a held-out evaluation is compared with itself: its train reward over its last ``last_k`` steps
    against its first ``last_k`` − ``delta``), and (3) no collapse was detected: the policy entropy,
    where reported, stays above ``entropy_min`` and the KL to the reference below ``kl_max``, and the
    reward never drops by more than ``drop_max`` between the first and second half of the run. A
    configuration is stable when every one of at least ``min_seeds`` seeds that ran is stable; a run
    that did not run (never started, or stopped before it trained or was evaluated) is no evidence
    either way (`a3r.study.stability`).

    Attributes:
        last_k: Steps averaged at the end of a run (shown; judged only without a held-out evaluation).
        delta: Tolerated loss of reward below the baseline (reward units, 0..1 for 0/1 rewards).
        drop_max: Largest tolerated drop of mean reward from the first to the second half.
        entropy_min: Entropy floor in nats per token (collapse below).
        kl_max: KL ceiling (divergence above).
        min_seeds: Seeds per configuration before a claim.
    """

    model_config = ConfigDict(extra="forbid")

    last_k: int = Field(default=2, ge=1)
    delta: float = Field(default=0.05, ge=0)
    drop_max: float = Field(default=0.25, ge=0)
    entropy_min: float = Field(default=0.05, ge=0)
    kl_max: float = Field(default=1.0, gt=0)
    min_seeds: int = Field(default=2, ge=1)

    def describe(
        self,
        *,
        tasks: int | None = None,
        after: int | None = None,
        before: int | None = None,
        planned: bool = False,
    ) -> str:
        """The definition as one sentence, for the study's hypotheses, the plan and the report: what is
        compared, with its n when known (``tasks`` held-out tasks, ``after`` attempts of the evaluation
        after training, ``before`` of the untrained model's); ``planned``: the numbers a plan asks for,
        which the time budget may cut (``n = up to …``), not yet measured."""
        n = (
            f"n = {'up to ' if planned else ''}{counted(tasks, 'tasks')}"
            + (
                f": {after} attempts after, {before} before"
                if after is not None and before is not None
                else ""
            )
            if tasks is not None
            else "n = the held-out tasks and attempts both evaluations ran, stated with each verdict"
        )
        return (
            f"a run is stable iff it ends without crash or hang once training began, its held-out mean reward after "
            f"training is >= the untrained model's held-out mean reward on the same held-out tasks - {self.delta:g} "
            f"({n}; without a held-out evaluation: its train reward over its last {counted(self.last_k, 'steps')} "
            f">= its first {counted(self.last_k, 'steps')} - {self.delta:g}), its reward does not drop by more than "
            f"{self.drop_max:g} from the first to the second half, entropy (where reported) stays >= "
            f"{self.entropy_min:g} and KL <= {self.kl_max:g}; a configuration is stable iff all of >= "
            f"{self.min_seeds} seeds that ran are stable, and one none of whose runs ran is not run, never stable "
            "or unstable"
        )

    def window_warning(self, steps: int) -> str | None:
        """One line when a run of ``steps`` trainer steps is shorter than the ``last_k`` window, so the
        rule would judge fewer steps than it names (with 1 step: the rollouts sampled before any update,
        i.e. the untrained model); ``None`` when the run covers the window."""
        if steps >= self.last_k:
            return None
        return (
            f"warning: {steps} step(s) < the stability rule's window of the last {self.last_k} steps: "
            f"it will judge only the last {steps} step(s)"
            + (" (rollouts sampled before any update: the untrained model)" if steps <= 1 else "")
            + f"; use --steps >= {self.last_k} for the rule as pre-registered"
        )


Goal = Literal["min_stable", "best", "a_vs_b", "effect_of"]


class SweepSpec(BaseModel):
    """A staged study over one setting (`a3r.study.settings`): preflight → coarse → refine → replicate.

    Attributes:
        variable: The setting varied: a `a3r.study.settings.SETTINGS` name (``lr``, ``batch_size``,
            ``kl_coef``, ``max_tokens``...) or a knob of the template's workflow.
        coarse: Values of the coarse stage (for ``a_vs_b``/``effect_of``: the two arms, A first; for
            ``effect_of`` A is the reference value).
        refine: Whether a refine stage tests between the coarse values around the answer (the
            minimal stable value and the unstable one below it; the best value and its neighbours).
        goal: ``min_stable``: the smallest stable value; ``best``: the value with the highest held-out
            reward; ``a_vs_b``: whether B beats A; ``effect_of``: the effect of changing the setting
            from the reference value A to B.
        replicate: Whether a replicate stage adds seeds to the configurations the answer rests on,
            as many as the power rule asks (`a3r.study.design.seeds_per_arm`).
        effect_size: The smallest difference in reward units worth detecting (the power rule's δ);
            ``None``: `a3r.study.design.DEFAULT_EFFECT`.
        max_seeds: Cap on seeds per configuration (the power rule's budget cap).
    """

    model_config = ConfigDict(extra="forbid")

    variable: str = "batch_size"
    coarse: list[float] = Field(min_length=1, max_length=32)
    refine: bool = True
    goal: Goal = "min_stable"
    replicate: bool = True
    effect_size: float | None = Field(default=None, gt=0.0)
    max_seeds: int = Field(default=6, ge=2, le=16)


class PlanDraft(BaseModel):
    """A provider's plan for a request (structured output of the planner).

    Attributes:
        kind: ``train`` (``a3r vibe``) or ``research`` (``a3r research``: a question answered by a sweep).
        template: Registry template to start from, or ``None`` when new code must be written.
        params: Template parameters (validated against the template's `ParamSpec`).
        objective: One line: what is trained or asked.
        training: Settings of each training run.
        hypotheses: Registered in the store before any run.
        sweep: For research questions, the sweep.
        stability: For stability questions, the operational definition.
        rationale: Why this template and these settings.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["train", "research"]
    template: str | None
    params: dict[str, ParamValue] = Field(default_factory=dict)
    objective: str = Field(min_length=1)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    hypotheses: list[HypothesisDraft] = Field(default_factory=list)
    sweep: SweepSpec | None = None
    stability: StabilityCriterion | None = None
    rationale: str = ""

    @field_validator("template")
    @classmethod
    def _canonical_template(cls, value: str | None) -> str | None:
        return None if value is None else value.strip().lower().replace("-", "_").replace(" ", "_")


class GeneratedCode(BaseModel):
    """New task code written by an LLM when no template covers a request.

    Attributes:
        workflow: ``workflow.py`` source (``async def run(task, llm)`` with a ``# <params>`` block).
        reward: ``reward.py`` source with ``reward(...)`` and ``self_check(tasks) -> list[str]``.
        tasks: Training tasks, each a dict with a unique ``id``.
    """

    model_config = ConfigDict(extra="forbid")

    workflow: str = Field(min_length=1)
    reward: str = Field(min_length=1)
    tasks: list[dict[str, Any]] = Field(min_length=1)


class PatchDraft(BaseModel):
    """A proposed change of one workspace file (the whole new content; the diff is computed).

    Attributes:
        file: Path relative to the workspace (must be on the patch allow-list).
        new_content: The complete patched file.
        rationale: Why, citing the evidence.
    """

    model_config = ConfigDict(extra="forbid")

    file: str = Field(min_length=1)
    new_content: str
    rationale: str = Field(min_length=1)


def check_plan(draft: PlanDraft) -> PlanDraft:
    """Validate a plan against the template registry and resolve its parameters.

    Args:
        draft: A provider's plan.

    Returns:
        The plan with ``params`` completed by the template's defaults and converted to their types.

    Raises:
        PlanError: Unknown template, invalid parameters, a research plan without a sweep, a sweep over
            a setting the engine cannot change or with values out of its range, an A-vs-B question
            without two values, or a sweep with fewer seeds than the stability criterion demands.
    """
    params = dict(draft.params)
    if draft.template is not None:
        try:
            template = templates.get_template(draft.template)
            params = dict(template.resolve(params))
        except templates.TemplateError as exc:
            raise PlanError(str(exc)) from None
    if draft.kind == "research":
        if draft.sweep is None:
            raise PlanError("a research plan needs a sweep (variable and coarse values)")
        setting = resolve_setting(draft.sweep.variable, draft.template)
        for value in draft.sweep.coarse:
            setting.check(value)
        if setting.kind == "bool" and draft.sweep.goal in ("min_stable", "best"):
            raise PlanError(switch_refusal(setting, draft.sweep.goal))
        if draft.sweep.goal in ("a_vs_b", "effect_of") and len(set(draft.sweep.coarse)) != 2:
            kind = "an A-vs-B" if draft.sweep.goal == "a_vs_b" else "an effect-of"
            given = ", ".join(setting.text(v) for v in draft.sweep.coarse)
            raise PlanError(
                f"{kind} question compares two different values of {setting.label}; the plan has {given}"
            )
        if draft.sweep.goal == "best" and len(set(draft.sweep.coarse)) < 2:
            given = ", ".join(f"{v:g}" for v in draft.sweep.coarse)
            raise PlanError(
                f"a best-value question needs at least two different values of {setting.label} to choose "
                f"from; the plan has {given}"
            )
        if draft.stability is not None and len(draft.training.seeds) < draft.stability.min_seeds:
            raise PlanError(
                f"the stability criterion needs >= {draft.stability.min_seeds} seeds per configuration, "
                f"the plan has {len(draft.training.seeds)}"
            )
    _check_degenerate(draft, params)
    _check_teacher(draft)
    return draft.model_copy(update={"params": params})


def _check_teacher(draft: PlanDraft) -> None:
    """Refuse distillation without a teacher: a plan that distils, or a study that compares
    distillation (a sweep over ``distill``), needs ``training.teacher``.

    Raises:
        PlanError: One line saying how to name one.
    """
    compares = draft.sweep is not None and draft.sweep.variable == "distill"
    if draft.training.teacher is None and (draft.training.distill or compares):
        raise PlanError(
            "distillation needs a teacher: name its server's URL (http://host:port) or a checkpoint "
            "directory in the request, or write teacher=URL"
        )


MIN_TEMPERATURE = 0.1
"""Smallest sampling temperature a research plan may run at or sweep over. At temperature T a token whose
logit trails the top one by 1 nat is drawn with odds e^(−1/T) against it: 4.5·10⁻⁵ at T = 0.1, ~10⁻⁹ at
0.05, 0 in float32 at 1e-9. Below 0.1 the G completions of a group can differ only where the top logits
are within a small fraction of a nat, so, as at T = 0 (greedy), they are all but always identical."""


def temperature_warning(draft: PlanDraft) -> str | None:
    """One line when a training plan samples below `MIN_TEMPERATURE` (``"train arithmetic temperature=0"``):
    allowed, unlike in a research plan (`_check_degenerate`), since its zero-signal groups are what the
    analyst diagnoses and patches; ``None`` otherwise."""
    temperature = draft.params.get("temperature")
    if draft.kind != "train" or not isinstance(temperature, int | float) or temperature >= MIN_TEMPERATURE:
        return None
    return (
        f"warning: a sampling temperature of {temperature:g} (< {MIN_TEMPERATURE:g}) samples (all but always) the "
        "same completion for every episode of a GRPO group: equal rewards, zero advantage, no gradient; the "
        f"analyst will diagnose zero signal and propose a higher temperature (use >= {MIN_TEMPERATURE:g}, e.g. 1.0, "
        "to train)"
    )


def steps_warning(draft: PlanDraft) -> str | None:
    """One line when a training plan's steps are fewer than its train-reward verdict needs (a trend over
    at least `a3r.study.effects.MIN_STEPS` steps): the verdict would be "not estimated"; ``None``
    otherwise."""
    steps = draft.training.steps
    if draft.kind != "train" or steps >= MIN_STEPS:
        return None
    return (
        f"warning: {counted(steps, 'steps')} < the {MIN_STEPS} steps the train-reward verdict needs (a trend over "
        f"steps): it would not be estimated; use --steps >= {MIN_STEPS} to judge the training"
    )


def _check_degenerate(draft: PlanDraft, params: dict[str, Any]) -> None:
    """Refuse configurations GRPO cannot train (one line each).

    * A research plan at, or sweeping over, a temperature below `MIN_TEMPERATURE` (0 included): it
      samples the same completion for all G episodes of a group (at 0 always, below 0.1 all but
      always), so their rewards are equal, every advantage is 0 (Shao et al. 2024, eq. 3) and no step
      has a gradient. A training plan at 0 is not refused: its zero-signal groups are what the analyst
      diagnoses, proposing to raise the temperature.
    * ``minibatches`` must divide B·G, the episodes of a step, so that every optimizer update sees as
      many episodes (the trainer would otherwise split the batch unevenly).

    Raises:
        PlanError: either, naming the values allowed.
    """
    fixed = params.get("temperature")
    # a training plan at 0 stays allowed: its zero-signal groups are what the analyst diagnoses and patches
    research = draft.kind == "research" and isinstance(fixed, int | float)
    temperatures = [float(fixed)] if research and isinstance(fixed, int | float) else []
    configs = [draft.training]
    if draft.sweep is not None:
        setting = resolve_setting(draft.sweep.variable, draft.template)
        if setting.name == "temperature":
            temperatures = list(draft.sweep.coarse)
        elif setting.target == "training":
            configs = [
                draft.training.model_copy(update={setting.name: setting.cast(v)}) for v in draft.sweep.coarse
            ]
    low = [t for t in temperatures if t < MIN_TEMPERATURE]
    if low and min(low) <= 0:
        raise PlanError(
            "a sampling temperature of 0 samples the same completion for every episode of a GRPO group: equal "
            f"rewards, zero advantage, nothing to train on; use temperatures >= {MIN_TEMPERATURE:g} (e.g. 0.6, 1.0)"
        )
    if low:
        raise PlanError(
            f"a sampling temperature of {min(low):g} is below {MIN_TEMPERATURE:g}, where a token 1 nat behind the top "
            f"one is drawn with odds e^(−1/T) < 5e-5: every episode of a GRPO group samples (all but always) the same "
            f"completion, as at 0: equal rewards, zero advantage, nothing to train on; use temperatures >= "
            f"{MIN_TEMPERATURE:g} (e.g. 0.6, 1.0)"
        )
    for config in configs:
        rows = config.batch_size * config.group_size
        if rows % config.minibatches:
            allowed = [d for d in range(1, min(rows, 64) + 1) if rows % d == 0]
            raise PlanError(
                f"{config.minibatches} minibatches do not divide the B·G = {config.batch_size}·{config.group_size} "
                f"= {rows} episodes of a step (B={config.batch_size}, G={config.group_size}): use one of "
                f"{', '.join(map(str, allowed))}"
            )


def training_line(plan: PlanDraft) -> str:
    """The plan's training settings, the varied one (a study's sweep) as its values: ``lr ∈ {0.0001,
    0.001} (varied)``, not the fixed value no run uses."""
    t = plan.training
    shown = {
        "steps": counted(t.steps, "steps"),
        "batch_size": f"batch size B={t.batch_size} groups",
        "group_size": f"group size G={t.group_size}",
        "lr": f"lr={t.lr:g}",
    }
    if plan.sweep is not None and plan.sweep.variable in shown:
        label = {"steps": "steps", "batch_size": "B", "group_size": "G", "lr": "lr"}[plan.sweep.variable]
        values = ", ".join(f"{v:g}" for v in plan.sweep.coarse)
        shown[plan.sweep.variable] = f"{label} ∈ {{{values}}} (varied)"
    line = ", ".join(shown.values()) + f", seeds {t.seeds}"
    if t.teacher is not None:
        varied = plan.sweep is not None and plan.sweep.variable == "distill"
        how = (
            "distillation on/off (varied)"
            if varied
            else f"{t.distill_mode} distillation"
            + (f", coef {t.distill_coef:g}" if t.distill_mode == "mixed" else "")
            if t.distill
            else "not distilled"
        )
        line += f", teacher {teacher_text(t.teacher)} ({how})"
    return line
