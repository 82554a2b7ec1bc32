"""The research study's stages as a pure decision: what to run next, or what to conclude.

A research thread moves preflight → coarse → refine → replicate → done (`a3r.study.design` says how each
stage picks its configurations and seeds). After each stage the planner node (`a3r.graph.planner`) asks
`next_stage` for a `StageDecision` and applies it: the decision names the next stage, the runs to queue
(empty: report), the lines to say and log, and what the budget cut. No I/O here: the inputs are the
study's progress (`StudyProgress`) and its budget (`StageBudget`), both plain data.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal

from a3r.study.analysis import RewardSummary
from a3r.study.design import (
    BEST_REFINE_ROUNDS,
    MIN_STABLE_REFINE_ROUNDS,
    PriorFinding,
    answering_values,
    best_refine_values,
    coarse_values,
    replicate_additions,
)
from a3r.study.plans import PlanDraft, StabilityCriterion
from a3r.study.price import (
    SEQUENTIAL,
    SERVER_OVERHEAD_S,
    Serving,
    TenantMeasure,
    estimate_run_s,
    stage_s,
)
from a3r.study.research import (
    ConfigVerdict,
    fit_budget,
    measured_run_s,
    measured_tenants,
    min_stable_value,
    refine_values,
    sweep_specs,
    token_cap,
    verdicts,
)
from a3r.study.runs import RunOutcome, RunSpec
from a3r.study.sequential import SignalCheck, SignalRule
from a3r.study.settings import resolve_setting, value_text
from a3r.study.wording import counted

__all__ = [
    "Stage",
    "StageBudget",
    "StageDecision",
    "StudyProgress",
    "next_stage",
    "refit_queue",
    "signal_of",
]


class Stage(StrEnum):
    """Where a thread stands. A `StrEnum`, so a checkpoint that stored the stage as a plain string
    (before this type existed) still compares and loads: ``Stage("coarse") == "coarse"``."""

    preflight = "preflight"
    coarse = "coarse"
    refine = "refine"
    replicate = "replicate"
    train = "train"
    """A vibe thread's only stage."""
    done = "done"


_FAILED = re.compile(r"\d+ of \d+ held-out attempts failed.*$")
"""The evaluation's note on failed attempts (`a3r.swarmops.execution`), the last part of a run's reason."""


@dataclass(frozen=True)
class StudyProgress:
    """What a research study has done so far (the research part of the graph's state).

    Attributes:
        plan: The research plan (``plan.sweep`` set).
        stage: The stage whose runs just ended.
        outcomes: Every run so far (reused prior runs included).
        baseline: The preflight's held-out rewards (``None`` until the preflight was read).
        priors: Findings of earlier studies whose runs this study reuses.
        refine_rounds: Refine stages run.
        dropped: Coarse values the budget left out (re-admitted when the measured speed fits them).
        force: Sweep even when the preflight finds no signal.
    """

    plan: PlanDraft
    stage: Stage = Stage.preflight
    outcomes: Sequence[RunOutcome] = ()
    baseline: RewardSummary | None = None
    priors: Sequence[PriorFinding] = ()
    refine_rounds: int = 0
    dropped: Sequence[float] = ()
    force: bool = False


@dataclass(frozen=True)
class StageBudget:
    """The time a decision may plan with.

    Attributes:
        left_s: Seconds of the thread's budget left (`a3r.graph.context.RunContext.budget_left_s`).
        eval_episodes: Held-out attempts of one run's evaluation (tasks × attempts per task).
        signal: The preflight's futility rule (`a3r.study.sequential.SignalRule`).
        advice: What to try when the untrained model shows no signal (the template's advice, said in the
            conclusion).
        total_s: The thread's whole budget (a stop names the ``--budget-minutes`` that would fit).
        serving: How the runner serves a stage's runs (`a3r.study.price.Serving`: tenants of one server
            or one server per run), so that a stage is priced as it will run (`a3r.study.price.stage_s`).
    """

    left_s: float
    eval_episodes: int
    signal: SignalRule = field(default_factory=SignalRule)
    advice: str = ""
    total_s: float = math.nan
    serving: Serving = SEQUENTIAL


