"""Navigation by keyboard alone in an 80×24 terminal: studies → study (plan, runs, events) → run,
findings, and the refresh that picks up what others write to the store meanwhile."""

from __future__ import annotations

from textual.widgets import DataTable, RichLog

from a3r.app.tui import A3RApp, RewardCurve, TuiConfig
from a3r.app.tui._findings_screen import FindingsScreen
from a3r.app.tui._run_screen import RunScreen
from a3r.app.tui._studies_screen import StudiesScreen
from a3r.app.tui._study_screen import StudyScreen
from memory import Store
from tests.tui.conftest import Seeded, cells, text_of, wait_for

SIZE = (80, 24)


async def test_studies_to_study_to_run(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    app = A3RApp(store, config=config)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, StudiesScreen) and cells(app, "#studies"))
        rows = cells(app, "#studies")
        assert [row[:6] for row in rows] == [
            [str(seeded.study_id), "open", "research", "2", "1", "2"],
            [str(seeded.other_study_id), "open", "vibe", "0", "0", "0"],
        ]
        assert "2 patch(es) await approval" in str(app.screen.sub_title)

        await pilot.press("enter")
        assert isinstance(app.screen, StudyScreen) and app.screen.study_id == seeded.study_id
        await wait_for(pilot, lambda: len(cells(app, "#runs")) == 2)
        runs = cells(app, "#runs")
        assert [row[:6] for row in runs] == [
            [str(seeded.run_ids[0]), "kl-seed0", "kl-0.05", "0", "running", "3"],
            [str(seeded.run_ids[1]), "kl-seed1", "kl-0.05", "1", "failed", "3"],
        ]
        assert "reward/mean=0.5" in runs[0][6]
        curve = app.screen.query_one(RewardCurve)
        await wait_for(pilot, lambda: curve.values == (0.1, 0.2, 0.35, 0.5))
        assert curve.metric == f"run {seeded.run_ids[0]} (kl-seed0) reward/mean"
        await pilot.press("down")  # the curve follows the highlighted run
        await wait_for(pilot, lambda: curve.values == (0.1, 0.05, 0.0, 0.0))

        await pilot.press("1")
        plan = text_of(app, "#plan-text")
        assert "KL 0.05 keeps held-out accuracy within 2 points" in plan
        assert "decide: 3 of 3 seeds" in plan
        assert "kl-0.05 [countdown] tests H" in plan and "reward reward.py v1" in plan
        await pilot.press("3")
        log_lines = [str(line.text) for line in app.screen.query_one("#events", RichLog).lines]
        assert any("planned 1 experiment" in line for line in log_lines)
        assert any("warning" in line and "run collapsed" in line for line in log_lines)

        await pilot.press("2", "enter")
        assert isinstance(app.screen, RunScreen) and app.screen.run_id == seeded.run_ids[1]
        await wait_for(pilot, lambda: app.screen.query_one("#stored-curve", RewardCurve).values)
        assert app.screen.query_one("#stored-curve", RewardCurve).values == (0.1, 0.05, 0.0, 0.0)
        info = text_of(app, "#run-info")
        assert "failed" in info and "reward collapsed to 0" in info and "none recorded" in info
        assert "the run recorded no server" in text_of(app, "#live-status")

        await pilot.press("escape", "escape")
        assert isinstance(app.screen, StudiesScreen)


async def test_refresh_shows_new_runs_metrics_and_events(
    store: Store, seeded: Seeded, config: TuiConfig
) -> None:
    app = A3RApp(store, config=config, study_id=seeded.study_id)
    async with app.run_test(size=SIZE) as pilot:
        assert isinstance(app.screen, StudyScreen)
        await wait_for(pilot, lambda: len(cells(app, "#runs")) == 2)
        experiment = store.experiments(seeded.study_id)[0]
        new_run = store.start_run(experiment.id, seed=2)
        store.log_metrics(new_run.id, step=7, metrics={"reward/mean": 0.9})
        store.log_event("seed 2 started", run_id=new_run.id)
        await wait_for(pilot, lambda: len(cells(app, "#runs")) == 3)
        assert cells(app, "#runs")[2][:6] == [str(new_run.id), "", "kl-0.05", "2", "running", "7"]
        await pilot.press("3")
        log = app.screen.query_one("#events", RichLog)
        await wait_for(pilot, lambda: any("seed 2 started" in str(line.text) for line in log.lines))
        # Events are appended once each, never repeated by later refreshes.
        await pilot.pause(0.5)
        assert sum("planned 1 experiment" in str(line.text) for line in log.lines) == 1


