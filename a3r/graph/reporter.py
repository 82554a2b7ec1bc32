"""The reporter: judges the pre-registered hypotheses with their decision rules, writes the findings
and the conclusion into the store, writes the Markdown report with plots, and stops the servers.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from langgraph.runtime import Runtime

from a3r.graph.context import RunContext
from a3r.graph.records import ensure_finding
from a3r.graph.state import ResearchState, first_hypothesis
from a3r.study.plans import StabilityCriterion
from a3r.study.report import write_report
from a3r.study.research import ConfigVerdict, min_stable_value, non_monotone, verdicts
from a3r.study.runs import RunOutcome
from memory import ArtifactKind, FindingStatus, StudyStatus, StudyUpdate

__all__ = ["reporter"]


def _vibe_conclusion(state: ResearchState, ctx: RunContext) -> str:
    outcomes = [o for o in state.get("outcomes", []) if o.purpose == "train"]
    curve = [point for o in outcomes for point in o.curve]
    study_id = state["study_id"]
    hypothesis = first_hypothesis(state)
    run_ids = [o.run_id for o in outcomes]
    if len(curve) < 2:
        episodes = sum(o.episodes for o in state.get("outcomes", []))
        shown = ", ".join(f"step {s}: reward {v:.3f}" for s, v in curve)
        return (
            f"{len(curve)} trainer step(s) recorded{f' ({shown})' if shown else ''} after {episodes} episodes; "
            f"last status {outcomes[-1].status if outcomes else 'none'}: too few steps to judge the hypothesis"
        )
    k = min(2, len(curve) // 2)
    first = statistics.fmean(v for _, v in curve[:k])
    last = statistics.fmean(v for _, v in curve[-k:])
    gain = last - first
    # The pre-registered rule compares 2-step windows; with fewer than 4 steps it cannot be applied as
    # registered, so the change is reported but the hypothesis stays unconfirmed.
    status = (
        FindingStatus.unconfirmed
        if k < 2 or gain == 0
        else FindingStatus.confirmed
        if gain > 0
        else FindingStatus.refuted
    )
    statement = (
        f"training on {state['plan'].template} for {curve[-1][0]} steps changed the mean train reward from "
        f"{first:.3f} (first {k} steps) to {last:.3f} (last {k} steps): {gain:+.3f}"
    )
    ensure_finding(
        ctx,
        study_id,
        statement=statement,
        evidence={"curve": curve, "first_k_mean": first, "last_k_mean": last},
        confidence=0.6 if status is not FindingStatus.unconfirmed else 0.3,
        status=status,
        seeds=sorted({o.seed for o in outcomes}),
        run_ids=run_ids,
        hypothesis_id=hypothesis,
    )
    if k < 2:
        return statement + (
            f" — hypothesis unconfirmed: {len(curve)} steps are too few for its decision rule (last 2 vs "
            "first 2 steps)"
        )
    return (
        statement
        + f" — hypothesis {status.value} by its decision rule (1 seed; replicate before relying on it)"
    )


def _research_conclusion(state: ResearchState, ctx: RunContext, configs: list[ConfigVerdict]) -> str:
    plan = state["plan"]
    assert plan.sweep is not None
    variable = plan.sweep.variable
    study_id = state["study_id"]
    hypothesis = first_hypothesis(state)
    for c in configs:
        verdict = {True: "stable", False: "unstable", None: "undecided"}[c.stable]
        ensure_finding(
            ctx,
            study_id,
            statement=(
                f"{variable}={c.value:g} is {verdict} ({len(c.stable_seeds)}/{len(c.seeds)} seeds stable; last-k train "
                f"reward {c.last_k_reward:.3f}, held-out p@1 {c.pass_at_1:.3f}, p@2 {c.pass_at_2:.3f})"
            ),
            evidence={
                "reasons": c.reasons,
                "runs": c.runs,
                "last_k_reward": c.last_k_reward,
                "pass_at_1": c.pass_at_1,
                "pass_at_2": c.pass_at_2,
                "mean_reward": c.eval_mean_reward,
            },
            confidence=0.8 if c.stable is not None else 0.3,
            status=FindingStatus.confirmed if c.stable is not None else FindingStatus.unconfirmed,
            seeds=c.seeds,
            run_ids=c.run_ids,
            hypothesis_id=hypothesis,
        )
    if not configs:
        return "no sweep run finished; no conclusion"
    if plan.sweep.goal == "best":
        scored = [c for c in configs if math.isfinite(c.eval_mean_reward)]
        if not scored:
            return "no configuration was evaluated on held-out tasks; no conclusion"
        best = max(scored, key=lambda c: c.eval_mean_reward)
        return f"best {variable} = {best.value:g} (held-out mean reward {best.eval_mean_reward:.3f} over seeds {best.seeds})"
    tested = ", ".join(f"{c.value:g}" for c in configs)
    all_ids = [i for c in configs for i in c.run_ids]
    seeds = sorted({s for c in configs for s in c.seeds})
    smallest = min_stable_value(configs)
    noisy = non_monotone(configs)
    if smallest is None:
        statement = f"no tested {variable} ({tested}) was stable on every seed (with every larger value stable) under the pre-registered definition"
        status = FindingStatus.refuted
    else:
        chosen = next(c for c in configs if c.value == smallest)
        below = [c for c in configs if c.value < smallest and c.stable is False]
        statement = f"minimal stable {variable} = {smallest:g} (stable on seeds {chosen.stable_seeds}, and every larger tested value stable)"
        if below:
            statement += "; " + "; ".join(
                f"{c.value:g} unstable ({c.reasons[0] if c.reasons else 'see runs'})" for c in below[-2:]
            )
        elif smallest == min(c.value for c in configs):
            statement = f"minimal stable {variable} ≤ {smallest:g}: the smallest tested value was already stable on seeds {chosen.stable_seeds}"
        status = FindingStatus.confirmed
        if noisy:
            statement += (
                f". Caution: {', '.join(f'{v:g}' for v in noisy)} also passed while a larger value failed — the verdicts "
                "are noisy at this budget (more seeds or steps needed)"
            )
            status = FindingStatus.unconfirmed
    ensure_finding(
        ctx,
        study_id,
        statement=statement,
        evidence={"configs": [c.model_dump() for c in configs]},
        confidence=0.75 if status is FindingStatus.confirmed else 0.5,
        status=status,
        seeds=seeds,
        run_ids=all_ids,
        hypothesis_id=hypothesis,
    )
    return statement


def reporter(state: ResearchState, runtime: Runtime[RunContext]) -> dict[str, object]:
    """Conclude the study and write its report (idempotent: findings by statement, report by content)."""
    ctx = runtime.context
    ctx.close_servers()
    plan = state["plan"]
    study_id = state["study_id"]
    outcomes: list[RunOutcome] = list(state.get("outcomes", []))
    baseline = state.get("baseline")
    configs: list[ConfigVerdict] = []
    if plan.kind == "research" and baseline is not None:
        configs = verdicts(outcomes, baseline=baseline, criterion=plan.stability or StabilityCriterion())
    conclusion = state.get("conclusion")
    stopped_early = conclusion is not None
    if conclusion is None:
        conclusion = (
            _research_conclusion(state, ctx, configs)
            if plan.kind == "research"
            else _vibe_conclusion(state, ctx)
        )
    elif plan.kind == "research":
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
    )
    ctx.store.add_artifact(study_id, ArtifactKind.report, "report.md", path.read_text(encoding="utf-8"))
    line = f"report: {path} — {conclusion}"
    ctx.store.log_event(line, study_id=study_id)
    ctx.say(line)
    return {"conclusion": conclusion, "report": str(path), "log": [line]}