@dataclass(frozen=True)
class StageDecision:
    """What the planner does next.

    Attributes:
        stage: The stage the thread is in after this decision (``done``: report).
        queue: Runs to queue (empty: hand over to the reporter).
        lines: Lines to say and keep in the thread's log, in order.
        events: Those of ``lines`` also recorded as the study's events.
        budget_cuts: What the budget skipped or cut, with its numbers (for the report).
        conclusion: The study's conclusion when it stops here.
        baseline: The preflight's held-out rewards, when this decision read them.
        reused: Prior runs that join the study's outcomes now.
        dropped: Coarse values the budget leaves out now (``None``: unchanged).
        refine_rounds: Refine rounds run once this decision's runs ran (``None``: unchanged).
        unstarted: ``(value, seed)`` of the planned runs this decision drops before they started (the
            report lists each as not run, `a3r.study.stability.DROPPED_BY_REPLAN`, unless it runs later).
    """

    stage: Stage
    queue: list[RunSpec] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    budget_cuts: list[str] = field(default_factory=list)
    conclusion: str | None = None
    baseline: RewardSummary | None = None
    reused: list[RunOutcome] = field(default_factory=list)
    dropped: list[float] | None = None
    refine_rounds: int | None = None
    unstarted: list[tuple[float, int]] = field(default_factory=list)

    @property
    def goto(self) -> Literal["runner", "reporter"]:
        """``runner`` when runs are queued, else ``reporter``."""
        return "runner" if self.queue else "reporter"

    def update(self) -> dict[str, Any]:
        """The graph state's update (`a3r.graph.state.ResearchState` keys) this decision makes."""
        out: dict[str, Any] = {"stage": self.stage, "log": list(self.lines)}
        if self.conclusion is None:
            out["budget_cuts"] = list(self.budget_cuts)
        else:
            out["conclusion"] = self.conclusion
        if self.queue:
            out["queue"] = list(self.queue)
        if self.baseline is not None:
            out["baseline"] = self.baseline
        if self.reused:
            out["outcomes"] = list(self.reused)
        if self.dropped is not None:
            out["dropped"] = list(self.dropped)
        if self.refine_rounds is not None:
            out["refine_rounds"] = self.refine_rounds
        if self.unstarted:
            out["unstarted"] = list(self.unstarted)
        return out


def _stop(text: str, lines: Sequence[str] = (), baseline: RewardSummary | None = None) -> StageDecision:
    return StageDecision(stage=Stage.done, conclusion=text, lines=list(lines), baseline=baseline)


def next_stage(progress: StudyProgress, budget: StageBudget) -> StageDecision:
    """The next stage of a research study once the runs of its current stage have ended.

    After the preflight: stop for lack of signal (the sequential test, unless ``force``), else the coarse
    stage's runs that fit the budget. After a sweep stage: re-admit coarse values the budget dropped
    when the measured speed fits them, refine while the answer's interval can narrow (``min_stable``:
    bisection; ``best``: midpoints around the best, `BEST_REFINE_ROUNDS`), replicate the configurations
    the answer rests on with the power rule's seeds, then report (``done``).

    Args:
        progress: The study so far.
        budget: Seconds left and the evaluation's size.
    """
    assert progress.plan.sweep is not None
    if progress.stage == Stage.preflight:
        return _after_preflight(progress, budget)
    return _after_sweep_stage(progress, budget)


def signal_of(baseline: RewardSummary, group_size: int, rule: SignalRule) -> SignalCheck | None:
    """The futility test over a preflight's attempts when the evaluator recorded none (all ended
    attempts, since their start order is unknown): successes are rewards above 0."""
    if baseline.rewards:
        successes, attempts = sum(1 for r in baseline.rewards if r > 0), len(baseline.rewards)
    elif baseline.mean_reward <= 0.0:
        successes, attempts = 0, baseline.episodes
    else:
        return None
    if attempts < 1:
        return None
    return rule.test(max(2, group_size), attempts).check(successes, attempts)


def _no_signal(
    plan: PlanDraft, baseline: RewardSummary, signal: SignalCheck | None, advice: str, reason: str
) -> str:
    """The conclusion of a study stopped before its sweep for lack of signal."""
    if signal is not None and signal.stopped:
        head = (
            f"the untrained model gets too little signal for GRPO on {plan.template}: "
            f"{signal.headline()} ({signal.describe()})"
        )
    else:
        head = (
            f"no held-out attempt of the untrained model earned a reward on {plan.template}, "
            "so GRPO would see only zero-signal groups"
            + (f" ({signal.describe()})" if signal is not None else f" (0 of {baseline.episodes} attempts)")
        )
    failed = _FAILED.search(reason)
    return f"stopped before the sweep: {head}. Recommendations: {advice}, or --force to sweep anyway." + (
        f" Note: {failed.group(0)}." if failed else ""
    )


