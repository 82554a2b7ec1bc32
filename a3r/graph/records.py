"""Get-or-create access to the knowledge store, so a node that re-runs writes nothing twice.

Natural keys where the store has them (experiment name within a study, run name within an
experiment, hypothesis statement, finding statement); the `Ledger` where it has none (the study of a
thread, a patch proposed for a run).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from a3r.graph.context import RunContext
from a3r.study.design import PriorFinding
from a3r.study.plans import HypothesisDraft, PlanDraft
from a3r.study.provenance import collect_provenance
from a3r.study.runs import RunOutcome, RunSpec
from memory import FindingStatus, RunPublic, RunStatus, Store

EMBEDDED_MODEL = "embedded"
"""The ``model`` a run's stored config names when it ran ``swarm serve``'s embedded model."""

__all__ = [
    "EMBEDDED_MODEL",
    "config_identity",
    "ensure_experiment",
    "ensure_finding",
    "ensure_hypotheses",
    "ensure_run",
    "ensure_study",
    "prior_findings",
    "stored_speed",
]


def ensure_study(ctx: RunContext, question: str, kind: str) -> int:
    """The thread's study, created once."""
    created = ctx.ledger.once(
        ctx.key("planner", "study"), lambda: ctx.store.create_study(question, kind=kind).id
    )
    return int(created)


def ensure_hypotheses(ctx: RunContext, study_id: int, drafts: Sequence[HypothesisDraft]) -> list[int]:
    """Register each hypothesis once (matched by statement), in order."""
    existing = {h.statement: h.id for h in ctx.store.hypotheses(study_id)}
    ids: list[int] = []
    for draft in drafts:
        if draft.statement not in existing:
            existing[draft.statement] = ctx.store.register_hypothesis(
                study_id,
                statement=draft.statement,
                expected_outcome=draft.expected_outcome,
                decision_rule=draft.decision_rule,
            ).id
        ids.append(existing[draft.statement])
    return ids


def ensure_experiment(
    ctx: RunContext,
    study_id: int,
    name: str,
    *,
    template: str | None,
    hypothesis_id: int | None,
    description: str = "",
) -> int:
    """The study's experiment called ``name``, created once (with its hypothesis, before any run)."""
    for experiment in ctx.store.experiments(study_id):
        if experiment.name == name:
            return experiment.id
    return ctx.store.create_experiment(
        study_id, name, template=template, hypothesis_id=hypothesis_id, description=description
    ).id


def ensure_run(
    ctx: RunContext, experiment_id: int, spec: RunSpec, *, server_url: str | None = None
) -> RunPublic:
    """The experiment's run for ``spec`` (named by its key), started once.

    A run left ``running`` by a killed process is returned as is: the runner continues it.
    """
    for run in ctx.store.runs():
        if run.experiment_id == experiment_id and run.name == spec.key:
            return ctx.store.get_run(run.id)
    provenance = collect_provenance()
    config = {
        "purpose": spec.purpose,
        "stage": spec.stage,
        "value": spec.value,
        "model": ctx.model or EMBEDDED_MODEL,
        **spec.settings.model_dump(),
        "provenance": provenance.model_dump(exclude={"git_commit"}),
    }
    return ctx.store.start_run(
        experiment_id,
        name=spec.key,
        config=config,
        seed=spec.seed,
        server_url=server_url,
        git_commit=provenance.git_commit,
    )


def ensure_finding(
    ctx: RunContext,
    study_id: int,
    *,
    statement: str,
    evidence: dict[str, object] | str,
    confidence: float,
    status: FindingStatus = FindingStatus.unconfirmed,
    seeds: Sequence[int] = (),
    run_ids: Sequence[int] = (),
    hypothesis_id: int | None = None,
) -> int:
    """Record a finding once (matched by statement within the study)."""
    for finding in ctx.store.findings(study_id):
        if finding.statement == statement:
            return finding.id
    text = evidence if isinstance(evidence, str) else json.dumps(evidence, default=str)
    return ctx.store.add_finding(
        study_id,
        statement=statement,
        evidence=text,
        confidence=confidence,
        status=status,
        seeds=seeds,
        run_ids=run_ids,
        hypothesis_id=hypothesis_id,
    ).id


