"""The reporter: judges the pre-registered hypotheses with their decision rules, writes the findings
and the conclusion into the store, writes the Markdown report with plots, and stops the servers.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from langgraph.runtime import Runtime

from a3r.graph.context import RunContext
from a3r.graph.records import config_identity, ensure_finding
from a3r.graph.state import ResearchState, first_hypothesis
from a3r.study.analysis import DiagnosisKind, on_shared_tasks, part_roles, reward_range, task_span
from a3r.study.design import STABLE_CONFIRM_SEEDS, ranked_by_held_out, seed_means
from a3r.study.effects import LEVEL, Effect, EffectVerdict, Scale, curve_effect, two_sample_effect
from a3r.study.headline import NOT_RUN, budget_advice, verdict_label
from a3r.study.plans import PlanDraft, StabilityCriterion
from a3r.study.price import Serving, stage_s
from a3r.study.report import write_report
from a3r.study.research import budget_note, measured_run_s, measured_tenants, spent_s, sweep_specs
from a3r.study.runs import RunOutcome
from a3r.study.settings import value_text
from a3r.study.stability import (
    DROPPED_BY_REPLAN,
    ConfigVerdict,
    compared_tasks_text,
    min_stable_value,
    non_monotone,
    not_run_reason,
    verdicts,
)
from a3r.study.wording import counted, unit_noun
from memory import ArtifactKind, FindingStatus, StudyStatus, StudyUpdate

__all__ = ["held_out_effect", "reporter", "train_effect"]


def _cannot_learn(outcomes: list[RunOutcome]) -> str:
    """Why the training runs could not learn ("" when they could): no update ran, or the last run saw
    only zero-signal groups (no GRPO gradient)."""
    if not any(o.steps > 0 for o in outcomes):
        return "no trainer step ran"
    last = outcomes[-1]
    zero = [d for d in last.diagnoses if d.kind is DiagnosisKind.zero_signal]
    if zero:
        return f"{last.key}: {zero[0].summary}"
    return ""


def train_effect(outcomes: list[RunOutcome], *, scale: Scale | None = None) -> Effect:
    """The hypothesis' effect: the change of the mean train reward over training, per seed (a patched
    run's continuations joined to its seed's curve), through `a3r.study.effects.curve_effect`, its
    interval bounded by the reward's range ``scale`` (`a3r.study.analysis.reward_range`)."""
    by_seed: dict[int, list[tuple[int, float]]] = {}
    for o in outcomes:
        by_seed.setdefault(o.seed, []).extend(o.curve)
    curves = [[v for _, v in sorted(points)] for points in by_seed.values()]
    why = _cannot_learn(outcomes) if outcomes else "no training run"
    return curve_effect(curves, can_learn=not why, why_not=why, scale=scale)


def held_out_effect(state: ResearchState) -> tuple[Effect, str] | None:
    """Held-out mean reward after training minus before (the smoke run's evaluation), over episodes
    (`a3r.study.effects.two_sample_effect`), on the held-out tasks both evaluations ran
    (`a3r.study.analysis.on_shared_tasks`); ``None`` without both evaluations.

    Returns:
        The effect and which tasks it compares, in a few words.
    """
    outcomes = state.get("outcomes", [])
    before = next((o.eval for o in outcomes if o.purpose == "smoke" and o.eval is not None), None)
    after = next((o.eval for o in reversed(outcomes) if o.purpose == "train" and o.eval is not None), None)
    if before is None or after is None:
        return None
    (after_on, before_on), tasks = on_shared_tasks([after, before])
    if tasks is None:
        where = f"before on {before.tasks} task(s), after on {after.tasks} (not recorded per task)"
    else:
        where = f"on the {len(tasks)} held-out task(s) both evaluations ran: {task_span(tasks)}"
        if before.tasks != len(tasks) or after.tasks != len(tasks):
            where += f"; before ran {before.tasks}, after {after.tasks}"
    if any(o.reward_patch is not None for o in outcomes):
        where += "; both scored by the reward as first written: the held-out evaluator is frozen, a patch does not change it"
    scale = reward_range(state["plan"].template)
    return two_sample_effect(after_on.rewards, before_on.rewards, scale=scale), where


