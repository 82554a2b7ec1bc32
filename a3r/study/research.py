"""Research scheduling: the staged sweep and budget fitting. Pure functions over plans and run
outcomes (no I/O). The verdicts (stability per run and per configuration, held-out comparisons, the
minimal stable value) are `a3r.study.stability`'s, named here too for the callers that import them
from this module.

Stages: ``preflight`` (held-out evaluation of the untrained model) → ``coarse`` (the plan's values,
powers of two for sizes, every value on every seed) → ``refine`` (for a minimal-stable question: the
integer midpoint between the smallest stable value and the unstable value below it) → ``done``.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict

from a3r.study.effects import MIN_STEPS
from a3r.study.plans import PlanDraft, StabilityCriterion, TrainingSettings
from a3r.study.price import (
    SEQUENTIAL,
    SERVER_OVERHEAD_S,
    UPDATE_SHARE,
    Serving,
    TenantMeasure,
    estimate_run_s,
    stage_s,
    step_s,
)
from a3r.study.runs import RunOutcome, RunSpec
from a3r.study.settings import resolve_setting
from a3r.study.stability import (
    ConfigVerdict,
    Verdict,
    compared_evals,
    compared_tasks_text,
    judge_run,
    min_stable_value,
    non_monotone,
    not_run_reason,
    refine_values,
    stability_margin,
    verdicts,
)
from a3r.study.wording import counted

__all__ = [
    "EVAL_BUDGET_SHARE",
    "HELDOUT_BUDGET_SHARE",
    "MAX_EVAL_TASKS",
    "MIN_HELDOUT_TASKS",
    "REPLAN_SLACK",
    "SAFETY_SHARE",
    "SERVER_OVERHEAD_S",
    "UPDATE_SHARE",
    "WRAP_UP_S",
    "ConfigVerdict",
    "HeldoutSizing",
    "Replan",
    "Sizing",
    "Verdict",
    "budget_note",
    "compared_evals",
    "compared_tasks_text",
    "estimate_run_s",
    "eval_reserve_s",
    "fit_budget",
    "initial_queue",
    "judge_run",
    "measured_run_s",
    "measured_tenants",
    "min_stable_value",
    "non_monotone",
    "recheck_steps",
    "refine_values",
    "replan_training",
    "size_heldout",
    "size_training",
    "spent_s",
    "stability_margin",
    "sweep_specs",
    "token_cap",
    "verdicts",
]

MAX_EVAL_TASKS = 256
"""Most held-out tasks an evaluation may ask for (``--eval-tasks``). The preflight attempts each task 4
times and calibrates its sequential futility test over every look (`a3r.study.sequential`), at a cost
that grows about quadratically with the attempts: 2.5 s for 256 tasks (1,024 attempts), 12 s for 1,000,
and more than 100 s for 10,000 on this 2-core CPU; and 256 tasks × 4 attempts already exceed the
preflight's own 285 s budget on any model this project runs."""

EVAL_BUDGET_SHARE = 0.15
"""Share of a run's remaining wall-time budget a held-out evaluation may use (it is sized to fit), and
the reserve for it before any evaluation was measured."""

EVAL_RESERVE_MARGIN = 1.25
"""The reserve for a held-out evaluation: this many times the longest one measured, plus 15 s."""


def eval_reserve_s(spec: RunSpec, outcomes: Sequence[RunOutcome], *, budget_s: float) -> float:
    """Seconds of a training run's budget kept for its held-out evaluation: `EVAL_RESERVE_MARGIN` × the
    longest evaluation measured so far + 15 s, or `EVAL_BUDGET_SHARE` of the budget before any was
    measured; never more than half the budget. Smoke and preflight runs reserve nothing (their
    evaluation is sized to what is left).

    Args:
        spec: The run about to start.
        outcomes: Runs so far (their ``eval_s``).
        budget_s: The run's budget in seconds.
    """
    if spec.purpose not in ("train", "sweep") or budget_s <= 0:
        return 0.0
    measured = [o.eval_s for o in outcomes if math.isfinite(o.eval_s)]
    reserve = EVAL_RESERVE_MARGIN * max(measured) + 15.0 if measured else EVAL_BUDGET_SHARE * budget_s
    return min(reserve, budget_s / 2)


