"""The runner: executes the head of the queue (`a3r.swarmops.execution.execute_run`) and records the run;
the head runs of one sweep stage that can be LoRA tenants run together on one server
(`a3r.swarmops.tenancy.execute_stage`, unless ``--no-tenants``), each recorded as a single run is.

Idempotent on re-run: the store run is got-or-created by the spec's key; a finished run's outcome is
kept in the ledger and returned instead of running again; a run a killed a3r left ``running`` is
continued (same server run dir and client state dir, so the server resumes from its checkpoint and
the client skips the episodes it already ended).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from langgraph.runtime import Runtime

import templates
from a3r.graph.context import RunContext
from a3r.graph.records import ensure_experiment, ensure_run
from a3r.graph.state import ResearchState, first_hypothesis
from a3r.providers.offline import read_params
from a3r.study.research import eval_reserve_s
from a3r.study.runs import STORE_STATUS, RunOutcome, RunSpec, episodes_text
from a3r.study.settings import value_text
from a3r.study.wording import counted
from a3r.swarmops.execution import Workspace
from a3r.swarmops.tenancy import execute_stage, stage_runs
from memory import RunPublic, RunStatus

__all__ = ["experiment_name", "runner", "variant_workspace"]


def experiment_name(state: ResearchState, spec: RunSpec) -> tuple[str, int | None]:
    """Experiment of a run (and the hypothesis it tests): one per swept value, one for training."""
    plan = state["plan"]
    if spec.purpose == "preflight":
        return "preflight-baseline", None
    if spec.purpose == "sweep" and plan.sweep is not None and spec.value is not None:
        shown = value_text(plan.sweep.variable, plan.template, spec.value)
        return f"{plan.sweep.variable}={shown}", first_hypothesis(state)
    return f"{plan.template or 'generated'}-train", first_hypothesis(state)


def variant_workspace(ws: Workspace, params: Mapping[str, object]) -> Workspace:
    """The workspace a run with template-parameter overrides trains in (a study varying a template
    knob): ``<workspace>/variants/<name=value,...>/``, a copy of the study's files whose
    ``workflow.py`` has ``params`` substituted into its ``PARAMS``; ``evaluator/`` links to the frozen
    original, so held-out evaluation is the same for every configuration. Made once (``workflow.py``
    is written last, so a copy cut short by a crash is redone).

    Raises:
        ValueError: The study's workflow has no ``# <params>`` block.
    """
    name = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    root = ws.root / "variants" / re.sub(r"[^A-Za-z0-9_.=,+-]", "_", name)[:120]
    if (root / "workflow.py").exists():
        return Workspace(root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for item in ws.root.iterdir():
        if item.name in _NOT_COPIED or item.name.startswith((".", "__")):
            continue
        if item.is_dir():
            shutil.copytree(item, root / item.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(item, root / item.name)
    (root / "evaluator").symlink_to(ws.root / "evaluator", target_is_directory=True)
    record = root / "params.json"  # the rendered parameters: the variant's, not the study's
    if record.is_file():
        rendered = json.loads(record.read_text(encoding="utf-8"))
        if isinstance(rendered.get("params"), dict):
            rendered["params"] = {**rendered["params"], **params}
            record.write_text(json.dumps(rendered, indent=2), encoding="utf-8")
    source = ws.workflow.read_text(encoding="utf-8")
    new = templates.substitute_params(source, {**read_params(source), **params})
    (root / "workflow.py").write_text(new, encoding="utf-8")
    return Workspace(root)


_NOT_COPIED = {"runs", "servers", "variants", "evaluator", "workflow.py"}


def _final_metrics(outcome: RunOutcome) -> dict[str, float]:
    values = {f"train/{k}": v for k, v in outcome.final_metrics.items()}
    for prefix, summary in (("eval", outcome.eval), ("episodes", outcome.train)):
        if summary is not None:
            values |= {
                f"{prefix}/mean_reward": summary.mean_reward,
                f"{prefix}/pass_at_1": summary.pass_at_1,
                f"{prefix}/pass_at_2": summary.pass_at_2,
            }
    values["steps"] = float(outcome.steps)
    values["wall_s"] = outcome.wall_s
    values["seconds_per_episode"] = outcome.seconds_per_episode  # the dry runs' stored speed (nan: none)
    return {k: v for k, v in values.items() if math.isfinite(v)}


def _cap_note(spec: RunSpec, queue: list[RunSpec]) -> str:
    """Why a smoke run with training after it may use the whole budget left: it is not capped, because
    its held-out baseline (the "before" of the verdict) is sized after its episodes, from their
    measured speed, to leave room for the planned steps (`a3r.study.research.size_heldout`); the
    sizing after it says what is left for training."""
    if spec.purpose != "smoke" or not any(q.purpose == "train" for q in queue):
        return ""
    return (
        " (not capped: its held-out baseline is sized from its measured speed to leave room for training; "
        "the sizing after it says what is left)"
    )


def runner(state: ResearchState, runtime: Runtime[RunContext]) -> dict[str, object]:
    """Run the first queued spec, or the queue's head runs of one sweep stage together as LoRA tenants of
    one server (`a3r.swarmops.tenancy`); return the rest of the queue and the outcomes."""
    ctx = runtime.context
    queue = list(state.get("queue") or [])
    stage = _tenant_stage(queue, ctx)
    if stage:
        return _run_stage(state, ctx, stage, queue[len(stage) :])
    spec = queue.pop(0)
    key = ctx.key("runner", spec.key)
    cached = ctx.ledger.get(key)
    if cached is not None:
        return {"queue": queue, "outcomes": [RunOutcome.model_validate(cached)], "ran": 1}
    run = _store_run(state, ctx, spec)
    # the thread's time since the previous run (planning, code check, analysis) counts as this run's
    # overhead; WRAP_UP_S stays free for stopping the servers and writing the report after the last run
    started = time.monotonic()
    before_s = max(0.0, started - ctx.clock_mark)
    budget_left = ctx.budget_left_s(state.get("outcomes", []), now=started)
    ws = Workspace(Path(state["workspace"]))
    if budget_left <= 0:
        outcome = _spent(spec, run.id)
    else:
        ctx.say(
            f"runner: {spec.key} ({spec.purpose}) — budget left {budget_left:.0f} s{_cap_note(spec, queue)}"
        )
        reserve = eval_reserve_s(spec, state.get("outcomes", []), budget_s=budget_left)
        if spec.params:
            ws = variant_workspace(ws, spec.params)
        outcome = ctx.execute(
            spec, ctx=ctx, ws=ws, run_id=run.id, budget_s=budget_left, eval_reserve_s=reserve
        )
    # and so does what the executor spent after the run's wall time was taken (stopping its server)
    after_s = max(0.0, time.monotonic() - started - outcome.wall_s)
    outcome = outcome.model_copy(update={"overhead_s": before_s + after_s})
    ctx.clock_mark = time.monotonic()
    line = _record(ctx, key, run.id, spec, outcome)
    return {"queue": queue, "outcomes": [outcome], "ran": 1, "log": [line]}


def _tenant_stage(queue: list[RunSpec], ctx: RunContext) -> list[RunSpec]:
    """The queue's head runs that run together as tenants (`a3r.swarmops.tenancy.stage_runs`): only
    with tenants on and the real executor (`RunContext.serving`; a simulated one, ``bench/research.py``,
    runs one at a time). The stage's price sees the same (`a3r.study.price.stage_s`)."""
    if not ctx.serving().tenants:
        return []
    return stage_runs(queue, ctx.server_options)