def _after_preflight(progress: StudyProgress, budget: StageBudget) -> StageDecision:
    plan = progress.plan
    assert plan.sweep is not None
    pre = next((o for o in reversed(progress.outcomes) if o.purpose == "preflight"), None)
    if pre is None or pre.eval is None:
        reason = pre.reason if pre else "no preflight ran"
        if pre is not None and pre.status == "budget":
            return _stop(
                f"stopped: the budget ran out during the preflight evaluation ({reason}); raise --budget-minutes"
            )
        return _stop(f"stopped: the preflight evaluation failed ({reason})")
    baseline = pre.eval
    line = (
        f"preflight: untrained model on {baseline.tasks} held-out tasks, {baseline.episodes} attempts: mean reward "
        f"{baseline.mean_reward:.3f}, p@1 {baseline.pass_at_1:.3f}, p@2 {baseline.pass_at_2:.3f}"
    )
    signal = pre.signal or signal_of(baseline, plan.training.group_size, budget.signal)
    # The sequential test decides when there is one: a zero score on too few attempts to rule out the
    # signal GRPO needs is not evidence of futility (a fresh user's 16-attempt preflight stopped a
    # study while its own test said "these attempts do not rule that rate out").
    if baseline.mean_reward <= 0.0 and signal is not None and not signal.stopped:
        line += f"; a zero score, but not a stop: {signal.describe()}"
    futile = (baseline.mean_reward <= 0.0 and signal is None) or (signal is not None and signal.stopped)
    if futile and not progress.force:
        return _stop(_no_signal(plan, baseline, signal, budget.advice, pre.reason), [line], baseline)
    return _coarse(progress, budget, baseline, pre, line)


def _coarse(
    progress: StudyProgress, budget: StageBudget, baseline: RewardSummary, pre: RunOutcome, line: str
) -> StageDecision:
    """The coarse stage's runs that fit the budget at the preflight's speed."""
    plan, left = progress.plan, budget.left_s
    assert plan.sweep is not None
    reused = [o for p in progress.priors for o in p.outcomes]
    planned = sweep_specs(plan, coarse_values(plan, progress.priors), "coarse")
    kept, dropped = fit_budget(
        planned,
        budget_s=left,
        seconds_per_episode=pre.seconds_per_episode,
        eval_episodes=budget.eval_episodes,
        goal=plan.sweep.goal,
        measured_tokens=token_cap(plan),  # the preflight ran the plan's own cap
        serving=budget.serving,
        measured=measured_tenants(progress.outcomes),
    )
    variable = plan.sweep.variable
    named = ", ".join(value_text(variable, plan.template, v) for v in dropped)
    speed = f"{pre.seconds_per_episode:.1f} s per episode"
    if dropped and plan.sweep.goal in ("a_vs_b", "effect_of"):  # one arm alone cannot answer a comparison
        return _stop(
            f"stopped: the comparison needs both {variable} values on {len(plan.training.seeds)} "
            f"seeds, and {named} does not fit the remaining budget of {left:.0f} s at the preflight's "
            f"{speed}; raise --budget-minutes",
            [line],
            baseline,
        )

    def price(specs: Sequence[RunSpec]) -> float:
        return stage_s(
            specs,
            seconds_per_episode=pre.seconds_per_episode,
            eval_episodes=budget.eval_episodes,
            measured_tokens=token_cap(plan),
            serving=budget.serving,
            measured=measured_tenants(progress.outcomes),
        )

    kept_s = f"; the kept runs are priced at {price(kept):.0f} s" if kept else ""
    cheapest = _left_out_prices(
        plan,
        [],
        [(v, price([s for s in planned if s.value == v])) for v in dropped],
        seeds=len(plan.training.seeds),
    )
    cuts = (
        [
            f"budget: dropped {variable} values [{named}] from the coarse stage (would not fit {left:.0f} s at "
            f"the preflight's {speed}{kept_s}{cheapest}; re-admitted if the runs' measured speed fits them)"
        ]
        if dropped
        else []
    )
    if not kept and reused and not dropped:  # every coarse value was measured before
        after = StudyProgress(
            plan=plan,
            stage=Stage.coarse,
            outcomes=[*progress.outcomes, *reused],
            baseline=baseline,
            priors=progress.priors,
            refine_rounds=progress.refine_rounds,
            dropped=progress.dropped,
        )
        decided = _after_sweep_stage(after, budget)
        return _with_head(decided, [line], baseline=baseline, reused=reused)
    if not kept:
        return _stop(
            f"stopped: no configuration with {len(plan.training.seeds)} seeds fits the remaining budget of "
            f"{left:.0f} s; {_budget_needed(progress, budget, pre)}",
            [line, *cuts],
            baseline,
        )
    compared = {v for v in [*(s.value for s in kept), *(o.value for o in reused)] if v is not None}
    if plan.sweep.goal == "best" and len(compared) < min(2, len(set(plan.sweep.coarse) | compared)):
        # one value alone cannot answer which is best (issue 33, part 5)
        only = ", ".join(value_text(variable, plan.template, v) for v in sorted(compared))
        return _stop(
            f"stopped: a best-value question compares at least two {variable} values on "
            f"{len(plan.training.seeds)} seeds, and only {only} fits the remaining budget of {left:.0f} s at "
            f"the preflight's {speed}; {_budget_needed(progress, budget, pre)}",
            [line, *cuts],
            baseline,
        )
    return StageDecision(
        stage=Stage.coarse,
        queue=kept,
        lines=[line, *cuts],
        budget_cuts=cuts,
        baseline=baseline,
        reused=reused,
        dropped=dropped,
        unstarted=_pairs(s for s in planned if s.value in dropped),
    )