WRAP_UP_S = 15.0
"""Seconds of a thread's budget kept for what follows its last run: checkpointing and stopping the
servers still running and writing the report. A fresh user's 8-minute vibe job ended 14 s past its
budget (2026-12-02) when only the runs' own wall time was counted; the rest of the thread's time is now
counted too (`RunOutcome.overhead_s`), and this reserve keeps the runs short of the end. The report
states the thread's time against its budget, an overrun included (`budget_note`)."""


def spent_s(outcomes: Sequence[RunOutcome]) -> float:
    """Wall seconds of the thread's budget its runs have used: each run's wall time plus the thread's
    time around it (`RunOutcome.overhead_s`: planning, code check, analysis, stopping its server); the
    runs of a stage trained side by side as tenants count their stage's time once (`RunOutcome.shared_s`)."""
    return sum(o.wall_s + o.overhead_s - o.shared_s for o in outcomes)


def measured_run_s(outcomes: Sequence[RunOutcome]) -> tuple[float, int] | None:
    """The measured wall seconds of one sweep run, all of it counted against the budget: the median over
    the sweep runs that ran (`not_run_reason` ``None``) of their wall time (server and client start,
    training, held-out evaluation) plus the thread's time around them (`RunOutcome.overhead_s`), with
    the number of runs it is the median of; ``None`` before any sweep run ran.

    The budget re-plan prices every queued run at no less than this (`fit_budget`'s ``min_run_s``), and a
    conclusion names the budget that would have run what did not from it. On the H200 (2026-12-05) each
    run cost 80-87 s while its 16 episodes at the measured 0.3 s each priced it at ≈ 10 s, so a run was
    started with 66 s left and cancelled at step 0.
    """
    ran = sorted(
        o.wall_s + o.overhead_s
        for o in outcomes
        if o.purpose == "sweep" and o.wall_s > 0 and o.tenant_server is None and not_run_reason(o) is None
    )
    if not ran:
        return None
    return statistics.median(ran), len(ran)


def measured_tenants(outcomes: Sequence[RunOutcome]) -> TenantMeasure | None:
    """What the study's sweep stages run as tenants of one server measured (`RunOutcome.tenant_stage`),
    for the price of the next one (`a3r.study.price.tenant_stage_s`): the server start (median over the
    stages), the stage's aggregate seconds per episode (the waves over the sum of its tenants' own
    episode rates, ``1 / RunOutcome.seconds_per_episode``, each measured by its client while the others
    ran beside it: ≈ one run's speed where they share the CPU cores, a fraction of it where the engine
    batches them; median over the stages), and the median wall of a tenant run that ran (its fixed costs
    included: client start, held-out evaluation). ``None`` before any tenant stage ended.

    A tenant's own wall time overlaps the others' and leaves out the shared start, so these runs are not
    in `measured_run_s` (the price of a run on its own server)."""
    stages: dict[tuple[str, float, float], list[RunOutcome]] = defaultdict(list)
    for o in outcomes:
        if o.purpose == "sweep" and o.tenant_stage is not None:
            stages[(o.stage, o.tenant_stage.wall_s, o.tenant_stage.start_s)].append(o)
    if not stages:
        return None
    starts, speeds = [], []
    for (_, _, start), runs in stages.items():
        starts.append(start)
        # the episodes per second the engine gave the tenants together: the sum of their own rates, per wave
        rates = sum(1 / o.seconds_per_episode for o in runs if 0 < o.seconds_per_episode < math.inf)
        waves = max(o.tenant_stage.waves for o in runs if o.tenant_stage is not None)
        if rates > 0:
            speeds.append(waves / rates)
    ran = [o.wall_s for runs in stages.values() for o in runs if not_run_reason(o) is None]
    return TenantMeasure(
        start_s=statistics.median(starts),
        seconds_per_episode=statistics.median(speeds) if speeds else math.nan,
        run_s=statistics.median(ran) if ran else 0.0,
        stages=len(stages),
    )