def _store_run(state: ResearchState, ctx: RunContext, spec: RunSpec) -> RunPublic:
    """The run's store record (got or created under its experiment); a run a killed a3r left running is
    noted as continued."""
    name, hypothesis_id = experiment_name(state, spec)
    experiment_id = ensure_experiment(
        ctx, state["study_id"], name, template=state["plan"].template, hypothesis_id=hypothesis_id
    )
    run = ensure_run(ctx, experiment_id, spec)
    if run.status is RunStatus.running and ctx.store.events(run_id=run.id, limit=1):
        ctx.store.log_event(
            f"run {spec.key}: continuing after an interruption", run_id=run.id, level="warning"
        )
    return run


def _spent(spec: RunSpec, run_id: int) -> RunOutcome:
    """The outcome of a run the thread's budget left no time for."""
    return RunOutcome(
        **spec.outcome_fields(),
        run_id=run_id,
        status="budget",
        reason="the thread's wall-time budget is spent",
    )


def _record(ctx: RunContext, key: str, run_id: int, spec: RunSpec, outcome: RunOutcome) -> str:
    """Finish the store run (unless it already ended), log its line and keep its outcome in the ledger;
    returns the line."""
    if ctx.store.get_run(run_id).status is RunStatus.running:
        ctx.store.finish_run(
            run_id,
            status=STORE_STATUS[outcome.status],
            final_metrics=_final_metrics(outcome),
            error=None if outcome.status == "finished" else f"{outcome.status}: {outcome.reason}"[:2000],
        )
    tenant = f", tenant of server {outcome.tenant_server}" if outcome.tenant_server else ""
    line = f"runner: {spec.key} {outcome.status}: {outcome.reason} (steps {outcome.steps}, train episodes {episodes_text(outcome)}, {outcome.wall_s:.0f} s{tenant})"
    ctx.store.log_event(line, run_id=run_id, level="info" if outcome.status == "finished" else "warning")
    ctx.say(line)
    ctx.ledger.put(key, outcome.model_dump())
    return line