def _pairs(specs: Iterable[RunSpec]) -> list[tuple[float, int]]:
    """``(value, seed)`` of sweep runs (`StageDecision.unstarted`)."""
    return [(s.value, s.seed) for s in specs if s.value is not None]


def _budget_needed(progress: StudyProgress, budget: StageBudget, pre: RunOutcome) -> str:
    """What to give ``--budget-minutes`` so that the cheapest coarse configurations that can answer
    (`answering_values`: two for a best-value question, one for a min-stable one) fit after what the
    thread has spent (at the preflight's speed); "raise --budget-minutes" when the budget is unknown."""
    plan = progress.plan
    assert plan.sweep is not None
    specs = sweep_specs(plan, coarse_values(plan, progress.priors), "coarse")
    by_value: dict[float | None, float] = {}
    for spec in specs:
        price = estimate_run_s(
            spec,
            seconds_per_episode=pre.seconds_per_episode,
            eval_episodes=budget.eval_episodes,
            measured_tokens=token_cap(plan),
        )
        by_value[spec.value] = by_value.get(spec.value, 0.0) + price
    if not by_value or not math.isfinite(budget.total_s):
        return "raise --budget-minutes"
    reused = len(set(plan.sweep.coarse) - {v for v in by_value if v is not None})
    cost = {v if v is not None else math.nan: seconds for v, seconds in by_value.items()}
    answering = answering_values(plan.sweep.goal, cost, reused=reused)
    price = sum(cost[v] for v in answering)
    if budget.serving.tenants:  # the answering configurations as one tenant stage
        price = stage_s(
            [s for s in specs if s.value in answering],
            seconds_per_episode=pre.seconds_per_episode,
            eval_episodes=budget.eval_episodes,
            measured_tokens=token_cap(plan),
            serving=budget.serving,
            measured=measured_tenants(progress.outcomes),
        )
    need = budget.total_s - budget.left_s + price
    return f"give --budget-minutes {math.ceil(need / 6) / 10:g} or more"


def _with_head(
    decision: StageDecision, head: list[str], *, baseline: RewardSummary, reused: list[RunOutcome]
) -> StageDecision:
    """``decision`` with lines said before it, and the preflight's baseline and reused runs it brings."""
    return StageDecision(
        stage=decision.stage,
        queue=decision.queue,
        lines=[*head, *decision.lines],
        events=decision.events,
        budget_cuts=decision.budget_cuts,
        conclusion=decision.conclusion,
        baseline=baseline,
        reused=reused,
        dropped=decision.dropped,
        refine_rounds=decision.refine_rounds,
    )