def budget_note(outcomes: Sequence[RunOutcome], *, wrap_up_s: float, budget_s: float) -> str:
    """One line for the report: the thread's wall time against its budget, with where it went, and an
    overrun said as such.

    Args:
        outcomes: The thread's runs.
        wrap_up_s: Seconds since the last run (stopping servers; the report itself is not counted).

    The runs' ``overhead_s`` includes the command's start-up (importing a3r) before the first run.
        budget_s: The thread's budget.
    """
    runs = sum(o.wall_s - o.shared_s for o in outcomes)
    around = sum(o.overhead_s for o in outcomes)
    total = runs + around + wrap_up_s
    parts = (
        f"runs {runs:,.0f} s, the command's start-up, planning, code check, analysis and server stops around "
        f"them {around:,.0f} s, "
        f"server stops before the report {wrap_up_s:,.0f} s"
    )
    text = f"time: {total:,.0f} s of the {budget_s:,.0f} s budget ({parts})"
    if total > budget_s:
        text += f": over the budget by {total - budget_s:,.0f} s"
    return text


SAFETY_SHARE = 0.10
"""Share of a vibe thread's whole budget the sizing leaves unplanned: the speed measured in the smoke run
is an estimate (on 2 idle cores who-is-the-spy steps took 130–180 s against ≈ 133 s estimated)."""

HELDOUT_BUDGET_SHARE = 0.10
"""Share of a vibe thread's budget one held-out evaluation may take, at the smoke run's measured seconds
per episode (there are two: before and after training, on the same tasks)."""

MIN_HELDOUT_TASKS = 4
"""Fewest held-out tasks a vibe evaluation shrinks to (× ``eval_samples`` attempts) to make room for
training: below that its mean's standard error is too wide to compare before and after."""


def _heldout_cost_s(tasks: int, samples: int, seconds_per_episode: float) -> float:
    """Seconds of the two held-out evaluations of a vibe thread: the one before training at the measured
    seconds per episode, and the reserve the one after keeps (`eval_reserve_s`: 1.25 × + 15 s)."""
    once = tasks * samples * seconds_per_episode
    return once + EVAL_RESERVE_MARGIN * once + 15.0


class HeldoutSizing(BaseModel):
    """How many held-out tasks a vibe thread evaluates (before and after training, the same tasks).

    Attributes:
        tasks: Held-out tasks per evaluation.
        seconds: Estimated wall seconds of one evaluation.
        note: One line saying what was measured and decided.
    """

    model_config = ConfigDict(frozen=True)

    tasks: int
    seconds: float
    note: str


def size_heldout(
    settings: TrainingSettings,
    *,
    seconds_per_episode: float,
    budget_s: float,
    time_left_s: float,
    samples: int,
    max_tasks: int,
) -> HeldoutSizing:
    """Size a vibe thread's held-out evaluation from the smoke run's measured speed, before its first
    (baseline) evaluation: as many tasks as `HELDOUT_BUDGET_SHARE` of the budget pays for (at most
    ``max_tasks``), fewer, down to `MIN_HELDOUT_TASKS`, while the two evaluations would leave no room for
    the planned steps at the smallest game (B = 1, `size_training`) within the `SAFETY_SHARE` margin.

    Args:
        settings: The plan's training settings (steps, G).
        seconds_per_episode: Client wall seconds per finished episode in the smoke run.
        budget_s: The thread's budget in seconds (the shares and the margin are of it).
        time_left_s: Seconds of the budget left now (before the baseline evaluation).
        samples: Attempts per held-out task.
        max_tasks: Held-out tasks asked for (``--eval-tasks``) and available.
    """
    if not math.isfinite(seconds_per_episode) or seconds_per_episode <= 0:
        return HeldoutSizing(
            tasks=max_tasks,
            seconds=math.nan,
            note=f"held-out evaluation: no speed measured in the smoke run; {max_tasks} tasks × {samples} attempts",
        )
    per_task = samples * seconds_per_episode
    tasks = min(max_tasks, max(MIN_HELDOUT_TASKS, math.floor(HELDOUT_BUDGET_SHARE * budget_s / per_task)))
    smallest_step = step_s(1, settings.group_size, seconds_per_episode, update_share=UPDATE_SHARE)
    room = time_left_s - SAFETY_SHARE * budget_s - SERVER_OVERHEAD_S - settings.steps * smallest_step
    shrunk = tasks
    while tasks > MIN_HELDOUT_TASKS and _heldout_cost_s(tasks, samples, seconds_per_episode) > room:
        tasks -= 1
    why = (
        f"{HELDOUT_BUDGET_SHARE:.0%} of the {budget_s:,.0f} s budget"
        if tasks == shrunk
        else f"shrunk from {shrunk} so that {settings.steps} steps at B = 1 still fit"
    )
    return HeldoutSizing(
        tasks=tasks,
        seconds=tasks * per_task,
        note=(
            f"held-out evaluation: {tasks} tasks × {samples} attempts before and after training, ≈ "
            f"{tasks * per_task:,.0f} s each at the smoke run's {seconds_per_episode:.1f} s per episode ({why})"
        ),
    )