_CONFIDENCE_OF = {
    EffectVerdict.confirmed: LEVEL,
    EffectVerdict.refuted: LEVEL,
    EffectVerdict.unconfirmed: 0.3,
}


def on_latest_reward(outcomes: list[RunOutcome]) -> tuple[list[RunOutcome], str]:
    """The training runs whose train reward the hypothesis is judged on: per seed, those trained on the
    seed's latest reward (after its last applied reward patch). Steps trained before a patch were paid
    by another reward function, so a trend across the patch measures the patch, not learning.

    Returns:
        The runs, and a note saying which steps were left out and why (empty without a patch, or when
        no step has trained on the patched reward yet: then every run, with a note saying so).
    """
    latest = {o.seed: o.reward_patch for o in outcomes}  # in run order: the last run of a seed wins
    judged = [o for o in outcomes if o.reward_patch == latest[o.seed]]
    if len(judged) == len(outcomes):
        return outcomes, ""
    patches = ", ".join(f"patch {p}" for p in sorted({p for p in latest.values() if p is not None}))
    steps = sorted(step for o in judged for step, _ in o.curve)
    if not steps:
        return outcomes, f"; no step trained on the reward of {patches} yet, so the curve spans the patch"
    before = len({step for o in outcomes if o not in judged for step, _ in o.curve})
    return judged, (
        f"; judged on steps {steps[0]}–{steps[-1]}, trained on the reward of {patches} (the {before} steps "
        "before it were paid by the reward as first written)"
    )