@dataclass
class _Planner:
    """One sweep-stage decision under way: the budget at the sweep runs' measured speed, and the lines
    and cuts said so far."""

    progress: StudyProgress
    budget: StageBudget
    configs: list[ConfigVerdict]
    per_episode: float
    per_run: float = 0.0
    tenants: TenantMeasure | None = None
    lines: list[str] = field(default_factory=list)
    cuts: list[str] = field(default_factory=list)

    def cost(self, specs: Sequence[RunSpec]) -> str:
        seconds = stage_s(
            specs,
            seconds_per_episode=self.per_episode,
            eval_episodes=self.budget.eval_episodes,
            min_run_s=self.per_run,
            serving=self.budget.serving,
            measured=self.tenants,
        )
        floor = f" and at least {self.per_run:.0f} s per run" if self.per_run > 0 else ""
        if self.budget.serving.tenants:
            floor = tenant_terms(self.tenants, self.budget.serving)
        return f"{counted(len(specs), 'runs')} ≈ {seconds:.0f} s at the measured {self.per_episode:.1f} s per episode{floor}"

    def fit(self, specs: Sequence[RunSpec], goal: str) -> tuple[list[RunSpec], list[float]]:
        return fit_budget(
            specs,
            budget_s=self.budget.left_s,
            seconds_per_episode=self.per_episode,
            eval_episodes=self.budget.eval_episodes,
            goal=goal,
            min_run_s=self.per_run,
            serving=self.budget.serving,
            measured=self.tenants,
        )

    def shown(self, values: Sequence[float]) -> str:
        plan = self.progress.plan
        assert plan.sweep is not None
        return ", ".join(value_text(plan.sweep.variable, plan.template, v) for v in values)

    def go(
        self, specs: list[RunSpec], stage: Stage, line: str, goal: str, asked: str = "", **more: Any
    ) -> StageDecision | None:
        """Queue what fits of ``specs`` as ``stage`` (``None`` when nothing does: the skip is said)."""
        left = self.budget.left_s
        kept, dropped = self.fit(specs, goal)
        if not kept:
            note = (
                f"{stage}: skipped, {asked or self.cost(specs)} would not fit the {max(0.0, left):.0f} s left"
            )
            self.lines.append(note)
            self.cuts.append(f"budget: {note}")
            return None
        if dropped:
            variable = self.progress.plan.sweep.variable if self.progress.plan.sweep else ""
            line += f" (budget: dropped {self.shown(dropped)})"
            self.cuts.append(
                f"budget: {stage} dropped {variable} {self.shown(dropped)}: {self.cost(specs)} would not fit the "
                f"{left:.0f} s left"
            )
        return StageDecision(
            stage=stage,
            queue=kept,
            lines=[*self.lines, line],
            events=[line],
            budget_cuts=self.cuts,
            **more,
        )


def tenant_terms(measured: TenantMeasure | None, serving: Serving) -> str:
    """How a tenant stage is priced, for a budget line (`a3r.study.price.tenant_stage_s`): one server
    start, and per wave of up to ``max_tenants`` runs the longer of its slowest run and its episodes at the
    engine's aggregate speed, measured by the study's tenant stages or assumed."""
    wave = f"per wave of up to {serving.max_tenants} runs"
    if measured is None:
        side = "its slowest run" if serving.batched else "the sum of its runs' work (they share the cores)"
        return f", as tenants of one server: one start of ≈ {SERVER_OVERHEAD_S:.0f} s + {wave} {side}"
    least = f" (at least the measured {measured.run_s:.0f} s)" if measured.run_s > 0 else ""
    aggregate = (
        f" or its episodes at the {measured.seconds_per_episode:.2f} s per episode the engine gave its tenants together"
        if math.isfinite(measured.seconds_per_episode)
        else ""
    )
    return (
        f", as tenants of one server: one start of {measured.start_s:.0f} s (measured) + {wave} "
        f"its slowest run{least}{aggregate}, whichever is longer"
    )


def _after_sweep_stage(progress: StudyProgress, budget: StageBudget) -> StageDecision:
    """After the coarse or a refine or replicate stage (see `next_stage`)."""
    baseline = progress.baseline
    assert baseline is not None
    criterion = progress.plan.stability or StabilityCriterion()
    measured = [o.seconds_per_episode for o in progress.outcomes if o.purpose == "sweep"]
    planner = _Planner(
        progress,
        budget,
        configs=verdicts(progress.outcomes, baseline=baseline, criterion=criterion),
        per_episode=min((m for m in measured if m == m), default=math.nan),
        per_run=(measured_run_s(progress.outcomes) or (0.0, 0))[0],
        tenants=measured_tenants(progress.outcomes),
    )
    for step in (_readmit, _refine, _replicate):
        decided = step(planner)
        if decided is not None:
            return decided
    return StageDecision(stage=Stage.done, lines=planner.lines, budget_cuts=planner.cuts)