async def test_findings_screen(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    app = A3RApp(store, config=config)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")
        assert isinstance(app.screen, FindingsScreen) and app.screen.study_id is None
        await wait_for(pilot, lambda: cells(app, "#findings"))
        assert cells(app, "#findings") == [
            [
                str(seeded.finding_id),
                str(seeded.study_id),
                "unconfirmed",
                "0.70",
                "Exact-match reward gives zero signal on decimal answers",  # wrapped to fit 80 columns
            ]
        ]
        detail = text_of(app, "#finding")
        assert "Exact-match reward gives zero signal on decimal answers" in detail
        assert "run 2 collapsed" in detail and f"evidence runs {seeded.run_ids[1]}" in detail
        assert "seeds 1" in detail


async def test_study_findings_are_filtered(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    app = A3RApp(store, config=config, study_id=seeded.other_study_id)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")
        screen = app.screen
        assert isinstance(screen, FindingsScreen) and screen.study_id == seeded.other_study_id
        await pilot.pause(0.3)
        assert cells(app, "#findings") == []
        assert "no finding yet" in text_of(app, "#finding")


async def test_a_finding_reads_as_its_plain_line_and_its_evidence_without_nan(
    store: Store, seeded: Seeded, config: TuiConfig
) -> None:
    """Found by a fresh user: a finding's detail was raw JSON with ``NaN``."""
    import json

    effect = {"estimate": 0.1, "low": 0.04, "high": 0.16, "verdict": "confirmed", "n": 16, "unit": "episodes"}
    evidence = {"curve": [[1, 0.2], [2, 0.3]], "effect": effect, "noise": float("nan")}
    store.add_finding(
        seeded.other_study_id, statement="a long derivation", confidence=0.9, evidence=json.dumps(evidence)
    )
    app = A3RApp(store, config=config)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")
        await wait_for(pilot, lambda: len(cells(app, "#findings")) == 2)
        row = cells(app, "#findings")[1]
        # the label is the finding's status (unconfirmed: stored so), the effect's numbers follow it
        assert row[2] == "unconfirmed" and row[4].startswith("unconfirmed: train reward Δ +0.100 (95% CI")
        await pilot.press("down")
        detail = text_of(app, "#finding")
        assert "a long derivation" in detail and "curve: 2 points" in detail and "noise: –" in detail
        assert "NaN" not in detail and "nan" not in detail


async def test_the_findings_list_wraps_a_verdict_and_keeps_its_interval(
    store: Store, seeded: Seeded, config: TuiConfig
) -> None:
    """Found by a fresh user: at 100 columns the list cut the verdict before its "(95% CI …)"."""
    import json

    effect = {
        "estimate": 0.1,
        "low": -0.04,
        "high": 0.26,
        "verdict": "unconfirmed",
        "n": 8,
        "unit": "episodes",
    }
    store.add_finding(
        seeded.other_study_id, statement="s", confidence=0.5, evidence=json.dumps({"effect": effect})
    )
    app = A3RApp(store, config=config)
    async with app.run_test(size=SIZE) as pilot:  # 80 columns: the line is longer than its column
        await pilot.press("f")
        await wait_for(pilot, lambda: len(cells(app, "#findings")) == 2)
        line = cells(app, "#findings")[1][4]
        assert line.endswith("(95% CI -0.040…+0.260)"), line
        for _ in range(3):  # rows take their heights once the table is idle
            await pilot.pause(0.05)
        table = app.screen.query_one("#findings", DataTable)
        drawn = [table.render_line(y).text.rstrip() for y in range(table.size.height)]
        assert " ".join(line.split()) in " ".join(" ".join(drawn).replace("│", " ").split()), drawn
        assert max(map(len, drawn)) <= SIZE[0]


async def test_a_concluded_study_opens_with_its_one_plain_line(
    store: Store, seeded: Seeded, config: TuiConfig
) -> None:
    import json

    from memory import StudyUpdate

    effect = {"estimate": 0.2, "low": 0.1, "high": 0.3, "verdict": "confirmed", "n": 3, "unit": "seeds"}
    conclusion = "hypothesis confirmed: a long derivation with every number in it"
    store.add_finding(
        seeded.study_id,
        statement=conclusion,
        confidence=0.95,
        evidence=json.dumps({"effect": effect}),
        status="confirmed",
    )
    store.update_study(seeded.study_id, StudyUpdate(conclusion=conclusion))
    app = A3RApp(store, config=config, study_id=seeded.study_id)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "Verdict" in text_of(app, "#plan-text"))
        plan = " ".join(text_of(app, "#plan-text").split())
        assert "Verdict confirmed: train reward Δ +0.200 (95% CI +0.100…+0.300)" in plan
        assert plan.index("Verdict") < plan.index("Derivation hypothesis confirmed: a long derivation")
