"""Fixtures of the TUI tests: a real SQLite store seeded with one study (plan, runs with metric
histories, events, a code artifact, pending patches, a finding), and a helper to run the app headless.

Each test gets its own store file, so approvals in one test never leak into another.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from a3r.app.tui import TuiConfig
from memory import RunStatus, Store

REWARD_PY = "def reward(answer, target):\n    return float(answer == target)\n"
REWARD_DIFF = """\
--- a/reward.py
+++ b/reward.py
@@ -1,2 +1,3 @@
 def reward(answer, target):
-    return float(answer == target)
+    # partial credit: numbers within 1% count
+    return float(abs(float(answer) - float(target)) <= 0.01 * abs(float(target)))
"""
EPISODE_CITED = "ep-" + "0a1b2c3d" * 4


@dataclass(frozen=True)
class Seeded:
    """Ids of the seeded records."""

    path: Path
    study_id: int
    other_study_id: int
    run_ids: tuple[int, int]
    hypothesis_id: int
    patch_id: int
    second_patch_id: int
    finding_id: int


def seed(store: Store, path: Path) -> Seeded:
    study = store.create_study("Does a KL penalty prevent collapse on countdown?")
    other = store.create_study("Is partial credit better than exact match on arithmetic?", kind="vibe")
    h = store.register_hypothesis(
        study.id,
        statement="KL 0.05 keeps held-out accuracy within 2 points",
        expected_outcome="no drop below baseline - 2",
        decision_rule="3 of 3 seeds",
    )
    exp = store.create_experiment(study.id, "kl-0.05", hypothesis_id=h.id, template="countdown")
    runs = []
    for seed_value, rewards in ((0, [0.1, 0.2, 0.35, 0.5]), (1, [0.1, 0.05, 0.0, 0.0])):
        run = store.start_run(exp.id, seed=seed_value, config={"kl_coef": 0.05}, name=f"kl-seed{seed_value}")
        for step, reward in enumerate(rewards):
            store.log_metrics(run.id, step=step, metrics={"reward/mean": reward, "kl": 0.01 * step})
        runs.append(run.id)
    store.finish_run(runs[1], status=RunStatus.failed, error="reward collapsed to 0")
    store.log_event("planned 1 experiment", study_id=study.id)
    store.log_event("run collapsed", run_id=runs[1], level="warning")
    artifact = store.add_artifact(study.id, "reward", "reward.py", REWARD_PY)
    patch = store.propose_patch(
        artifact.id,
        diff=REWARD_DIFF,
        rationale=(
            f"Run {runs[1]} collapsed (reward/mean 0.0 from step 2) while run {runs[0]} learned; "
            f"episode {EPISODE_CITED} shows a correct answer '12.0' scored 0 against '12'."
        ),
    )
    second = store.propose_patch(artifact.id, diff=REWARD_DIFF, rationale="Same fix, other wording.")
    finding = store.add_finding(
        study.id,
        statement="Exact-match reward gives zero signal on decimal answers",
        confidence=0.7,
        evidence="run 2 collapsed",
        run_ids=[runs[1]],
        seeds=[1],
    )
    return Seeded(path, study.id, other.id, (runs[0], runs[1]), h.id, patch.id, second.id, finding.id)


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "memory.db") as opened:
        yield opened


@pytest.fixture()
def seeded(store: Store, tmp_path: Path) -> Seeded:
    return seed(store, tmp_path / "memory.db")


@pytest.fixture()
def config() -> TuiConfig:
    """Fast polling so that tests see refreshes quickly."""
    return TuiConfig(refresh_s=0.5, reviewer="ada", request_timeout_s=5.0)


async def wait_for(pilot: Pilot[None], predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Let the app run until ``predicate()`` is truthy; fail with the predicate's source after the timeout."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"condition not met within {timeout_s}s: {inspect.getsource(predicate).strip()}"
            )
        await pilot.pause(0.05)


def cells(app: App[None], selector: str) -> list[list[str]]:
    """Plain text of every row of a `DataTable` of the current screen."""
    table: DataTable[object] = app.screen.query_one(selector, DataTable)
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def text_of(app: App[None], selector: str) -> str:
    """Plain text a `Static` of the current screen shows."""
    from rich.console import Console

    static = app.screen.query_one(selector, Static)
    console = Console(width=200, record=True, color_system=None)
    console.print(static.content)
    return console.export_text()
