"""A vibe thread fitted to its budget from the speed its smoke run measured (`a3r.study.research`
`size_heldout`, `size_training`, `recheck_steps`; `a3r.graph.planner`): the steps asked for are kept by
shrinking the game first, steps are dropped only when even B = 1 does not fit, and the numbers are the
ones measured on the idle 2-core box for `a3r vibe "train who-is-the-spy" --steps 10` (2026-12-02 03:14:
the smoke run took 271 s, its baseline evaluation 209 s for 10 tasks × 2 attempts, 12.8 s per episode;
the old sizing kept B = 2 and ran 9 of the 10 steps)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from langgraph.runtime import Runtime

from a3r.graph import RunOutcome
from a3r.graph.analyst import _spec_of, continuation
from a3r.graph.planner import planner
from a3r.providers import OfflineProvider
from a3r.study.plans import TrainingSettings
from a3r.study.research import (
    SAFETY_SHARE,
    eval_reserve_s,
    initial_queue,
    recheck_steps,
    size_heldout,
    size_training,
)
from a3r.study.runs import RunSpec
from memory import Store
from tests.a3r.planner_states import offline_context

IMPORTED_AT = time.monotonic()
"""When this module was imported (after the test process started)."""

BUDGET = 1800.0
"""The default budget of `a3r vibe` (30 min)."""
SPE = 12.8
"""Seconds per episode the smoke run measured."""


def _smoke(wall_s: float = 271.0, eval_s: float = 209.0) -> RunOutcome:
    return RunOutcome(
        key="smoke",
        run_id=1,
        purpose="smoke",
        status="finished",
        reason="client finished its tasks",
        episodes=4,
        wall_s=wall_s,
        seconds_per_episode=SPE,
        eval_s=eval_s,
    )


def test_the_measured_spy_job_keeps_its_10_steps_in_30_minutes() -> None:
    settings = TrainingSettings(steps=10, batch_size=2, group_size=4)
    reserve = eval_reserve_s(RunSpec(key="train-s0", purpose="train"), [_smoke()], budget_s=BUDGET - 271)
    assert reserve == pytest.approx(276.25)  # 1.25 × 209 s + 15 s
    sizing = size_training(
        settings,
        seconds_per_episode=SPE,
        budget_s=BUDGET - 271,
        reserve_s=reserve,
        margin_s=SAFETY_SHARE * BUDGET,
    )
    assert (sizing.steps, sizing.batch_size) == (10, 1)
    assert sizing.seconds_per_step == pytest.approx(4 * SPE * 1.3)  # ≈ 67 s, against ≈ 133 s at B = 2
    assert 271 + sizing.steps * sizing.seconds_per_step + reserve <= (1 - SAFETY_SHARE) * BUDGET
    assert sizing.note.startswith("budget: B 2 → 1 so the 10 steps fit")
    assert "12.8 s per episode" in sizing.note and "180 s safety margin" in sizing.note
    assert "at B = 2 they would need ≈ 1,331 s" in sizing.note


def test_the_held_out_evaluation_is_sized_in_the_smoke_run() -> None:
    settings = TrainingSettings(steps=10, batch_size=2, group_size=4)
    # 10 % of the budget at 12.8 s per episode pays for 7 tasks × 2 attempts (≈ 179 s), not the 10 tasks
    # (209 s) the old 15 % share paid for.
    heldout = size_heldout(
        settings, seconds_per_episode=SPE, budget_s=BUDGET, time_left_s=BUDGET - 60, samples=2, max_tasks=16
    )
    assert heldout.tasks == 7 and heldout.seconds == pytest.approx(7 * 2 * SPE)
    assert "7 tasks × 2 attempts before and after training" in heldout.note
    # Little time left: it shrinks to make room for the 10 steps at B = 1, never below 4 tasks.
    squeezed = size_heldout(
        settings, seconds_per_episode=SPE, budget_s=BUDGET, time_left_s=1100, samples=2, max_tasks=16
    )
    assert squeezed.tasks == 4 and "shrunk from 7 so that 10 steps at B = 1 still fit" in squeezed.note
    assert (
        size_heldout(
            settings, seconds_per_episode=SPE, budget_s=BUDGET, time_left_s=1740, samples=2, max_tasks=3
        ).tasks
        == 3
    )
    unmeasured = size_heldout(
        settings, seconds_per_episode=float("nan"), budget_s=BUDGET, time_left_s=1740, samples=2, max_tasks=16
    )
    assert unmeasured.tasks == 16 and "no speed measured" in unmeasured.note


def test_a_budget_where_no_game_fits_drops_steps_and_says_so() -> None:
    settings = TrainingSettings(steps=10, batch_size=2, group_size=4)
    budget = 600.0  # a 10-minute budget: 10 steps of 67 s do not fit even at B = 1
    sizing = size_training(
        settings,
        seconds_per_episode=SPE,
        budget_s=budget - 120,
        reserve_s=100,
        margin_s=SAFETY_SHARE * budget,
    )
    assert sizing.batch_size == 1 and sizing.steps == 4  # (480 − 60 − 100 − 20) s / 66.6 s per step
    assert "do not fit even at B = 1" in sizing.note and "training runs 4 of the 10 steps" in sizing.note
    # Two seeds share the budget: each run gets half of it.
    two = size_training(settings, seconds_per_episode=SPE, budget_s=1529, reserve_s=276, margin_s=180, runs=2)
    assert (two.steps, two.batch_size) == (5, 1) and "/ 2 seeds" in two.note
    # The re-check after measured steps: on track → nothing; late → the step the budget stops at.
    assert recheck_steps(step=1, target=10, seconds_per_step=66.0, time_left_s=700) is None
    late = recheck_steps(step=2, target=10, seconds_per_step=90.0, time_left_s=600)
    assert late is not None and "stop training at about step 8 of 10" in late
    assert "an estimate: the pace so far includes the first step's trainer start" in late  # fresh-s5 #14
    last = recheck_steps(step=9, target=10, seconds_per_step=90.0, time_left_s=60)
    assert last is not None and "so the 1 step left needs ≈ 90 s" in last  # not "the 1 steps left need"


def test_the_planner_sizes_the_game_after_the_smoke_run_and_the_plan_says_so(tmp_path: Path) -> None:
    store = Store(tmp_path / "m.db")
    ctx = offline_context(tmp_path, store)
    ctx.budget_s = BUDGET
    plan = OfflineProvider().plan("train who-is-the-spy", mode="vibe")
    plan = plan.model_copy(update={"training": plan.training.model_copy(update={"steps": 10})})
    assert (plan.training.batch_size, plan.training.group_size) == (2, 4)
    study = store.create_study("train who-is-the-spy", kind="vibe")
    state = {
        "request": study.question,
        "mode": "vibe",
        "study_id": study.id,
        "plan": plan,
        "outcomes": [_smoke()],
        "queue": initial_queue(plan)[1:],
    }
    command = planner(state, Runtime(context=ctx))  # type: ignore[arg-type]
    assert command.goto == "runner"
    update = command.update
    assert isinstance(update, dict)
    (train,) = update["queue"]
    assert (train.settings.steps, train.settings.batch_size, train.settings.group_size) == (10, 1, 4)
    assert (update["plan"].training.steps, update["plan"].training.batch_size) == (10, 1)
    assert update["sizing"].startswith("budget: B 2 → 1 so the 10 steps fit")
    assert any(e.message == update["sizing"] for e in store.events(study_id=study.id))
    # A continuation after a patch trains the sized game, not the plan's first one.
    finished = RunOutcome(key="train-s0", run_id=2, purpose="train", status="finished", reason="", steps=10)
    follow = continuation(finished, _spec_of({**state, **update}, finished), suffix="p1", early_stop=False)
    assert (follow.settings.batch_size, follow.settings.steps) == (1, 20)
    store.close()


def test_the_threads_time_around_its_runs_counts_against_the_budget(tmp_path: Path) -> None:
    """Found by a fresh user: an 8-minute job ended 14 s past its budget, since only the runs' own wall
    time was counted. Now the runner gives a run the budget less the thread's time so far (planning,
    code check, analysis before it: ``overhead_s``; what the executor spends after the run's wall time,
    such as its server's stop) and less `WRAP_UP_S` for the report; the report states the thread's time
    against the budget and says an overrun."""
    from a3r.graph.reporter import reporter
    from a3r.graph.runner import runner
    from a3r.study.analysis import RewardSummary
    from a3r.study.research import WRAP_UP_S, budget_note, spent_s
    from tests.a3r.planner_states import preflight_state

    store = Store(tmp_path / "m.db")
    baseline = RewardSummary(tasks=4, episodes=16, mean_reward=0.4, pass_at_1=0.4, pass_at_2=0.5)
    state = preflight_state(store, "lr 1e-4 vs 1e-3 on arithmetic", baseline)  # its preflight took 40 s
    spec = RunSpec(key="coarse-lr=0.0001-s0", purpose="sweep", stage="coarse", value=1e-4)
    state |= {"queue": [spec], "workspace": str(tmp_path / "ws"), "hypothesis_ids": []}
    given: list[float] = []

    def execute(spec: RunSpec, *, budget_s: float, **_: object) -> RunOutcome:
        given.append(budget_s)
        time.sleep(0.5)  # 0.1 s of run, then e.g. the server's stop after the outcome's wall time was taken
        return RunOutcome(key=spec.key, run_id=2, purpose="sweep", status="finished", reason="", wall_s=0.1)

    ctx = offline_context(tmp_path, store)
    ctx.budget_s, ctx.execute = 480.0, execute  # type: ignore[assignment]
    ctx.clock_mark = time.monotonic() - 30.0  # 30 s of planning and analysis since the preflight ended
    done = runner(state, Runtime(context=ctx))  # type: ignore[arg-type]
    (outcome,) = done["outcomes"]  # type: ignore[misc]
    assert given[0] == pytest.approx(480.0 - WRAP_UP_S - 40.0 - 30.0, abs=2.0)  # was 440 s: 480 − 40
    assert 30.4 <= outcome.overhead_s < 32.0  # before it, and the 0.4 s after its wall time
    assert spent_s([*state["outcomes"], outcome]) == pytest.approx(40.0 + 0.1 + outcome.overhead_s)
    # The report says the thread's time against its budget, and an overrun as one.
    around = outcome.overhead_s
    assert budget_note([outcome], wrap_up_s=5.0, budget_s=480.0) == (
        f"time: {0.1 + around + 5:.0f} s of the 480 s budget (runs 0 s, the command's start-up, planning, code "
        f"check, analysis and server stops around them {around:.0f} s, server stops before the report 5 s)"
    )
    late = outcome.model_copy(update={"wall_s": 460.0})
    assert budget_note([late], wrap_up_s=4.0, budget_s=480.0).endswith(": over the budget by 14 s")
    state |= {"outcomes": [*state["outcomes"], outcome], "queue": [], "conclusion": "stopped: for the test"}
    ctx.clock_mark = time.monotonic() - 3.0  # the servers' stop after the last run
    path = Path(reporter(state, Runtime(context=ctx))["report"])  # type: ignore[arg-type]
    line = next(x for x in path.read_text().splitlines() if x.startswith("- time: "))
    total = float(line.removeprefix("- time: ").split(" s of")[0])
    assert total == pytest.approx(40.1 + around + 3, abs=1) and "480 s budget (runs 40 s, " in line


def test_a_commands_budget_counts_from_the_process_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fresh user's overrun included importing a3r (7–10 s on the loaded 2-core box) before the
    first node: `a3r vibe` / `research` / `resume` count the thread's time from the process's start
    when the process is the ``a3r`` command, and from now when the command runs inside another process
    (this test's, a ``CliRunner``'s: its process started long before)."""
    from a3r.app.commands import command_started

    before = time.monotonic()
    assert before <= command_started() <= time.monotonic()  # pytest's process is not the command
    monkeypatch.setattr(sys, "argv", ["/venv/bin/a3r", "vibe", "train arithmetic"])
    started = command_started()
    assert started <= IMPORTED_AT <= time.monotonic()  # before this test module (and a3r) was imported
    assert time.monotonic() - started < 24 * 3600
    monkeypatch.setattr(sys, "argv", [str(Path("/repo/a3r/app/cli.py")), "research", "x"])  # python -m
    assert command_started() <= IMPORTED_AT


def test_a_vibe_dry_run_over_its_budget_warns_as_a_research_one_does(tmp_path: Path) -> None:
    """Found by a fresh user: ``a3r vibe "train who-is-the-spy with 6 players" --dry-run --budget-minutes
    0.1`` printed "estimated time: ≈ 44 min … budget 0.1 min" and no warning."""
    from typer.testing import CliRunner

    from a3r.app.cli import app

    def dry(budget: str) -> str:
        common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
        result = CliRunner().invoke(
            app, ["vibe", "train who-is-the-spy with 6 players", "--budget-minutes", budget, *common]
        )
        assert result.exit_code == 0, result.output
        return result.output

    (tiny,) = [line for line in dry("0.1").splitlines() if "warning" in line]
    assert tiny.startswith(
        "  warning: the estimate exceeds the budget of 0.1 min at this speed: the smoke run alone needs ≈ "
    )
    assert "so the budget would stop the thread before it trains" in tiny
    (fitted,) = [line for line in dry("10").splitlines() if "warning" in line]
    assert fitted.endswith("fitted to the budget: a smaller B first, fewer steps only if B = 1 does not fit")
    assert "warning" not in dry("600")
