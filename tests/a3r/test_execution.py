"""The run monitor tells a hung run (nothing moves) from a slow one (episodes keep coming), against a
real training server, with real ``swarm run`` client subprocesses."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from a3r.graph import RunContext, RunSpec
from a3r.graph.context import Ledger
from a3r.providers import OfflineProvider
from a3r.study.plans import TrainingSettings
from a3r.study.runs import Resizing
from a3r.swarmops.execution import Workspace, execute_run
from memory import Store

pytestmark = pytest.mark.slow


def _workspace(tmp_path: Path, body: str) -> Workspace:
    ws = tmp_path / "ws"
    ws.mkdir()
    code = "import asyncio\n\n\nasync def run(task, llm):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    (ws / "workflow.py").write_text(code + "\n")
    (ws / "tasks.jsonl").write_text(
        "".join(json.dumps({"id": f"{ws.parent.name}-t{i}", "value": i % 2}) + "\n" for i in range(40))
    )
    return Workspace(ws)


def _run(tmp_path: Path, server: Any, body: str, key: str, hang_after_s: float) -> Any:
    store = Store(tmp_path / "memory.db")
    study = store.create_study("monitor")
    run = store.start_run(store.create_experiment(study.id, "e").id, name=key)
    ctx = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=Ledger(tmp_path / "ledger.db"),
        thread_id=key,
        root=tmp_path,
        server_url=server.url,
        hang_after_s=hang_after_s,
        poll_s=0.3,
    )
    spec = RunSpec(
        key=key,
        purpose="train",
        settings=TrainingSettings(steps=1, batch_size=1, group_size=2, concurrency=2),
    )
    outcome = execute_run(spec, ctx=ctx, ws=_workspace(tmp_path, body), run_id=run.id, budget_s=240)
    events = [e.message for e in store.events(run_id=run.id)]
    store.close()
    return outcome, events


def test_a_run_where_nothing_moves_is_hung(tmp_path: Path, tokenizer: Any, tiny_model: Any) -> None:
    import copy

    from swarm.engine import HFEngine
    from tests.conftest import make_server

    # A server of its own: the frozen episodes stay open on it until its episode timeout.
    engine = HFEngine(copy.deepcopy(tiny_model), tokenizer, "tiny-frozen")
    server = make_server(tmp_path / "server", engine)
    try:
        outcome, _ = _run(tmp_path, server, "await asyncio.sleep(3600)\nreturn 0.0", "frozen", 6.0)
    finally:
        server.stop()
        engine.close()
    assert outcome.status == "hung"
    assert "no progress" in outcome.reason and outcome.episodes == 0


def test_a_slow_run_is_not_hung(tmp_path: Path, trainable_server: Any) -> None:
    # Each episode takes 3 s and a step needs several: longer than the hang window without a step (the
    # "slow" note), yet episodes keep finishing within it, so the run is slow, not hung, and reaches its step.
    body = """
        client = llm.openai(max_retries=0)
        await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        await asyncio.sleep(3.0)
        return float(task["value"])
    """
    outcome, events = _run(tmp_path, trainable_server, body, "slow", 6.0)
    assert outcome.status == "finished", outcome.reason
    assert outcome.reason.startswith("reached step")
    assert outcome.episodes >= 2
    assert any("slow, not hung" in e for e in events)
    # Progress per trainer step (the shared server may have trained before: "step k/target").
    assert any(re.search(r": step \d+/\d+ .*episodes of this run", e) for e in events)


_ONE_CALL = """
    client = llm.openai(max_retries=0)
    await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    return float(task["value"])