def _vibe_conclusion(state: ResearchState, ctx: RunContext) -> str:
    trained = [o for o in state.get("outcomes", []) if o.purpose == "train"]
    outcomes, judged_on = on_latest_reward(trained)
    curve = [point for o in outcomes for point in o.curve]
    study_id = state["study_id"]
    hypothesis = first_hypothesis(state)
    effect = train_effect(outcomes, scale=reward_range(state["plan"].template))
    held = held_out_effect(state)
    seeds = sorted({o.seed for o in outcomes})
    k = min(2, len(curve) // 2)
    change = ""
    if k:
        first = statistics.fmean(v for _, v in curve[:k])
        last = statistics.fmean(v for _, v in curve[-k:])
        change = f"; mean train reward {first:.3f} (first {counted(k, 'steps')}) → {last:.3f} (last {counted(k, 'steps')})"
    evidence: dict[str, object] = {
        "curve": curve,
        "effect": effect.model_dump(),
        "held_out_effect": held[0].model_dump() if held else None,
    }
    statement = (
        f"hypothesis {verdict_label(effect.verdict.value, evidence)}: change of the mean train reward over "
        f"{counted(len({s for s, _ in curve}), 'steps')} of {state['plan'].template} on {len(seeds)} seed(s): "
        f"{effect.describe(verdict=False)}{change}{judged_on}"
    )
    if held is not None:
        statement += f". Held-out mean reward after − before training ({held[1]}): {held[0].describe()}"
    if not curve and any(o.status == "budget" for o in state.get("outcomes", [])):
        statement += f"; the budget ran out before a trainer step: {budget_advice(ctx.budget_s)}"
    ensure_finding(
        ctx,
        study_id,
        statement=statement,
        evidence=evidence,
        confidence=_CONFIDENCE_OF[effect.verdict],
        # no trainer step and no held-out comparison: nothing ran, so no claim (`verdict_label`)
        status=FindingStatus.not_run
        if verdict_label(effect.verdict.value, evidence) == NOT_RUN
        else FindingStatus(effect.verdict.value),
        seeds=seeds,
        run_ids=[o.run_id for o in outcomes],
        hypothesis_id=hypothesis,
    )
    return statement


def _config_status(c: ConfigVerdict) -> FindingStatus:
    return FindingStatus.confirmed if c.settled else FindingStatus.unconfirmed


def _more_seeds(configs: list[ConfigVerdict]) -> str:
    needed = [
        c.margin.more_needed
        for c in configs
        if not c.settled and c.margin is not None and c.margin.more_needed is not None
    ]
    if needed:
        return f"≈ {max(needed)} more {unit_noun(max(needed), 'seeds')} would settle it"
    if any(c.margin is not None and c.margin.out_of_reach for c in configs if not c.settled):
        return "more seeds are unlikely to settle it at these margins (each one's interval is in its finding)"
    return "more seeds or steps are needed"


def _best_conclusion(
    state: ResearchState, configs: list[ConfigVerdict], variable: str
) -> tuple[str, FindingStatus]:
    """The best value by mean held-out reward over seeds; confirmed only when its lead over the
    runner-up clears the noise over seeds (Welch's interval, one observation per seed: seeds, not
    episodes, are the replicates of a training run)."""
    ranked = ranked_by_held_out(configs)
    if not ranked:
        return (
            "unconfirmed: no configuration was evaluated on held-out tasks; no conclusion",
            FindingStatus.unconfirmed,
        )
    best = ranked[0]
    text = f"best {variable} = {best.value:g} (held-out mean reward {best.eval_mean_reward:.3f} over seeds {best.seeds})"
    if len(ranked) < 2:
        return f"unconfirmed: {text}; only one configuration was evaluated", FindingStatus.unconfirmed
    outcomes = state.get("outcomes", [])
    lead = two_sample_effect(
        seed_means(outcomes, best.value),
        seed_means(outcomes, ranked[1].value),
        unit="seeds",
        sides=(f"for {variable} = {best.value:g}", f"for {variable} = {ranked[1].value:g}"),
    )
    status = FindingStatus.confirmed if lead.verdict is EffectVerdict.confirmed else FindingStatus.unconfirmed
    return (
        f"{status.value}: {text}; lead over {variable} = {ranked[1].value:g}: {lead.describe(verdict=False)}",
        status,
    )


def _comparison_conclusion(
    state: ResearchState, configs: list[ConfigVerdict], variable: str, goal: str
) -> tuple[str, FindingStatus]:
    """A-vs-B and effect-of: mean held-out reward of B − A over seeds (Welch, one observation per
    seed). A-vs-B: confirmed above the minimum effect, refuted below it. Effect-of: the same, with a
    change that lowers the reward confirmed as a decrease (the sign flipped)."""
    plan = state["plan"]
    assert plan.sweep is not None
    a_value, b_value = plan.sweep.coarse[0], plan.sweep.coarse[1]
    outcomes = state.get("outcomes", [])
    arm_a, arm_b = seed_means(outcomes, a_value), seed_means(outcomes, b_value)
    a, b = (value_text(variable, plan.template, v) for v in (a_value, b_value))
    side_a, side_b = f"for {variable} = {a}", f"for {variable} = {b}"
    effect = two_sample_effect(arm_b, arm_a, unit="seeds", sides=(side_b, side_a))
    head = f"{variable} {b} vs {a}: held-out mean reward {_mean_text(arm_b)} vs {_mean_text(arm_a)}"
    if goal == "effect_of" and math.isfinite(effect.estimate) and effect.estimate < 0:
        drop = two_sample_effect(arm_a, arm_b, unit="seeds", sides=(side_a, side_b))
        if drop.verdict is EffectVerdict.confirmed:
            return (
                f"confirmed: changing {variable} from {a} to {b} lowers the held-out mean reward; {head}; "
                f"decrease {drop.describe(verdict=False)}",
                FindingStatus.confirmed,
            )
        return f"unconfirmed: {head}; effect {effect.describe(verdict=False)}", FindingStatus.unconfirmed
    status = FindingStatus(effect.verdict.value)
    # effect-of: "no effect that matters" needs the interval inside (−m, m), refuted in both directions
    if (
        goal == "effect_of"
        and status is FindingStatus.refuted
        and two_sample_effect(arm_a, arm_b, unit="seeds").verdict is not EffectVerdict.refuted
    ):
        status = FindingStatus.unconfirmed
    what = (
        f"{variable} = {b} beats {a}"
        if goal == "a_vs_b"
        else f"changing {variable} from {a} to {b} raises the reward"
    )
    return f"{status.value}: {what}? {head}; effect {effect.describe(verdict=False)}", status


def _mean_text(values: list[float]) -> str:
    if not values:
        return "n/a (0 seeds)"
    return f"{statistics.fmean(values):.3f} ({len(values)} seed{'s' if len(values) != 1 else ''})"


def _not_run_statement(c: ConfigVerdict, variable: str, template: str | None) -> str:
    """The record of a configuration none of whose runs ran: every seed with its cause in its first clause
    (the finding's title), then each run's own reason: "not run: batch_size=4 gave no evidence, no
    claim is made about it (seeds 0, 1: cancelled by the budget before its first step); seed 0: …"."""
    causes = ", and ".join(c.not_run_short.split("; ")) if c.not_run_short else "no run"
    return (
        f"not run: {variable}={value_text(variable, template, c.value)} gave no evidence, no claim is made about it "
        f"({causes}); {'; '.join(c.not_run)}"
    )


def _config_statement(c: ConfigVerdict, variable: str, status: FindingStatus) -> str:
    """A min-stable study's finding on one configuration that ran: its stability verdict over the seeds
    that ran, what it compared, its margin, and the seeds that did not run."""
    verdict = {True: "stable", False: "unstable", None: "undecided"}[c.stable]
    text = (
        f"{status.value}: {variable}={c.value:g} is {verdict} ({len(c.stable_seeds)}/{counted(len(c.seeds), 'seeds')} "
        f"that ran stable; held-out p@1 {c.pass_at_1:.3f}, p@2 {c.pass_at_2:.3f}, mean reward {c.eval_mean_reward:.3f}); "
        "held-out mean reward after − before training on the same tasks: "
        + (c.margin.describe() if c.margin else "no held-out evaluation")
    )
    return text + (f"; not run: {'; '.join(c.not_run)}" if c.not_run else "")


def _measured_statement(c: ConfigVerdict, variable: str, template: str | None) -> str:
    """A best, A-vs-B or effect-of study's record of one configuration: what its runs measured."""
    return (
        f"measured: {variable}={value_text(variable, template, c.value)} on seeds {c.seeds}: held-out mean reward {c.eval_mean_reward:.3f}, "
        f"p@1 {c.pass_at_1:.3f}, p@2 {c.pass_at_2:.3f}; last-k train reward {c.last_k_reward:.3f}"
    )


def _config_findings(state: ResearchState, ctx: RunContext, configs: list[ConfigVerdict]) -> None:
    """One finding per configuration: "not run" with its reasons for one none of whose runs ran (no
    claim, no identity: never reused as tested); else, about what the goal asks, its stability for a
    min-stable question or only what was measured (the comparison's verdict is the conclusion's). A
    later study reuses a configuration's runs through its finding."""
    plan = state["plan"]
    assert plan.sweep is not None
    variable = plan.sweep.variable
    study_id = state["study_id"]
    hypothesis = first_hypothesis(state)
    identity = config_identity(plan, ctx.model)
    outcomes = state.get("outcomes", [])
    own = {o.run_id for o in outcomes if o.stage != "prior"}  # reused runs stay linked to their own study
    stability_goal = plan.sweep.goal == "min_stable"
    for c in configs:
        if not c.ran:
            # no claim about what did not run; no identity either, so no later study reuses it as tested
            ensure_finding(
                ctx,
                study_id,
                statement=_not_run_statement(c, variable, plan.template),
                evidence={"value": c.value, "runs": c.runs, "not_run": c.not_run},
                confidence=0.0,
                status=FindingStatus.not_run,
                run_ids=[i for i in c.run_ids if i in own],
                hypothesis_id=hypothesis,
            )
            continue
        status = _config_status(c) if stability_goal else FindingStatus.unconfirmed
        ensure_finding(
            ctx,
            study_id,
            statement=_config_statement(c, variable, status)
            if stability_goal
            else _measured_statement(c, variable, plan.template),
            evidence={
                "identity": identity,
                "value": c.value,
                "reused_from": [p.finding_id for p in state.get("priors") or [] if p.value == c.value],
                "outcomes": [o.model_dump() for o in outcomes if o.purpose == "sweep" and o.value == c.value],
                "runs": c.runs,
                "last_k_reward": c.last_k_reward,
                "pass_at_1": c.pass_at_1,
                "pass_at_2": c.pass_at_2,
                "mean_reward": c.eval_mean_reward,
            }
            | (
                {"reasons": c.reasons, "margin": c.margin.model_dump() if c.margin else None}
                if stability_goal
                else {}
            ),
            confidence=LEVEL if status is FindingStatus.confirmed else 0.3,
            status=status,
            seeds=c.seeds,
            run_ids=[i for i in c.run_ids if i in own],
            hypothesis_id=hypothesis,
        )


def _research_conclusion(state: ResearchState, ctx: RunContext, configs: list[ConfigVerdict]) -> str:
    plan = state["plan"]
    assert plan.sweep is not None
    variable = plan.sweep.variable
    outcomes = state.get("outcomes", [])
    own = {o.run_id for o in outcomes if o.stage != "prior"}  # reused runs stay linked to their own study
    _config_findings(state, ctx, configs)
    if not configs:
        return "unconfirmed: no sweep run finished; no conclusion"
    all_ids = [i for c in configs for i in c.run_ids if i in own]
    seeds = sorted({s for c in configs for s in c.seeds})
    missing = _not_run_text(
        configs,
        variable,
        outcomes,
        budget_s=ctx.budget_s,
        tenants=_TenantSettle(plan, ctx.serving(), ctx.eval_tasks * ctx.eval_samples),
    )
    ran = [c for c in configs if c.ran]
    if not ran:
        statement, status = f"{NOT_RUN}: no configuration ran{missing}", FindingStatus.not_run
    elif plan.sweep.goal in ("best", "a_vs_b", "effect_of"):
        if plan.sweep.goal == "best":
            statement, status = _best_conclusion(state, ran, variable)
        else:
            statement, status = _comparison_conclusion(state, ran, variable, plan.sweep.goal)
        compared = compared_tasks_text(outcomes)
        statement += f". Compared on the same tasks: {compared}" if compared else ""
        statement += missing
    else:
        statement, status = _min_stable_conclusion(
            configs, variable, missing=missing, planned=plan.sweep.coarse
        )
    ensure_finding(
        ctx,
        state["study_id"],
        statement=statement,
        evidence={"configs": [c.model_dump() for c in configs]},
        confidence=LEVEL if status in (FindingStatus.confirmed, FindingStatus.refuted) else 0.3,
        status=status,
        seeds=seeds,
        run_ids=all_ids,
        hypothesis_id=first_hypothesis(state),
    )
    return statement


@dataclass(frozen=True)
class _TenantSettle:
    """What the settle budget needs to price the runs that did not run as tenants of one server."""

    plan: PlanDraft
    serving: Serving
    eval_episodes: int


def _tenant_settle(
    tenants: _TenantSettle, configs: list[ConfigVerdict], cut: list[RunOutcome], outcomes: list[RunOutcome]
) -> tuple[float, str] | None:
    """The seconds the runs that did not run (``cut`` by the budget, or dropped before they started)
    add as one more tenant stage (`a3r.study.price.stage_s` at what the study's tenant stages measured),
    with how they were priced; ``None`` without tenants or before a tenant stage was measured."""
    measured = measured_tenants(outcomes)
    if not tenants.serving.tenants or measured is None:
        return None
    pairs = [(o.value, o.seed) for o in cut if o.value is not None]
    pairs += [
        (c.value, int(why.split(":")[0].split()[1]))
        for c in configs
        for why in c.not_run
        if why.endswith(DROPPED_BY_REPLAN)
    ]
    specs = [s for v, seed in pairs for s in sweep_specs(tenants.plan, [v], "settle", seeds=[seed])]
    speeds = [o.seconds_per_episode for o in outcomes if o.purpose == "sweep" and o.wall_s > 0]
    seconds = stage_s(
        specs,
        seconds_per_episode=min((x for x in speeds if math.isfinite(x)), default=math.nan),
        eval_episodes=tenants.eval_episodes,
        serving=tenants.serving,
        measured=measured,
    )
    how = (
        f"as tenants of one server at the measured {measured.start_s:,.0f} s server start and "
        f"{measured.run_s:,.0f} s per tenant run"
    )
    return seconds, how


def _not_run_text(
    configs: list[ConfigVerdict],
    variable: str,
    outcomes: list[RunOutcome],
    *,
    budget_s: float,
    tenants: _TenantSettle | None = None,
) -> str:
    """The sentence a conclusion ends with when some configurations or seeds did not run: which and why,
    and for budget stops the budget that would run them, from the measured per-run time ("" when
    every run ran); in a study whose stages ran as tenants of one server, from the price of those runs as
    one more tenant stage (`_tenant_settle`), the cut tenants' time left in (their stage's time was
    spent on the runs beside them)."""
    missing = [c for c in configs if c.not_run]
    if not missing:
        return ""
    text = ". Not run (no claim is made about them): " + "; ".join(
        f"{variable} = {c.value:g}" + (" (entirely)" if not c.ran else "") + f", {c.not_run_short}"
        for c in missing
    )
    sweep = [o for o in outcomes if o.purpose == "sweep"]
    cut = [o for o in sweep if o.status == "budget" and not_run_reason(o) is not None]
    # the planned runs a budget re-plan dropped before they started never ran either
    unstarted = sum(why.endswith(DROPPED_BY_REPLAN) for c in configs for why in c.not_run)
    missed = len(cut) + unstarted
    if not missed:
        return text
    parts = [f"{len(cut)} cancelled"] * bool(cut) + [f"{unstarted} dropped before they started"]
    shared = _tenant_settle(tenants, configs, cut, outcomes) if tenants is not None else None
    if shared is not None:
        seconds, how = shared
        needed = spent_s(outcomes) - spent_s([o for o in cut if o.tenant_server is None]) + seconds
        return text + (
            f". The budget ran out for {counted(missed, 'runs')}"
            + (f" ({', '.join(parts)})" if unstarted else "")
            + f": {how}, --budget-minutes {math.ceil(needed / 60)} would have run them "
            f"(this one had {budget_s / 60:g})"
        )
    measured = measured_run_s(outcomes)
    if measured is None:
        return (
            text
            + f". The budget stopped {counted(missed, 'runs')} before they could answer and no sweep run "
            "completed, so no per-run time was measured: the dry run (--dry-run) names the budget the study needs"
        )
    per_run, ran = measured
    # what was spent, less the time the cut runs wasted, plus a measured run's time for each run not run
    needed = spent_s(outcomes) - spent_s(cut) + missed * per_run
    return text + (
        f". The budget ran out for {counted(missed, 'runs')}"
        + (f" ({', '.join(parts)})" if unstarted else "")
        + f": at the {per_run:,.0f} s per run measured (median of the {counted(ran, 'runs')} that ran), "
        f"--budget-minutes {math.ceil(needed / 60)} would have run them (this one had {budget_s / 60:g})"
    )


def _min_stable_conclusion(
    configs: list[ConfigVerdict], variable: str, *, missing: str = "", planned: Sequence[float] = ()
) -> tuple[str, FindingStatus]:
    """The minimal-stable answer over the configurations that ran (``missing``: the sentence on those
    that did not), confirmed only when every verdict it rests on clears the noise: the chosen value's
    margin, the failure of the value below it, and no stable value below a failing one. A study in which
    nothing ran failed or stayed undecided answers nothing, and says so. "No value is stable" is
    refuted only when every planned configuration (``planned``, and every one in ``configs``) ran: a
    hypothesis over values that did not run cannot be refuted by those that did."""
    not_ran = sorted({*planned, *(c.value for c in configs)} - {c.value for c in configs if c.ran})
    configs = [c for c in configs if c.ran]
    tested = ", ".join(f"{c.value:g}" for c in configs)
    smallest = min_stable_value(configs)
    noisy = non_monotone(configs)
    if smallest is None and not any(c.stable is False for c in configs):
        return (
            f"unconfirmed: no configuration that ran ({tested or 'none'}) has a stability verdict yet{missing}",
            FindingStatus.unconfirmed,
        )
    if smallest is None:
        decided = [c for c in configs if c.stable is False]
        top = max(decided, key=lambda c: c.value) if decided else None
        settled = top is not None and top.settled
        status = FindingStatus.refuted if settled and not not_ran else FindingStatus.unconfirmed
        statement = (
            f"{status.value}: no {variable} that ran ({tested}) was stable on every seed (with every larger value "
            "stable) under the pre-registered definition"
        )
        if not_ran:
            statement += (
                f"; {variable} = {', '.join(f'{v:g}' for v in not_ran)} did not run, so the hypothesis is not "
                "refuted"
            )
        elif not settled:
            statement += f"; the largest failing value's verdict is within noise: {_more_seeds(configs)}"
        return statement + missing, status
    chosen = next(c for c in configs if c.value == smallest)
    below = [c for c in configs if c.value < smallest and c.stable is False]
    if below:
        statement = f"minimal stable {variable} = {smallest:g} (stable on seeds {chosen.stable_seeds}, and every larger tested value stable)"
        statement += "; " + "; ".join(
            f"{c.value:g} unstable ({c.reasons[0] if c.reasons else 'see runs'})" for c in below[-2:]
        )
    else:
        statement = f"minimal stable {variable} ≤ {smallest:g}: the smallest tested value was already stable on seeds {chosen.stable_seeds}"
    resting = [chosen, *below[-1:]]
    unsettled = [c for c in resting if not c.settled]
    few = len(set(chosen.stable_seeds)) < STABLE_CONFIRM_SEEDS
    status = FindingStatus.unconfirmed if noisy or unsettled or few else FindingStatus.confirmed
    if few:
        bound = 1 - 0.05 ** (1 / max(len(set(chosen.stable_seeds)), 1))
        statement += (
            f". {len(set(chosen.stable_seeds))} stable seed(s) bound the per-run failure rate of {variable} = "
            f"{smallest:g} only below {bound:.0%} (95%); >= {STABLE_CONFIRM_SEEDS} are needed to confirm it"
        )
    if chosen.margin is not None:
        statement += f". Held-out mean reward after − before training of {variable} = {smallest:g}: {chosen.margin.describe()}"
    if unsettled:
        statement += (
            f". Within noise: the verdict of {', '.join(f'{variable} = {c.value:g}' for c in unsettled)} "
            f"({_more_seeds(unsettled)})"
        )
    if noisy:
        statement += (
            f". Caution: {', '.join(f'{v:g}' for v in noisy)} also passed while a larger value failed — the verdicts "
            "are noisy at this budget (more seeds or steps needed)"
        )
    return f"{status.value}: {statement}{missing}", status


def _stop_cause(outcomes: list[RunOutcome]) -> str:
    """Why a study that stopped early left its remaining planned runs unstarted, in a few words."""
    if any(o.status == "failed_to_start" for o in outcomes):
        return "the study stopped after a start failure"
    return "the study stopped early"


def reporter(state: ResearchState, runtime: Runtime[RunContext]) -> dict[str, object]:
    """Conclude the study and write its report (idempotent: findings by statement, report by content)."""
    ctx = runtime.context
    ctx.close_servers()
    # the time since the last run (the servers' stop), once: a re-run of this node writes the same report
    wrap_up_s = float(
        ctx.ledger.once(ctx.key("reporter", "wrap-up"), lambda: max(0.0, time.monotonic() - ctx.clock_mark))
    )
    plan = state["plan"]
    study_id = state["study_id"]
    outcomes: list[RunOutcome] = list(state.get("outcomes", []))
    baseline = state.get("baseline")
    configs: list[ConfigVerdict] = []
    if plan.kind == "research" and baseline is not None:
        configs = verdicts(
            outcomes,
            baseline=baseline,
            criterion=plan.stability or StabilityCriterion(),
            scale=reward_range(plan.template),
            unstarted=[(float(v), int(seed)) for v, seed in state.get("unstarted") or []],
            planned=[(v, s) for v in plan.sweep.coarse for s in plan.training.seeds] if plan.sweep else [],
            stopped=_stop_cause(outcomes) if state.get("conclusion") is not None else "",
        )
    conclusion = state.get("conclusion")
    stopped_early = conclusion is not None
    if conclusion is None:
        conclusion = (
            _research_conclusion(state, ctx, configs)
            if plan.kind == "research"
            else _vibe_conclusion(state, ctx)
        )
    elif plan.kind == "research":
        if plan.sweep is not None:  # what did not run is recorded as not run, as in a study that ended
            _config_findings(state, ctx, [c for c in configs if not c.ran])
        ensure_finding(
            ctx,
            study_id,
            statement=conclusion,
            evidence={"baseline": baseline.model_dump() if baseline else None},
            confidence=0.9,
            status=FindingStatus.unconfirmed,
        )
    study = ctx.store.update_study(
        study_id,
        StudyUpdate(
            status=StudyStatus.abandoned if stopped_early else StudyStatus.concluded, conclusion=conclusion
        ),
    )
    folder = Path(state.get("workspace") or ctx.root / "studies" / str(study_id))
    path = write_report(
        folder,
        study=study,
        plan=plan,
        hypotheses=ctx.store.hypotheses(study_id),
        outcomes=outcomes,
        baseline=baseline,
        configs=configs,
        findings=ctx.store.findings(study_id),
        patches=ctx.store.patches(study_id),
        conclusion=conclusion,
        reward_parts=tuple(part_roles(plan.template)),
        notes=[note for note in (state.get("sizing"), compared_tasks_text(outcomes, baseline)) if note]
        + [budget_note(outcomes, wrap_up_s=wrap_up_s, budget_s=ctx.budget_s)]
        + list(state.get("budget_cuts") or [])
        + [f"reused the runs of prior {p.cite()}" for p in state.get("priors") or []],
        reused={
            o.run_id: f"study {p.study_id}, finding #{p.finding_id}"
            for p in state.get("priors") or []
            for o in p.outcomes
        },
    )
    ctx.store.add_artifact(study_id, ArtifactKind.report, "report.md", path.read_text(encoding="utf-8"))
    line = f"report: {path} — {conclusion}"
    ctx.store.log_event(line, study_id=study_id)
    ctx.say(line)
    return {"conclusion": conclusion, "report": str(path), "log": [line]}
