"""bench/research.py: the staged research graph on simulated landscapes (a couple of seeds, seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from research import LANDSCAPES, run_study  # type: ignore[import-not-found]


@pytest.mark.parametrize("name", ["min-stable-batch", "best-lr"])
def test_staged_study_finds_the_answer_with_fewer_runs_than_the_grid(tmp_path: Path, name: str) -> None:
    landscape = LANDSCAPES[name]
    for seed in (0, 1):
        result = run_study(landscape, seed, tmp_path / f"s{seed}")
        assert result.answer == pytest.approx(landscape.answer), result.conclusion
        assert result.runs <= 0.5 * result.grid_runs, (result.runs, result.grid_runs)
        assert result.conclusion.startswith(("confirmed", "unconfirmed")), result.conclusion


def test_a_second_study_reuses_the_first_ones_runs(tmp_path: Path) -> None:
    landscape = LANDSCAPES["best-lr"]
    first = run_study(landscape, 0, tmp_path, thread="first")
    second = run_study(landscape, 0, tmp_path, thread="second")
    assert first.reused == 0 and second.reused >= 10  # the 5 coarse values × 2 seeds were measured
    assert second.runs < first.runs
    assert second.answer == pytest.approx(landscape.answer)


def test_dry_run_cites_prior_findings_and_skips_their_values(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    landscape = LANDSCAPES["best-lr"]
    run_study(landscape, 0, tmp_path, thread="first")
    store = tmp_path / "memory.db"
    before = store.stat().st_mtime_ns
    result = CliRunner().invoke(
        app,
        ["research", landscape.question, "--dry-run", "--store", str(store), "--root", str(tmp_path / "dry")],
    )
    assert result.exit_code == 0, result.output
    assert "5 prior finding(s) of the same configurations" in result.output
    assert result.output.count("reused: finding #") == 5
    out = result.output
    assert "coarse: 0 run(s) to run (" in out.replace("2 seeds per configuration; ", "")
    # found by a fresh user: with every coarse run reused, refine and replicate were priced at 0 s and the
    # plan read "≈ 0.0 min" for the 12 runs still to run; they are priced at the coarse values' price
    stages = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("    ")}
    for stage in ("refine", "replicate"):
        assert "≈ 0.0 min" not in stages[stage], stages[stage]
    reused = int(out.split("run(s) to run (")[1].split(" reused")[0])
    assert reused >= 10  # the first study's 5 coarse values × 2 seeds at least
    assert f"; {reused} run(s) of prior findings are reused, not run again (not in the estimate)" in out
    estimate = out.split("estimated time: ≈ ")[1]
    assert float(estimate.split(" min")[0]) > 1.0 and "run(s) still to run at" in estimate
    assert store.stat().st_mtime_ns == before and not (tmp_path / "dry").exists()


def test_a_second_min_stable_study_reuses_the_first_ones_refine_runs_too(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    landscape = LANDSCAPES["min-stable-batch"]
    first = run_study(landscape, 0, tmp_path, thread="first")
    dry = CliRunner().invoke(
        app,
        [
            "research",
            landscape.question,
            "--dry-run",
            "--store",
            str(tmp_path / "memory.db"),
            "--root",
            str(tmp_path / "dry"),
        ],
    )
    assert dry.exit_code == 0, dry.output
    # the first study's refine values (between the coarse ones) are cited and join the analysis
    assert (
        "join the analysis (refine bisects from the bracket they give and never re-runs them)" in dry.output
    )
    second = run_study(landscape, 0, tmp_path, thread="second")
    assert second.reused == first.runs and second.runs == 0  # coarse, refine and replicate runs all reused
    assert second.answer == first.answer == pytest.approx(landscape.answer)
    assert second.confirmed == first.confirmed
    from a3r.graph.records import stored_speed
    from memory import Store

    with Store(tmp_path / "memory.db") as store:  # the runner stored each run's measured speed and model
        found = stored_speed(store, "arithmetic", None)
        assert found is not None and found[0] > 0 and found[1] == first.runs
        assert stored_speed(store, "arithmetic", "some/other-model") is None


def test_the_h200_budget_sequence_replayed_starts_no_run_that_cannot_finish(tmp_path: Path) -> None:
    """Issue 33, the H200 re-run of "find min stable batch size on arithmetic" with --budget-minutes 8:
    a 112 s preflight, then coarse runs of 80-87 s each (server and vLLM start, 4 steps at 0.3 s per
    episode, held-out evaluation). The re-plan priced runs at 0.3 s per episode (≈ 10 s), kept "2 runs
    left fit the 159 s left", started B = 2 seed 1 with 66 s left (cancelled at step 0), and the verdict
    never named B = 4 and 8, which it had dropped. Replayed with those fixed times through the graph."""
    from dataclasses import replace

    from research import SimulatedRuns, invoke_study  # type: ignore[import-not-found]

    from a3r.graph.context import Ledger, RunContext
    from a3r.providers import OfflineProvider
    from memory import Store

    walls = iter([80.0, 85.0, 87.0, 84.0, 86.0, 83.0, 85.0, 82.0])
    started: list[tuple[str, float]] = []

    class H200Runs(SimulatedRuns):  # type: ignore[misc]
        def __call__(self, spec, *, ctx, ws, run_id, budget_s, eval_reserve_s):  # type: ignore[no-untyped-def]
            out = super().__call__(
                spec, ctx=ctx, ws=ws, run_id=run_id, budget_s=budget_s, eval_reserve_s=eval_reserve_s
            )
            started.append((spec.key, budget_s))
            wall = 112.0 if spec.purpose == "preflight" else next(walls)
            return out.model_copy(update={"wall_s": wall, "seconds_per_episode": 0.3})

    landscape = replace(LANDSCAPES["min-stable-batch"], question="find min stable batch size on arithmetic")
    store, ledger = Store(str(tmp_path / "memory.db")), Ledger(tmp_path / "checkpoints.db")
    ctx = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=ledger,
        thread_id="h200",
        root=tmp_path,
        budget_s=480.0,
        eval_tasks=16,
        eval_samples=2,
        preflight_samples=4,
        execute=H200Runs(landscape, 0),
    )
    try:
        values = invoke_study(ctx, landscape.question, tmp_path)
        report = Path(values["report"]).read_text(encoding="utf-8")
    finally:
        ledger.close()
        store.close()
    sweep = [(key, left) for key, left in started if key != "preflight"]
    # every sweep run after the first started with at least the measured time of a run left
    assert sweep and all(left >= 80.0 for _, left in sweep[1:]), sweep
    ran = {o.value for o in values["outcomes"] if o.purpose == "sweep"}
    conclusion = values["conclusion"]
    why = "dropped by the budget re-plan before it started"
    assert ran == {1.0, 2.0}  # B = 8 dropped at the preflight's speed, B = 4 at the first measured run's time
    for value in {1.0, 2.0, 4.0, 8.0} - ran:
        assert f"batch_size = {value:g} (entirely), seeds 0, 1: {why}" in conclusion, conclusion
        assert f"| {value:g} | [] | [] | not run (seeds 0, 1: {why}) |" in report
    # 4 runs not run × the 85 s measured + what was spent (112 s + 4 runs and the time around them)
    assert "The budget ran out for 4 runs (4 dropped before they started): at the 85 s per run" in conclusion
    assert "--budget-minutes 14 would have run them (this one had 8)" in conclusion