class Sizing(BaseModel):
    """How a training run fits its budget, from the smoke run's measured speed: the game (B groups per
    step, G kept) first, the steps only when even B = 1 does not fit.

    Attributes:
        steps: Steps to run (the plan's, or fewer when even B = 1 does not fit; at least 1).
        planned: The plan's steps.
        batch_size: B to train with (the plan's, or smaller so that the planned steps fit).
        planned_batch_size: The plan's B.
        seconds_per_step: Estimated wall seconds per step at ``batch_size``: B·G episodes at the measured
            seconds per episode, plus `UPDATE_SHARE` of that for the update.
        available_s: Seconds for each run's training: (budget − safety margin) / runs − evaluation
            reserve − `SERVER_OVERHEAD_S`.
        note: One line saying what was measured and decided, and why.
    """

    model_config = ConfigDict(frozen=True)

    steps: int
    planned: int
    batch_size: int
    planned_batch_size: int
    seconds_per_step: float
    available_s: float
    note: str


def size_training(
    settings: TrainingSettings,
    *,
    seconds_per_episode: float,
    budget_s: float,
    reserve_s: float,
    margin_s: float = 0.0,
    runs: int = 1,
) -> Sizing:
    """Fit a training run to its budget from the measured seconds per episode.

    The steps asked for are kept if any game fits them: B goes down from the plan's to 1 (G is kept: it
    is the GRPO group the advantage is computed over) until ``steps`` × the seconds per step
    (`a3r.study.price.step_s`, with `UPDATE_SHARE`) fit in ``budget_s − reserve_s − margin_s −
    SERVER_OVERHEAD_S``; only when even B = 1 does not fit are steps dropped (as many as fit at B = 1,
    at least 1), and the note says so, and says when they are fewer than the train-reward verdict's
    minimum (`a3r.study.effects.MIN_STEPS`) before training starts. The run re-plans after every step
    from its measured step time (`replan_training`).

    Args:
        settings: The plan's training settings (steps, B, G).
        seconds_per_episode: Client wall seconds per finished episode in the smoke run.
        budget_s: Seconds left for the run, its evaluation included.
        reserve_s: Seconds kept for the held-out evaluation (`eval_reserve_s`).
        margin_s: Seconds left unplanned (`SAFETY_SHARE` of the thread's budget).
        runs: Training runs (one per seed) that share ``budget_s − margin_s``, each with its own
            evaluation reserve and server overhead; the sizing is per run.
    """
    planned, planned_b = settings.steps, settings.batch_size
    runs = max(1, runs)
    available = (budget_s - margin_s) / runs - reserve_s - SERVER_OVERHEAD_S
    if not math.isfinite(seconds_per_episode) or seconds_per_episode <= 0:
        note = f"budget: no speed measured in the smoke run; training keeps its {planned} steps at B = {planned_b}"
        return Sizing(
            steps=planned,
            planned=planned,
            batch_size=planned_b,
            planned_batch_size=planned_b,
            seconds_per_step=math.nan,
            available_s=available,
            note=note,
        )

    def per_step(b: int) -> float:
        return step_s(b, settings.group_size, seconds_per_episode, update_share=UPDATE_SHARE)

    batch = next((b for b in range(planned_b, 0, -1) if planned * per_step(b) <= available), None)
    steps = planned
    if batch is None:
        batch = 1
        steps = max(1, math.floor(available / per_step(1))) if available > 0 else 1
    sizing = Sizing(
        steps=steps,
        planned=planned,
        batch_size=batch,
        planned_batch_size=planned_b,
        seconds_per_step=per_step(batch),
        available_s=available,
        note="",
    )
    note = _sizing_note(
        sizing,
        settings,
        seconds_per_episode=seconds_per_episode,
        budget_s=budget_s,
        reserve_s=reserve_s,
        margin_s=margin_s,
        runs=runs,
        per_step=per_step,
    )
    return sizing.model_copy(update={"note": note})


