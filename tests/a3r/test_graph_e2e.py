"""The whole offline graph end to end against real ``swarm serve`` subprocesses on the embedded model:
plan → code → smoke → training → zero-signal detected → patch → interrupt → approve → client hot-swap on
the same server → report. Asserts the exact node stream, interrupts included, and that approving
creates exactly one experiment (no side effect runs twice when the approval node resumes)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from a3r.graph import PatchReview, RunContext, build_graph, open_checkpointer
from a3r.graph.context import Ledger
from a3r.providers import OfflineProvider, read_params
from memory import ArtifactKind, PatchStatus, RunStatus, Store, StudyStatus

pytestmark = pytest.mark.slow


def _nodes(chunks: list[dict[str, Any]]) -> list[str]:
    return [name for chunk in chunks for name in chunk]


def test_vibe_offline_patch_approval_and_hot_swap(tmp_path: Path) -> None:
    store = Store(tmp_path / "memory.db")
    saver = open_checkpointer(tmp_path / "checkpoints.db")
    ctx = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=Ledger(tmp_path / "checkpoints.db"),
        thread_id="t-e2e",
        root=tmp_path / ".a3r",
        hang_after_s=120.0,
        poll_s=0.5,
        eval_tasks=4,
        server_options={"max-batch-size": 8, "checkpoint-every": 100, "max-staleness": 1},
    )
    graph = build_graph(saver)
    config = {"configurable": {"thread_id": "t-e2e"}}
    request = {
        "request": "train arithmetic with temperature 0",
        "mode": "vibe",
        "overrides": {"steps": 3, "batch_size": 1, "group_size": 2},
    }
    try:
        first = list(graph.stream(request, config, context=ctx, stream_mode="updates", durability="sync"))
        assert _nodes(first) == [
            "planner",
            "coder",
            "runner",
            "analyst",
            "planner",
            "runner",
            "analyst",
            "__interrupt__",
        ]
        (pending,) = first[-1]["__interrupt__"]
        review = pending.value
        assert isinstance(review, PatchReview)
        assert review.file == "workflow.py" and review.actions == ("approve", "reject")
        assert "'temperature': 0.0" in review.diff and "'temperature': 1.0" in review.diff
        study_id = graph.get_state(config).values["study_id"]
        assert len(store.experiments(study_id)) == 1
        assert store.get_patch(review.patch_id).status is PatchStatus.pending

        second = list(
            graph.stream(
                Command(resume="approve"), config, context=ctx, stream_mode="updates", durability="sync"
            )
        )
        assert _nodes(second) == ["approve", "runner", "analyst", "planner", "reporter"]
    finally:
        ctx.close_servers()

    state = graph.get_state(config).values
    assert len(store.experiments(study_id)) == 1
    runs = store.study_runs(study_id)
    assert [r.name for r in runs] == ["smoke", "train-s0", f"train-s0-p{review.patch_id}"]
    assert [r.status for r in runs] == [RunStatus.finished, RunStatus.cancelled, RunStatus.finished]
    # a3r records where each run's server is, and its server's run dir (pool, metrics, a 0600 admin token
    # for the TUI): a3r tui follows every run it starts, live and afterwards
    assert all(r.server_url and r.server_url.startswith("http://127.0.0.1:") for r in runs)
    assert all(r.run_dir and (Path(r.run_dir) / "pool.db").is_file() for r in runs)
    assert all((Path(str(r.run_dir)) / "admin.token").stat().st_mode & 0o777 == 0o600 for r in runs)
    assert store.get_patch(review.patch_id).status is PatchStatus.applied
    workflow_versions = [a for a in store.artifacts(study_id) if a.name == "workflow.py"]
    assert [a.version for a in workflow_versions] == [1, 2]
    ws = Path(state["workspace"])
    assert read_params((ws / "workflow.py").read_text())["temperature"] == 1.0
    assert (
        read_params((ws / "evaluator" / "workflow.py").read_text())["temperature"] == 0.0
    )  # frozen evaluator
    # The client was hot-swapped on the same server: one server start for the whole thread, and the
    # continuation started at the step the server had reached.
    starts = [e for e in store.events(study_id=study_id) if "swarm serve started" in e.message]
    assert len(starts) == 1
    (server_log,) = (ws / "servers").glob("*.server.log")
    assert "(asynchronous, max staleness 1)" in server_log.read_text()  # server options reach the server
    outcomes = state["outcomes"]
    assert outcomes[-1].status == "finished" and outcomes[-1].steps >= 3
    assert [o.reward_patch for o in outcomes] == [None, None, review.patch_id]  # trained on which reward
    # Held-out evaluation with the frozen evaluator before (smoke) and after training.
    assert outcomes[0].eval is not None and outcomes[0].eval.episodes == 8
    assert outcomes[-1].eval is not None and outcomes[-1].eval.tasks == 4
    assert store.metric_history(runs[-1].id, "reward_mean")
    assert any("zero_signal" in f.statement for f in store.findings(study_id))
    assert store.get_study(study_id).status is StudyStatus.concluded
    report = Path(state["report"])
    text = report.read_text()
    assert report.exists() and "temperature" in text
    # The training run was sized to the budget from the smoke run's speed, and the report says so; it
    # leads with the verdict and splits the reward into its parts (arithmetic: format_ok, correct).
    assert state["sizing"].startswith("budget: the smoke run measured") and state["sizing"] in text
    # the verdict's one plain line first, then the conclusion it was read from (issue 34)
    line = text.splitlines()[2]  # under the title: "**Verdict.** <label>: train reward Δ …"
    label, sep, _ = line.removeprefix("**Verdict.** ").partition(": train reward Δ ")
    assert line.startswith("**Verdict.** ") and sep and len(line) - len("**Verdict.** ") <= 160
    assert text.index(f"Derivation: hypothesis {label}: ") < text.index("## Plan")
    # the held-out before/after (smoke evaluation, then after training) is the report's first figure
    assert text.index("![held-out before and after](held_out.png)") < text.index("![reward curves]")
    assert (report.parent / "held_out.png").read_bytes()[:4] == b"\x89PNG"
    # reward parts: one point per step of a run over the episodes the step trained (the server's pool):
    # train-s0 was stopped before a step took its episodes (the kept server trains them later, during
    # the continuation or between the runs, by timing), so its row counts them apart and no part of it
    # has a point of an untrained episode
    assert re.search(r"\| train-s0 \| cancelled \(needs_attention\) \| 1 \| 0 \(\+\d+ untrained\) \|", text)
    assert "| format_ok | seed 0 |" not in text and "| correct | seed 0 |" not in text
    parts = re.findall(r"^\| (?:format_ok|correct) \| seed 0, after patch 1 \| (\d+) \|", text, re.MULTILINE)
    assert all(int(points) <= outcomes[-1].steps for points in parts)
    assert (report.parent / "reward_parts.png").exists() == bool(parts) == ("## Reward parts" in text)
    assert (report.parent / "reward_curves.png").exists()
    assert any(a.kind is ArtifactKind.report for a in store.artifacts(study_id))
    store.close()
