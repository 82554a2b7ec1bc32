"""Graph states and thread contexts for planner tests: a research study whose preflight has run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from a3r.graph import RunContext, RunOutcome
from a3r.graph.context import Ledger
from a3r.providers import OfflineProvider
from a3r.study.analysis import RewardSummary
from a3r.study.sequential import SignalCheck
from memory import Store


def preflight_state(
    store: Store,
    question: str,
    baseline: RewardSummary,
    *,
    reason: str = "",
    signal: SignalCheck | None = None,
) -> dict[str, Any]:
    """The graph state of an offline-planned research ``question`` right after its preflight run ended
    with ``baseline`` (and the sequential test's ``signal``, when it ran)."""
    plan = OfflineProvider().plan(question, mode="research")
    study = store.create_study(question, kind="research")
    pre = RunOutcome(
        key="preflight",
        run_id=1,
        purpose="preflight",
        status="finished",
        reason=reason,
        eval=baseline,
        wall_s=40.0,
        seconds_per_episode=0.5,
        signal=signal,
    )
    return {
        "request": study.question,
        "mode": "research",
        "study_id": study.id,
        "plan": plan,
        "stage": "preflight",
        "outcomes": [pre],
        "queue": [],
    }


def offline_context(tmp_path: Path, store: Store) -> RunContext:
    """A thread context planning offline, with its ledger under ``tmp_path``."""
    return RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=Ledger(tmp_path / "l.db"),
        thread_id="t",
        root=tmp_path,
    )