def _sizing_note(
    sizing: Sizing,
    settings: TrainingSettings,
    *,
    seconds_per_episode: float,
    budget_s: float,
    reserve_s: float,
    margin_s: float,
    runs: int,
    per_step: Callable[[int], float],
) -> str:
    """The line saying what `size_training` measured and decided, and why."""
    steps, planned, batch, planned_b = (
        sizing.steps,
        sizing.planned,
        sizing.batch_size,
        sizing.planned_batch_size,
    )
    cost = steps * per_step(batch)
    of_budget = (
        f"{budget_s:,.0f} s of budget − {margin_s:,.0f} s safety margin"
        if runs == 1
        else f"({budget_s:,.0f} s of budget − {margin_s:,.0f} s safety margin) / {runs} seeds"
    )
    left = (
        f"{sizing.available_s:,.0f} s left for training ({of_budget} − {reserve_s:,.0f} s kept for the held-out "
        f"evaluation − {SERVER_OVERHEAD_S:.0f} s server overhead)"
    )
    measured = (
        f"the smoke run measured {seconds_per_episode:.1f} s per episode → ≈ {per_step(batch):.0f} s per step "
        f"(B·G = {batch * settings.group_size} episodes + {UPDATE_SHARE:.0%} update)"
    )
    if sizing.available_s < per_step(1):  # said once, plainly: no step fits in what is left
        kept = budget_s - sizing.available_s * runs if runs > 1 else budget_s - sizing.available_s
        return (
            f"budget: the smoke run used the time training needed: the {budget_s:,.0f} s of budget left "
            f"{'cover' if sizing.available_s > 0 else 'do not cover'} the {kept:,.0f} s kept for the safety "
            f"margin ({margin_s:,.0f} s), the held-out evaluation ({reserve_s:,.0f} s) and the server start "
            f"({SERVER_OVERHEAD_S:.0f} s){' but leave less than one step' if sizing.available_s > 0 else ''}; "
            f"{measured}, so not one of the {planned} steps fits: training starts anyway and the budget "
            "will likely stop it before its first step (a larger --budget-minutes lets it train)"
        )
    if steps < planned:
        note = (
            f"budget: {planned} steps do not fit even at B = 1: {measured}; {planned} steps would need ≈ "
            f"{planned * per_step(1):,.0f} s but {left}, so training runs {steps} of the {planned} steps "
            f"(≈ {cost:,.0f} s)" + (f", B {planned_b} → 1" if planned_b > 1 else "")
        )
        if steps < MIN_STEPS <= planned:
            note += (
                f"; warning: {counted(steps, 'steps')} {'is' if steps == 1 else 'are'} fewer than the "
                f"{MIN_STEPS} the train-reward verdict "
                f"needs: the budget cannot hold {MIN_STEPS} at this speed, so that verdict is not estimated "
                "unless the re-plan after each step finds the time"
            )
        return note
    if batch < planned_b:
        return (
            f"budget: B {planned_b} → {batch} so the {planned} steps fit: {measured}; {planned} × "
            f"{per_step(batch):.0f} s ≈ {cost:,.0f} s ≤ {left}; at B = {planned_b} they would need ≈ "
            f"{planned * per_step(planned_b):,.0f} s"
        )
    return f"budget: {measured}: the {planned} steps fit at B = {batch}: ≈ {cost:,.0f} s ≤ {left}"


REPLAN_SLACK = 0.9
"""Share of the time left a re-plan may fill when it raises B (`replan_training`): a little room, so
that one slower step does not make the next re-plan take B down again."""


class Replan(BaseModel):
    """A training run's plan after a measured step (`replan_training`).

    Attributes:
        target: The step to train to.
        batch_size: B for the steps left.
        note: One line when the plan changed (``None``: unchanged).
    """

    model_config = ConfigDict(frozen=True)

    target: int
    batch_size: int
    note: str | None = None