def _readmit(planner: _Planner) -> StageDecision | None:
    """Coarse values dropped at the preflight's speed, again when the runs' measured speed fits them (a
    min-stable question needs them only while no value tested so far is stable: they are the larger
    ones)."""
    plan, left_out = planner.progress.plan, list(planner.progress.dropped)
    assert plan.sweep is not None
    if not left_out or (plan.sweep.goal == "min_stable" and min_stable_value(planner.configs) is not None):
        return None
    kept, still = planner.fit(sweep_specs(plan, left_out, "coarse"), plan.sweep.goal)
    if not kept:
        return None
    back = sorted({s.value for s in kept if s.value is not None})
    line = (
        f"budget: re-admitted {plan.sweep.variable} values [{planner.shown(back)}] dropped from the coarse stage: "
        f"{planner.cost(kept)} fit the {planner.budget.left_s:.0f} s left"
    )
    planner.cuts.append(line)
    return StageDecision(
        stage=Stage.coarse,
        queue=kept,
        lines=[*planner.lines, line],
        events=[line],
        budget_cuts=planner.cuts,
        dropped=still,
    )


def _refine(planner: _Planner) -> StageDecision | None:
    """The next refine round, when the goal has one left and it brings new values."""
    plan, rounds = planner.progress.plan, planner.progress.refine_rounds
    sweep = plan.sweep
    assert sweep is not None
    if not sweep.refine:  # also after a replicate stage that moved the answer
        return None
    extra: list[float] = []
    if sweep.goal == "min_stable" and rounds < MIN_STABLE_REFINE_ROUNDS:
        extra = refine_values(planner.configs, [c.value for c in planner.configs])
        why = "between the smallest stable value and the unstable one below"
    elif sweep.goal == "best" and rounds < BEST_REFINE_ROUNDS:
        extra = best_refine_values(planner.configs, resolve_setting(sweep.variable, plan.template))
        why = "between the best value and its neighbours"
    if not extra:
        return None
    return planner.go(
        sweep_specs(plan, extra, f"refine{rounds + 1}"),
        Stage.refine,
        f"refine: testing {sweep.variable} ∈ {{{planner.shown(extra)}}} {why}",
        "min_stable" if sweep.goal == "min_stable" else "best",
        refine_rounds=rounds + 1,
    )


def _replicate(planner: _Planner) -> StageDecision | None:
    """More seeds for the configurations the answer rests on (bounded: arms stop at the power rule's
    n ≤ max_seeds), as many more per configuration as fit (all, else fewer, at least one each)."""
    progress = planner.progress
    plan, baseline = progress.plan, progress.baseline
    assert plan.sweep is not None and baseline is not None
    if not plan.sweep.replicate:
        return None
    additions, line = replicate_additions(
        plan,
        planner.configs,
        progress.outcomes,
        baseline=baseline,
        criterion=plan.stability or StabilityCriterion(),
    )
    if not additions:
        planner.lines.append(line)
        return None

    def runs(k: int | None) -> list[RunSpec]:
        return [
            s
            for value, seeds in additions.items()
            for s in sweep_specs(plan, [value], "replicate", seeds=seeds[:k])
        ]

    wanted = max(len(seeds) for seeds in additions.values())
    k = next((k for k in range(wanted, 0, -1) if not planner.fit(runs(k), "best")[1]), 0)
    specs, every = runs(max(k, 1)), runs(None)
    asked = planner.cost(every) + (
        f", nor 1 more seed per configuration ({planner.cost(specs)})" if wanted > 1 else ""
    )
    if 0 < k < wanted:
        cut = (
            f"replicate: {counted(k, 'more seeds')} per configuration instead of the power rule's "
            f"{wanted}: all {planner.cost(every)} would not fit the {max(0.0, planner.budget.left_s):.0f} s left"
        )
        line += f"; budget: {cut.split(': ', 1)[1]}"
        planner.cuts.append(f"budget: {cut}")
    return planner.go(specs, Stage.replicate, line, "best", asked=asked)