"""


def _own_server_run(
    tmp_path: Path, spec: RunSpec, *, budget_s: float, eval_reserve_s: float
) -> tuple[Any, Workspace, Store, int]:
    """Run ``spec`` on a server a3r starts (the embedded model), with a frozen evaluator and 4 held-out
    tasks; returns the outcome, the workspace, the (open) store and the store run id."""
    ws = _workspace(tmp_path, _ONE_CALL)
    (ws.root / "evaluator").mkdir()
    (ws.root / "evaluator" / "workflow.py").write_text(ws.workflow.read_text())
    (ws.root / "heldout.jsonl").write_text(
        "".join(json.dumps({"id": f"h{i}", "value": i % 2}) + "\n" for i in range(4))
    )
    store = Store(tmp_path / "memory.db")
    run = store.start_run(store.create_experiment(store.create_study("budget").id, "e").id, name=spec.key)
    ctx = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=Ledger(tmp_path / "ledger.db"),
        thread_id=spec.key,
        root=tmp_path,
        hang_after_s=120.0,
        poll_s=0.5,
        eval_tasks=2,
        eval_samples=2,
    )
    try:
        outcome = execute_run(
            spec, ctx=ctx, ws=ws, run_id=run.id, budget_s=budget_s, eval_reserve_s=eval_reserve_s
        )
    finally:
        ctx.close_servers()
    return outcome, ws, store, run.id


def test_a_budget_stop_keeps_time_for_the_held_out_evaluation(tmp_path: Path) -> None:
    # A server a3r starts (the embedded model), a step target the budget cannot reach: training stops
    # `eval_reserve_s` before the budget ends, the server trains no further step, and the held-out
    # evaluation still runs.
    spec = RunSpec(
        key="b",
        purpose="train",
        server_key="b",
        settings=TrainingSettings(steps=1000, batch_size=1, group_size=2, concurrency=2),
    )
    outcome, ws, store, run_id = _own_server_run(tmp_path, spec, budget_s=75, eval_reserve_s=45)
    assert outcome.status == "budget", outcome.reason
    assert outcome.eval is not None and outcome.eval.episodes == 4 and outcome.eval_s > 0
    assert sorted(outcome.eval.task_rewards) == ["h0", "h1"]  # per task, to compare runs on the same tasks
    assert outcome.wall_s < 75 + 30  # the evaluation fitted in its reserve (plus the server's stop)
    server_dir = ws.server_dir("b")
    metrics = server_dir / "metrics.jsonl"  # absent when no step ran (a heavily loaded machine)
    trained = (
        [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )
    assert max(trained, default=0) == outcome.steps  # no step after the budget stop went unrecorded
    checkpoints = sorted(p.name for p in (server_dir / "checkpoints").glob("step-*"))
    assert checkpoints[-1:] == [f"step-{outcome.steps:06d}"] or outcome.steps == 0
    notes = [e.message for e in store.events(run_id=run_id)]
    assert any("held-out evaluation on 2 of 4 held-out tasks × 2 attempts" in n for n in notes)
    # After its second measured step the run re-checks its budget: 1,000 steps do not fit in 30 s.
    rechecks = [n for n in notes if "re-check after step" in n]
    assert len(rechecks) == (1 if outcome.steps >= 2 else 0)
    assert all("the budget will stop training at about step" in n for n in rechecks)
    store.close()


def test_a_sweep_run_the_budget_stopped_before_its_first_step_runs_no_held_out_evaluation(
    tmp_path: Path,
) -> None:
    # the H200 re-run (issue 33): coarse-batch_size=2-s1, cancelled at step 0, still evaluated the
    # untrained model on 16 tasks × 2 attempts (~35 s of the budget); the preflight already measured it
    spec = RunSpec(
        key="coarse-batch_size=1-s1",
        purpose="sweep",
        stage="coarse",
        value=1.0,
        seed=1,
        server_key="s",
        settings=TrainingSettings(steps=1000, batch_size=1, group_size=2, concurrency=2),
    )
    outcome, _, store, run_id = _own_server_run(tmp_path, spec, budget_s=40, eval_reserve_s=39.5)
    assert outcome.status == "budget" and outcome.steps == 0, outcome.reason
    assert outcome.eval is None and not outcome.eval_s > 0
    notes = [e.message for e in store.events(run_id=run_id)]
    assert not any("held-out evaluation on" in n for n in notes)
    assert any("held-out evaluation skipped: no step trained" in n for n in notes)
    store.close()


def test_a_sized_run_re_plans_back_up_to_the_steps_and_b_asked_for(tmp_path: Path) -> None:
    """Issue 33 (4): the README's main job on a busy box was sized to 3 of its 10 steps at B = 1 by a slow
    smoke run, then its steps ran faster and the thread ended at 710 s of its 1,800 s. A sized run now
    re-plans after every step from its measured step time: here 2 steps at B = 1, asked 4 at B = 2, with
    ample time, train all 4 and B goes back up."""
    spec = RunSpec(
        key="r",
        purpose="train",
        server_key="r",
        settings=TrainingSettings(steps=2, batch_size=1, group_size=2, concurrency=2),
        resize=Resizing(asked_steps=4, asked_batch_size=2),
    )
    outcome, _, store, run_id = _own_server_run(tmp_path, spec, budget_s=400, eval_reserve_s=40)
    notes = [e.message for e in store.events(run_id=run_id)]
    store.close()
    replans = [n for n in notes if "re-plan after step" in n]
    assert outcome.status == "finished" and outcome.steps == 4, (outcome.reason, notes)
    assert replans and "(all asked for)" in replans[0] and any("B 1 → 2" in n for n in replans)


def test_a_step_rows_time_stamp_is_not_logged_as_a_metric() -> None:
    """Found by a fresh user: ``created_at`` (the row's Unix time) was logged as a metric of every step."""
    from a3r.swarmops.execution import _numeric
    from swarm.protocol import ServerStepMetrics

    row = ServerStepMetrics(
        step=1, samples=2, episodes=2, tokens=10, adv_mean=0.0, adv_std=1.0, adv_min=-1.0, adv_max=1.0,
        loss=0.1, policy_loss=0.1, clip_frac=0.0, entropy=1.0, grad_norm=1.0, grad_norm_max=1.0,
        ratio_mean=1.0, logprob_drift_mean=0.0, logprob_drift_max=0.0, lr=1e-5, updates=1,
        micro_batches=1, created_at=1764900000.5,
    )  # fmt: skip
    values = _numeric(row)
    assert "created_at" not in values and "step" not in values
    assert values["loss"] == 0.1 and values["completion_tokens_mean"] == 5.0