def replan_training(
    *,
    step: int,
    target: int,
    batch_size: int,
    asked_target: int,
    asked_batch_size: int,
    seconds_per_step: float,
    time_left_s: float,
) -> Replan:
    """Re-plan a training run after a measured step, up as well as down: all the steps asked for
    (``asked_target``) at the largest B up to the one asked for whose steps fit the time left (B up only
    within `REPLAN_SLACK` of it); when even B = 1 does not fit them, as many steps as fit at B = 1 (at
    least one more: the budget's own stop ends a run that cannot take it), never more than planned when
    not one step fits (a run that reached its target ends there). A step's seconds are taken to scale
    with B (B·G episodes).

    Args:
        step: The server's step now.
        target: The step the run trains to now.
        batch_size: B now.
        asked_target: The step the run was asked to reach (before any sizing).
        asked_batch_size: The B asked for (before any sizing).
        seconds_per_step: Measured wall seconds per step at ``batch_size``.
        time_left_s: Seconds left for the steps (before the held-out evaluation's reserve).
    """
    left = asked_target - step
    unchanged = Replan(target=target, batch_size=batch_size)
    if left <= 0 or not math.isfinite(seconds_per_step) or seconds_per_step <= 0:
        return unchanged
    per_b = seconds_per_step / max(1, batch_size)

    def fits(b: int) -> bool:
        return left * per_b * b <= time_left_s * (REPLAN_SLACK if b > batch_size else 1.0)

    new_b = next((b for b in range(max(asked_batch_size, 1), 0, -1) if fits(b)), None)
    new_target = asked_target
    if new_b is None:
        new_b = 1
        fit = math.floor(max(0.0, time_left_s) / per_b)
        # at least one more step, but never a raise with no time for one: the budget's stop ends the run
        new_target = min(step + fit, asked_target) if fit else min(step + 1, target)
    if (new_target, new_b) == (target, batch_size):
        return unchanged
    parts = []
    if new_target != target:
        parts.append(
            f"steps {target} → {new_target}" + (" (all asked for)" if new_target == asked_target else "")
        )
    if new_b != batch_size:
        parts.append(f"B {batch_size} → {new_b}")
    note = (
        f"re-plan after step {step}: measured {seconds_per_step:.0f} s per step at B = {batch_size}, "
        f"{max(0.0, time_left_s):,.0f} s left before the held-out evaluation's reserve: {', '.join(parts)}"
    )
    return Replan(target=new_target, batch_size=new_b, note=note)


def recheck_steps(*, step: int, target: int, seconds_per_step: float, time_left_s: float) -> str | None:
    """Re-check a training run against its budget once steps were measured: ``None`` when the steps
    left fit in the time left before the evaluation's reserve, else one line saying at which step the
    budget will stop training (the monitor stops it there and the evaluation still runs).

    Args:
        step: The server's step now.
        target: The step the run should reach.
        seconds_per_step: Measured wall seconds per step of this run so far (its steps only).
        time_left_s: Seconds left before the held-out evaluation's reserve.
    """
    left = target - step
    if left <= 0 or not math.isfinite(seconds_per_step) or seconds_per_step <= 0:
        return None
    if left * seconds_per_step <= time_left_s:
        return None
    reach = step + max(0, math.floor(time_left_s / seconds_per_step))
    return (
        f"re-check after step {step}: measured {seconds_per_step:.0f} s per step, so the {counted(left, 'steps')} left {'needs' if left == 1 else 'need'} "
        f"≈ {left * seconds_per_step:,.0f} s but {max(0.0, time_left_s):,.0f} s are left before the held-out "
        f"evaluation's reserve: the budget will stop training at about step {reach} of {target} at this pace "
        f"(an estimate: the pace so far includes the first step's trainer start, so faster later steps may "
        f"reach further; training stops only when the time is up)"
    )


def initial_queue(plan: PlanDraft) -> list[RunSpec]:
    """First runs of a plan: research → the preflight; train → a smoke run, then training per seed."""
    stability = plan.stability or StabilityCriterion()
    if plan.kind == "research":
        return [RunSpec(key="preflight", purpose="preflight", settings=plan.training, stability=stability)]
    queue: list[RunSpec] = []
    for index, seed in enumerate(plan.training.seeds):
        # a seed's smoke run and training run share its server (the smoke run keeps it running)
        run = functools.partial(
            RunSpec, seed=seed, settings=plan.training, server_key=f"main-s{seed}", stability=stability
        )
        if index == 0 and plan.training.smoke_tasks > 0:
            queue.append(run(key="smoke", purpose="smoke", keep_server=True))
        queue.append(run(key=f"train-s{seed}", purpose="train", early_stop=True))
    return queue