def refit_queue(
    progress: StudyProgress, queue: Sequence[RunSpec], budget: StageBudget
) -> StageDecision | None:
    """Re-plan a sweep stage's queued runs after each run, from the speed the study's sweep runs
    measured, down as well as up: the configurations not started yet are fitted again to the budget left
    after those under way (`fit_budget`; a configuration is never cut to fewer seeds), and in the coarse
    stage the values the budget dropped come back when they fit now (a min-stable question needs them only
    while no tested value is stable). Values dropped from the coarse stage wait in ``dropped`` for the
    stage's end (`next_stage` re-admits them there when they fit).

    Returns:
        The changed plan, or ``None`` when nothing changes (no speed measured yet, or everything still
        fits as planned). When nothing of the queue fits any more, the stage ends here (`next_stage`).
    """
    plan = progress.plan
    assert plan.sweep is not None
    measured = [
        o.seconds_per_episode
        for o in progress.outcomes
        if o.purpose == "sweep" and o.wall_s > 0 and math.isfinite(o.seconds_per_episode)
    ]
    if not measured or not queue or any(s.purpose != "sweep" for s in queue):
        return None
    per_episode = min(measured)
    run = measured_run_s(progress.outcomes)
    per_run = run[0] if run else 0.0
    tenants = measured_tenants(progress.outcomes)
    started = {(o.stage, o.value) for o in progress.outcomes if o.purpose == "sweep"}
    committed = [s for s in queue if (s.stage, s.value) in started]
    open_specs = [s for s in queue if (s.stage, s.value) not in started]

    def price(specs: Sequence[RunSpec]) -> float:
        return stage_s(
            specs,
            seconds_per_episode=per_episode,
            eval_episodes=budget.eval_episodes,
            min_run_s=per_run,
            serving=budget.serving,
            measured=tenants,
        )

    goal = plan.sweep.goal if progress.stage == Stage.coarse else "best"
    if progress.stage == Stage.refine and plan.sweep.goal == "min_stable":
        goal = "min_stable"
    # a run of a configuration under way starts only when the measured time says it can finish
    left = budget.left_s
    going: list[RunSpec] = []
    cut: list[RunSpec] = []
    priced: dict[tuple[float | None, int], float] = {}
    for spec in committed:
        # with tenants, what the run adds to the runs going with it (`stage_s`); on a server of its own,
        # what a run of its configuration measured when one ran (fresh-s5 #7: a B = 1 run measured 75 s
        # was priced at 178 s from its training speed, and its second seed was refused with 142 s left)
        same = measured_run_s([o for o in progress.outcomes if o.value == spec.value])
        if budget.serving.tenants:
            more = price([*going, spec]) - price(going)
        else:
            more = same[0] if same else price([spec])
        priced[(spec.value, spec.seed)] = more
        if more <= left:
            going.append(spec)
            left -= more
        else:
            cut.append(spec)
    kept, dropped = fit_budget(
        open_specs,
        budget_s=left,
        seconds_per_episode=per_episode,
        eval_episodes=budget.eval_episodes,
        goal=goal,
        min_run_s=per_run,
        serving=budget.serving,
        measured=tenants,
    )
    back: list[RunSpec] = []
    waiting = list(progress.dropped)
    if progress.stage == Stage.coarse and waiting and not _settled_min_stable(progress):
        back, waiting = fit_budget(
            sweep_specs(plan, waiting, "coarse"),
            budget_s=left - price(kept),
            seconds_per_episode=per_episode,
            eval_episodes=budget.eval_episodes,
            goal=plan.sweep.goal,
            min_run_s=per_run,
            serving=budget.serving,
            measured=tenants,
        )
    if not dropped and not back and not cut:
        return None
    left_out = [*cut, *(s for s in open_specs if s.value in dropped)]
    floor = (
        f"; each run priced at no less than the measured {per_run:.0f} s per run (median of the "
        f"{counted(run[1], 'runs')} that ran, start and held-out evaluation included)"
        if run
        else ""
    )
    if budget.serving.tenants:
        floor += tenant_terms(tenants, budget.serving).replace(",", ";", 1)
    floor += _left_out_prices(
        plan,
        [(s, priced[(s.value, s.seed)]) for s in cut],
        [(v, price([s for s in open_specs if s.value == v])) for v in dropped],
        seeds=len(plan.training.seeds),
    )
    refit = Refit(queue=[*going, *kept, *back], dropped=dropped, back=back, waiting=waiting, cut=cut)
    return _refitted(progress, budget, refit, _pairs(left_out), per_episode, floor)