def config_identity(plan: PlanDraft, model: str | None) -> dict[str, Any]:
    """What makes two studies' configurations the same experiment (seeds aside): the policy model,
    template, template parameters, the varied setting and every other training setting. Recorded in
    the evidence of each configuration's finding (``identity``) and matched by `prior_findings`."""
    assert plan.sweep is not None
    identity = {
        "model": model or "embedded",
        "template": plan.template,
        "params": plan.params,
        "variable": plan.sweep.variable,
        # the distillation settings only where used: findings recorded before them keep matching
        "training": {
            k: v
            for k, v in plan.training.shown_fields().items()
            if k not in {"seeds", "smoke_tasks", "concurrency", plan.sweep.variable}
        },
    }
    normalised: dict[str, Any] = json.loads(json.dumps(identity, default=str, sort_keys=True))
    return normalised


def prior_findings(
    store: Store, plan: PlanDraft, *, model: str | None, study_id: int | None = None
) -> list[PriorFinding]:
    """Findings of earlier research studies in the store that measured a configuration of this plan
    under the same `config_identity`, newest per value, with their runs (`PriorFinding.outcomes`,
    wall time 0: reusing them costs nothing).

    The values matched are the plan's coarse values and, for a ``min_stable`` question, any value
    between the smallest and largest of them: an earlier study's refine values. Their runs join the
    coarse stage's analysis, so the refine stage (which bisects only between tested values and never
    re-tests one) starts from the narrower bracket they give, and the replicate stage counts their
    seeds (bench/research.py: a second min-stable study on the same store runs 0 of the first's 18-22
    runs again, with the same confirmed answer). A ``best`` question matches its coarse values only: an
    earlier refine midpoint on 2 seeds, ranked among 6-seed values, became the runner-up the
    replicate stage compared the best with, and the closer comparison left answers the first study had
    confirmed unconfirmed (3 of 6 landscape seeds) and one answer moved within the noise."""
    if plan.kind != "research" or plan.sweep is None:
        return []
    identity = config_identity(plan, model)
    wanted = set(plan.sweep.coarse)
    low, high = min(wanted, default=0.0), max(wanted, default=0.0)
    ranged = plan.sweep.goal == "min_stable"
    found: dict[float, PriorFinding] = {}
    for study in store.studies():
        if study.id == study_id or study.kind != "research":
            continue
        for finding in store.findings(study.id):
            try:
                evidence = json.loads(finding.evidence)
            except ValueError:
                continue
            if not isinstance(evidence, dict) or evidence.get("identity") != identity:
                continue
            value = evidence.get("value")
            if not isinstance(value, int | float) or not (
                float(value) in wanted or (ranged and low <= float(value) <= high)
            ):
                continue
            try:
                outcomes = [
                    RunOutcome.model_validate(o).model_copy(
                        update={"wall_s": 0.0, "overhead_s": 0.0, "stage": "prior"}
                    )
                    for o in evidence.get("outcomes", [])
                ]
            except ValueError:
                continue
            if outcomes:
                found[float(value)] = PriorFinding(
                    finding_id=finding.id,
                    study_id=study.id,
                    statement=finding.statement,
                    value=float(value),
                    status=finding.status.value,
                    outcomes=outcomes,
                )
    return [found[v] for v in sorted(found)]


def stored_speed(store: Store, template: str | None, model: str | None) -> tuple[float, int] | None:
    """The median measured wall seconds per episode of the finished training and sweep runs in the
    store on ``template`` with ``model`` (``None``: the embedded one), and how many runs it is over;
    ``None`` when the store has none (runs stored before their config named the model do not count).
    """
    if template is None:
        return None
    wanted = model or EMBEDDED_MODEL
    speeds: list[float] = []
    for study in store.studies():
        experiments = {e.id for e in store.experiments(study.id) if e.template == template}
        if not experiments:
            continue
        for run in store.runs(study.id, status=RunStatus.finished):
            speed = (run.final_metrics or {}).get("seconds_per_episode")
            if (
                run.experiment_id in experiments
                and run.config.get("model") == wanted
                and run.config.get("purpose") in ("train", "sweep")
                and isinstance(speed, int | float)
                and speed > 0
            ):
                speeds.append(float(speed))
    if not speeds:
        return None
    speeds.sort()
    return speeds[len(speeds) // 2], len(speeds)