def _value_text(value: float) -> str:
    return f"{value:g}"


def sweep_specs(
    plan: PlanDraft, values: Sequence[float], stage: str, *, seeds: Sequence[int] | None = None
) -> list[RunSpec]:
    """Runs of a sweep stage: every value on every seed (the plan's seeds unless ``seeds`` is given),
    seeds interleaved by ascending value. A training setting changes the runs' `TrainingSettings`; a
    template knob sets `RunSpec.params` (`a3r.study.settings.resolve_setting`)."""
    assert plan.sweep is not None
    variable = plan.sweep.variable
    setting = resolve_setting(variable, plan.template)
    specs: list[RunSpec] = []
    for value in sorted(values):
        cast_value = setting.cast(value)
        params: dict[str, bool | int | float | str | None] = {}
        if setting.target == "training":
            settings = plan.training.model_copy(update={variable: cast_value, "smoke_tasks": 0})
        else:
            settings = plan.training.model_copy(update={"smoke_tasks": 0})
            params = {variable: cast_value}
        for seed in plan.training.seeds if seeds is None else seeds:
            specs.append(
                RunSpec(
                    # a switch's runs are named by true/false; numbers keep the keys they always had
                    key=f"{stage}-{variable}={setting.text(value) if setting.kind == 'bool' else _value_text(value)}-s{seed}",
                    purpose="sweep",
                    seed=seed,
                    settings=settings,
                    stage=stage,
                    value=float(value),
                    stability=plan.stability or StabilityCriterion(),
                    params=params,
                )
            )
    return specs


def token_cap(plan: PlanDraft) -> float | None:
    """The response-token cap (the template knob ``max_tokens``) of the plan's own workflow, at which a
    preflight measures the seconds per episode; ``None`` when the template has no such knob."""
    cap = plan.params.get("max_tokens")
    return float(cap) if isinstance(cap, int | float) and not isinstance(cap, bool) and cap > 0 else None


def fit_budget(
    specs: Sequence[RunSpec],
    *,
    budget_s: float,
    seconds_per_episode: float,
    eval_episodes: int,
    goal: str,
    measured_tokens: float | None = None,
    min_run_s: float = 0.0,
    serving: Serving = SEQUENTIAL,
    measured: TenantMeasure | None = None,
) -> tuple[list[RunSpec], list[float]]:
    """Keep whole configurations (all seeds of a value) that fit the budget, each run priced by
    `estimate_run_s` (``measured_tokens``: see there) and at no less than ``min_run_s`` (the measured
    wall seconds of a whole run, its start and held-out evaluation included: `measured_run_s`); with
    tenants (``serving``), the kept runs as one stage by `a3r.study.price.stage_s` (one server start, the
    slowest run of each wave; ``measured``: `measured_tenants`), so a configuration costs what it adds
    to the stage.

    For ``min_stable`` the smallest values are kept first (the question is about them); for ``best``
    the values in plan order. A configuration is never cut to fewer seeds.

    Returns:
        ``(kept specs, dropped values)``.
    """
    by_value: dict[float, list[RunSpec]] = defaultdict(list)
    for spec in specs:
        by_value[spec.value if spec.value is not None else math.nan].append(spec)
    order = sorted(by_value) if goal == "min_stable" else list(by_value)
    kept: list[RunSpec] = []
    dropped: list[float] = []
    spent = 0.0
    for value in order:
        if serving.tenants:
            trial = [s for s in specs if s in kept or s in by_value[value]]  # the queue's order
            price = stage_s(
                trial,
                seconds_per_episode=seconds_per_episode,
                eval_episodes=eval_episodes,
                measured_tokens=measured_tokens,
                min_run_s=min_run_s,
                serving=serving,
                measured=measured,
            )
            if price <= budget_s:
                kept = trial
            else:
                dropped.append(value)
            continue
        cost = sum(
            max(
                min_run_s,
                estimate_run_s(
                    s,
                    seconds_per_episode=seconds_per_episode,
                    eval_episodes=eval_episodes,
                    measured_tokens=measured_tokens,
                ),
            )
            for s in by_value[value]
        )
        if spent + cost <= budget_s:
            kept += by_value[value]
            spent += cost
        else:
            dropped.append(value)
    return kept, dropped