def _run_stage(
    state: ResearchState, ctx: RunContext, stage: list[RunSpec], queue: list[RunSpec]
) -> dict[str, object]:
    """Run a sweep stage's runs side by side as tenants of one server (`execute_stage`) and record each
    as a single run is recorded. The stage's budget is shared: each run may take all of it; the thread
    counts the stage's wall time once (`RunOutcome.shared_s`)."""
    outcomes: list[RunOutcome] = []
    todo: list[tuple[RunSpec, int]] = []
    for spec in stage:
        cached = ctx.ledger.get(ctx.key("runner", spec.key))
        if cached is not None:
            outcomes.append(RunOutcome.model_validate(cached))
        else:
            todo.append((spec, _store_run(state, ctx, spec).id))
    started = time.monotonic()
    before_s = max(0.0, started - ctx.clock_mark)
    budget_left = ctx.budget_left_s([*state.get("outcomes", []), *outcomes], now=started)
    ws = Workspace(Path(state["workspace"]))
    if not todo:
        fresh: list[RunOutcome] = []
    elif budget_left <= 0:
        fresh = [_spent(spec, run_id) for spec, run_id in todo]
    else:
        ctx.say(
            f"runner: stage {todo[0][0].stage}: {counted(len(todo), 'runs')} as tenants of one server — "
            f"budget left {budget_left:.0f} s, shared"
        )
        # made here, one after another: the runs' threads must not copy one variant at once
        spaces = {spec.key: variant_workspace(ws, spec.params) if spec.params else ws for spec, _ in todo}
        fresh = execute_stage(
            [spec for spec, _ in todo],
            ctx=ctx,
            workspace=lambda spec: spaces[spec.key],
            run_ids=[run_id for _, run_id in todo],
            servers=ws.root / "servers",
            budget_s=budget_left,
            eval_reserve_s=eval_reserve_s(todo[0][0], state.get("outcomes", []), budget_s=budget_left),
            max_tenants=ctx.tenants.max_tenants,
        )
    # the stage's time: at least the wall its server measured (`RunOutcome.tenant_stage`)
    elapsed = max([time.monotonic() - started, *(o.tenant_stage.wall_s for o in fresh if o.tenant_stage)])
    lines = []
    longest = max(range(len(fresh)), key=lambda i: fresh[i].wall_s, default=-1)
    for i, ((spec, run_id), outcome) in enumerate(zip(todo, fresh, strict=True)):
        # the longest run carries the stage's time (and the time around it); the others ran beside it
        update = (
            {"overhead_s": before_s + max(0.0, elapsed - outcome.wall_s)}
            if i == longest
            else {"shared_s": outcome.wall_s}
        )
        outcome = outcome.model_copy(update=update)
        outcomes.append(outcome)
        lines.append(_record(ctx, ctx.key("runner", spec.key), run_id, spec, outcome))
    ctx.clock_mark = time.monotonic()
    order = {spec.key: i for i, spec in enumerate(stage)}
    outcomes.sort(key=lambda o: order[o.key])
    return {"queue": queue, "outcomes": outcomes, "ran": len(outcomes), "log": lines}