def _left_out_prices(
    plan: PlanDraft,
    cut: Sequence[tuple[RunSpec, float]],
    dropped: Sequence[tuple[float, float]],
    *,
    seeds: int,
) -> str:
    """What the runs and configurations `refit_queue` left out were priced at, for its budget line: each
    run it did not start (its configuration's measured run, else its steps and held-out evaluation at the
    measured speed) and the cheapest configuration it dropped with all its seeds (never cut to fewer), so
    "0 runs left fit the 142 s left" comes with the price that did not fit."""
    assert plan.sweep is not None
    variable = plan.sweep.variable
    said = [
        f"{variable} = {value_text(variable, plan.template, s.value)}, seed {s.seed} is priced at {cost:.0f} s"
        for s, cost in cut
        if s.value is not None
    ]
    if dropped:
        value, cost = min(dropped, key=lambda pair: pair[1])
        said.append(
            f"the cheapest dropped configuration, {variable} = {value_text(variable, plan.template, value)} on "
            f"{counted(seeds, 'seeds')} (a configuration is never cut to fewer), is priced at {cost:.0f} s"
        )
    return f"; {'; '.join(said)}" if said else ""


@dataclass(frozen=True)
class Refit:
    """What `refit_queue` changed: the new ``queue``, the values it ``dropped``, those it brought ``back``,
    those still ``waiting`` for the stage's end, and the runs of configurations under way it ``cut``
    (not started: the measured time says they cannot finish)."""

    queue: list[RunSpec]
    dropped: list[float]
    back: list[RunSpec]
    waiting: list[float]
    cut: list[RunSpec]


def _settled_min_stable(progress: StudyProgress) -> bool:
    """Whether a min-stable question already has a stable value (the dropped, larger values are then
    not needed)."""
    plan, baseline = progress.plan, progress.baseline
    if plan.sweep is None or plan.sweep.goal != "min_stable" or baseline is None:
        return False
    criterion = plan.stability or StabilityCriterion()
    return min_stable_value(verdicts(progress.outcomes, baseline=baseline, criterion=criterion)) is not None


def _refitted(
    progress: StudyProgress,
    budget: StageBudget,
    refit: Refit,
    unstarted: list[tuple[float, int]],
    per_episode: float,
    floor: str,
) -> StageDecision:
    """The decision of `refit_queue`: the new queue, with one line saying what changed and why."""
    plan = progress.plan
    queue, dropped, back, waiting = refit.queue, refit.dropped, refit.back, refit.waiting
    assert plan.sweep is not None
    variable = plan.sweep.variable

    def shown(values: Sequence[float]) -> str:
        return ", ".join(value_text(variable, plan.template, v) for v in values)

    said = [
        f"did not start {variable} = {shown([s.value])}, seed {s.seed} (it would not finish)"
        for s in refit.cut
        if s.value is not None
    ]
    if dropped:
        said.append(f"dropped {variable} values [{shown(dropped)}]")
    if back:
        said.append(
            f"re-admitted {variable} values [{shown(sorted({s.value for s in back if s.value is not None}))}]"
        )
    line = (
        f"budget: re-planned the {progress.stage} stage at the measured {per_episode:.1f} s per episode: "
        f"{' and '.join(said)} ({counted(len(queue), 'runs')} left fit the {max(0.0, budget.left_s):.0f} s left{floor})"
    )
    coarse = progress.stage == Stage.coarse
    new_dropped = sorted({*waiting, *dropped}) if coarse else list(progress.dropped)
    if not queue:  # nothing of the stage fits any more: it ends here
        ended = _after_sweep_stage(replace(progress, dropped=new_dropped), budget)
        return replace(
            ended,
            lines=[line, *ended.lines],
            events=[line, *ended.events],
            budget_cuts=[line, *ended.budget_cuts],
            unstarted=[*unstarted, *ended.unstarted],
        )
    return StageDecision(
        stage=progress.stage,
        queue=queue,
        lines=[line],
        events=[line],
        budget_cuts=[line],
        dropped=new_dropped if coarse else None,
        unstarted=unstarted,
    )
