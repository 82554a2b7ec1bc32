"""Only what ran is judged, and judged like for like (issue 33, parts 1 and 3).

The H200 study "find min stable batch size on arithmetic" (8 min budget): B = 4 and B = 8 never trained
(the budget cancelled both seeds, 0 steps), yet the findings read "confirmed: batch_size=4 is unstable",
and the conclusion "refuted: no tested batch_size (1, 2, 4, 8) was stable" rested on them; B = 1 was
"unstable" because 8 training samples over its last 2 steps (0.000) fell below the held-out baseline −
δ (0.156 − 0.05), while its held-out mean after training (0.172) was no worse than before (0.156). The
reporter runs here on a real SQLite store; the runs are the outcomes the runner would have produced.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.runtime import Runtime

from a3r.graph.reporter import reporter
from a3r.study.analysis import RewardSummary, summarise_rewards
from a3r.study.headline import conclusion_line, headline
from a3r.study.plans import StabilityCriterion
from a3r.study.runs import RunOutcome
from a3r.study.stability import judge_run, not_run_reason, verdicts
from memory import FindingStatus, Store
from tests.a3r.planner_states import offline_context, preflight_state

TASKS = [f"h{i}" for i in range(16)]


def _evaluation(successes: int, attempts_per_task: int, tasks: list[str] = TASKS) -> RewardSummary:
    """A 0/1-reward held-out evaluation with ``successes`` spread over ``tasks``."""
    rewards = {t: [0.0] * attempts_per_task for t in tasks}
    for i in range(successes):
        rewards[tasks[i % len(tasks)]][i // len(tasks)] = 1.0
    return summarise_rewards(rewards, keep_tasks=True)


BASELINE = _evaluation(10, 4)  # 10 of 64 = 0.156, the H200 study's untrained model


def _run(value: int, seed: int, **update: Any) -> RunOutcome:
    """A coarse sweep run that trained 4 steps (train reward ≈ 0.2) and was evaluated at 0.172 (11/64)."""
    fields: dict[str, Any] = {
        "key": f"coarse-batch_size={value}-s{seed}",
        "run_id": 0,
        "purpose": "sweep",
        "seed": seed,
        "stage": "coarse",
        "value": float(value),
        "status": "finished",
        "reason": "reached step 4",
        "steps": 4,
        "curve": [(1, 0.25), (2, 0.125), (3, 0.25), (4, 0.25)],
        "eval": _evaluation(11, 4),
        "wall_s": 60.0,
    }
    return RunOutcome(**(fields | update))


def _cancelled(value: int, seed: int) -> RunOutcome:
    """A run the budget stopped while its client was still starting: 0 steps, no evaluation."""
    return _run(
        value,
        seed,
        status="budget",
        reason="wall-time budget of 40 s spent at step 0",
        steps=0,
        curve=[],
        eval=None,
        wall_s=41.0,
    )


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "memory.db") as opened:
        yield opened


def _report(tmp_path: Path, store: Store, runs: list[RunOutcome], **more: Any) -> tuple[str, str, list[Any]]:
    state: dict[str, Any] = (
        preflight_state(store, "find min stable batch size on arithmetic", BASELINE) | more
    )
    experiment = store.create_experiment(state["study_id"], "runs")
    recorded = [o.model_copy(update={"run_id": store.start_run(experiment.id, name=o.key).id}) for o in runs]
    state |= {
        "outcomes": [*state["outcomes"], *recorded],
        "baseline": BASELINE,
        "workspace": str(tmp_path / "ws"),
    }
    ctx = offline_context(tmp_path, store)
    ctx.budget_s = 480.0
    result = reporter(state, Runtime(context=ctx))  # type: ignore[arg-type]
    report = Path(str(result["report"])).read_text(encoding="utf-8")
    return str(result["conclusion"]), report, store.findings(state["study_id"])


def test_a_sweep_whose_budget_cancelled_half_its_configurations_claims_nothing_about_them(
    tmp_path: Path, store: Store
) -> None:
    runs = [_run(v, s) for v in (1, 2) for s in (0, 1)] + [_cancelled(v, s) for v in (4, 8) for s in (0, 1)]
    conclusion, report, findings = _report(tmp_path, store, runs)
    configs = verdicts(runs, baseline=BASELINE, criterion=StabilityCriterion())
    assert [(c.value, c.stable) for c in configs] == [(1, True), (2, True), (4, None), (8, None)]
    for c in configs[2:]:
        assert not c.ran and c.seeds == [] and c.margin is None and not c.settled
        assert c.stable_text == "not run (seeds 0, 1: cancelled by the budget before its first step)"
    # findings: "not run" with the reason, never stable, unstable, confirmed or refuted
    about = {v: [f for f in findings if f"batch_size={v}" in f.statement] for v in (4, 8)}
    for v, found in about.items():
        (finding,) = found
        assert finding.statement.startswith(
            f"not run: batch_size={v} gave no evidence, no claim is made about it"
        )
        assert "cancelled by the budget before its first step" in finding.statement
        assert "stable" not in finding.statement and finding.status is FindingStatus.not_run
        assert "identity" not in finding.evidence  # never reused by a later study as tested
    # the study's verdict rests on the values that ran, and says which did not run and what would run them
    assert not conclusion.startswith("refuted")
    assert "minimal stable batch_size ≤ 1" in conclusion
    assert (
        "Not run (no claim is made about them): batch_size = 4 (entirely), seeds 0, 1: cancelled by the budget before "
        "its first step; batch_size = 8 (entirely), seeds 0, 1: cancelled by the budget before its first step."
        in conclusion
    )
    assert "batch_size = 8 (entirely)" in conclusion
    # what was spent (preflight 40 s + 4 runs × 60 s), less the cut runs' 4 × 41 s, + 4 runs × 60 s = 520 s
    assert (
        "The budget ran out for 4 runs: at the 60 s per run measured (median of the 4 runs that ran)"
        in conclusion
    )
    assert "--budget-minutes 9 would have run them (this one had 8)" in conclusion
    # the report's table says not run, with the reason
    assert "| 4 | [] | [] | not run (seeds 0, 1: cancelled by the budget before its first step) |" in report


def test_a_configuration_with_one_seed_cancelled_is_judged_on_the_seed_that_ran(
    tmp_path: Path, store: Store
) -> None:
    # the H200 study's B = 2: seed 1 stopped by the budget while its client started ("crash: client raised:
    # KeyboardInterrupt" before); seed 0 ran. One seed is fewer than the rule's 2: undecided, not unstable.
    runs = [_run(2, 0), _cancelled(2, 1)]
    (config,) = verdicts(runs, baseline=BASELINE, criterion=StabilityCriterion())
    assert config.ran and config.seeds == [0] and config.stable is None and not config.hard_failure
    assert config.not_run == [
        "seed 1: cancelled by the budget before its first step: wall-time budget of 40 s spent at step 0"
    ]
    conclusion, _, findings = _report(tmp_path, store, runs)
    (finding,) = [f for f in findings if "batch_size=2 is" in f.statement]
    assert "is undecided (1/1 seed that ran stable" in finding.statement
    assert "; not run: seed 1: cancelled by the budget" in finding.statement
    assert conclusion.startswith("unconfirmed: no configuration that ran (2) has a stability verdict yet")


def test_what_did_not_run_and_why() -> None:
    started = _run(
        1, 0, status="failed_to_start", reason="swarm serve exited with code 1", steps=0, curve=[], eval=None
    )
    assert (
        not_run_reason(started) == "start failure (failed (failed_to_start)): swarm serve exited with code 1"
    )
    crashed_early = _run(
        1, 0, status="crashed", reason="swarm run exited with code 1", steps=0, curve=[], eval=None
    )
    assert (
        not_run_reason(crashed_early)
        == "failed (crashed) before its first step: swarm run exited with code 1"
    )
    late = _run(
        1,
        0,
        status="budget",
        reason="wall-time budget spent at step 2",
        steps=2,
        curve=[(1, 0.2), (2, 0.3)],
        eval=None,
    )
    assert not_run_reason(late) == (
        "cancelled (budget) after 2 steps, before its held-out evaluation: wall-time budget spent at step 2"
    )
    # a crash after training began is the run's own failure: it ran, and it is unstable
    crashed = _run(1, 0, status="crashed", reason="swarm run exited with code 1", eval=None)
    assert not_run_reason(crashed) is None
    verdict = judge_run(crashed, BASELINE, StabilityCriterion())
    assert not verdict.stable and verdict.hard
    # a budget stop after training and evaluation ran: judged like a finished run
    assert not_run_reason(_run(1, 0, status="budget")) is None


def test_stability_compares_held_out_after_training_with_held_out_before() -> None:
    criterion = StabilityCriterion()  # last_k 2, δ 0.05
    # the B = 1: train reward over the last 2 steps 0.000, below 0.156 − 0.05; held-out after
    # training 0.172 (11 of 64) against 0.156 (10 of 64) before on the same 16 tasks: stable
    b1 = _run(1, 0, curve=[(1, 0.25), (2, 0.125), (3, 0.0), (4, 0.0)])
    verdict = judge_run(b1, BASELINE, criterion)
    assert verdict.stable and verdict.last_k_reward == 0.0
    assert verdict.compared == (
        "held-out mean reward after training 0.172 (64 attempts) vs before 0.156 (64 attempts) on the same 16 tasks"
    )
    assert verdict.change == pytest.approx(1 / 64)
    # a rising train reward does not save a held-out reward that fell: 2 of 64 after, 10 before
    hacked = _run(1, 1, curve=[(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)], eval=_evaluation(2, 4))
    verdict = judge_run(hacked, BASELINE, criterion)
    assert not verdict.stable and not verdict.hard
    assert verdict.reasons == [
        "held-out mean reward after training 0.031 (64 attempts) vs before 0.156 (64 attempts) on the same 16 "
        "tasks: below before − 0.05"
    ]
    # on the same tasks: an evaluation of 4 tasks is compared with the baseline's numbers on those 4 only
    four = TASKS[:4]
    easy = summarise_rewards({t: [1.0, 0.0, 0.0, 0.0] for t in four}, keep_tasks=True)  # 0.25 on h0..h3
    narrow = _run(1, 2, eval=easy)
    verdict = judge_run(narrow, BASELINE, criterion)
    before = BASELINE.on_tasks(four)
    assert verdict.change == pytest.approx(0.25 - before.mean_reward)
    assert (
        "on the same 4 tasks" in verdict.compared
        and f"before {before.mean_reward:.3f} (16 attempts)" in verdict.compared
    )
    # without a held-out evaluation a run is compared with itself: last k train steps vs its first k
    alone = _run(1, 3, eval=None, curve=[(1, 0.5), (2, 0.5), (3, 0.1), (4, 0.1)])
    verdict = judge_run(alone, BASELINE, criterion)
    assert not verdict.stable
    assert (
        verdict.compared
        == "no held-out evaluation: train reward of its last 2 steps 0.100 vs its first 2 steps 0.500"
    )


def test_the_operational_definition_says_what_it_compares_with_its_n() -> None:
    text = StabilityCriterion().describe(tasks=16, after=32, before=64)
    assert (
        "held-out mean reward after training is >= the untrained model's held-out mean reward on the same held-out tasks - 0.05"
        in text
    )
    assert "(n = 16 tasks: 32 attempts after, 64 before;" in text
    assert "mean training reward over the last" not in text
    assert "n = the held-out tasks and attempts both evaluations ran" in StabilityCriterion().describe()


def test_the_printed_definition_of_stable_carries_the_n_it_used(tmp_path: Path) -> None:
    """From issue 33: the definition printed by the plan, the dry run and the report said "n = the held-out
    tasks and attempts both evaluations ran" where the numbers were known. The report states the n its
    runs compared; the dry run the n the plan asks for (up to: the budget may cut attempts)."""
    from typer.testing import CliRunner

    from a3r.app.cli import app
    from a3r.study.report import stability_n

    runs = [_run(1, 0), _run(1, 1), _run(2, 0, eval=None)]
    assert stability_n(runs, BASELINE) == {"tasks": 16, "after": 64, "before": 64}
    assert stability_n([*runs, _run(2, 1, eval=_evaluation(3, 2))], BASELINE) == {}  # n differs: per verdict
    assert stability_n(runs, None) == {}
    text = StabilityCriterion().describe(**stability_n(runs, BASELINE))
    assert "(n = 16 tasks: 64 attempts after, 64 before;" in text
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    question = "smallest stable batch_size on arithmetic"
    result = CliRunner().invoke(app, ["research", question, "--eval-tasks", "8", *common])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("  stability: ")]
    assert "(n = up to 8 tasks: 16 attempts after, 32 before;" in line, line


def test_runs_the_budget_re_plan_dropped_are_not_run_and_count_in_the_budget_that_would_run_them(
    tmp_path: Path, store: Store
) -> None:
    # the H200 re-run (2026-12-05 10:37): the coarse stage re-planned twice (dropped B = 8, then B = 4),
    # then B = 2 seed 1 was cancelled before its first step; the verdict named only 2-s1, the table
    # omitted 4 and 8, and the settle budget counted 1 run of the 5 that did not run
    runs = [_run(1, 0), _run(1, 1), _run(2, 0), _cancelled(2, 1)]
    dropped = [(8.0, 0), (8.0, 1), (4.0, 0), (4.0, 1)]
    conclusion, report, findings = _report(tmp_path, store, runs, unstarted=dropped)
    why = "dropped by the budget re-plan before it started"
    assert (
        "Not run (no claim is made about them): batch_size = 2, seed 1: cancelled by the budget before its first "
        f"step; batch_size = 4 (entirely), seeds 0, 1: {why}; batch_size = 8 (entirely), seeds 0, 1: {why}"
        in conclusion
    )
    # spent: preflight 40 s + 3 runs × 60 s + the cancelled 41 s; less its 41 s; + 5 runs × 60 s = 520 s
    assert (
        "The budget ran out for 5 runs (1 cancelled, 4 dropped before they started): at the 60 s per run "
        "measured (median of the 3 runs that ran), --budget-minutes 9 would have run them (this one had 8)"
        in conclusion
    )
    # the cancelled run trained no step: no held-out evaluation, and its row says so
    assert (
        "| coarse-batch_size=2-s1 | cancelled (budget) | 0 | 0 | 41 | – | – (not evaluated: no step trained) |"
        in report
    )
    for v in (4, 8):
        assert f"| {v} | [] | [] | not run (seeds 0, 1: {why}) |" in report
        (finding,) = [f for f in findings if f"batch_size={v}" in f.statement]
        assert finding.statement.startswith(
            f"not run: batch_size={v} gave no evidence, no claim is made about it"
        )
        assert why in finding.statement and finding.confidence == 0.0
    # a value re-admitted later that ran is judged on its run, not listed as not run
    again = verdicts(
        [*runs, _run(4, 0), _run(4, 1)], baseline=BASELINE, criterion=StabilityCriterion(), unstarted=dropped
    )
    assert [(c.value, c.ran) for c in again] == [(1, True), (2, True), (4, True), (8, False)]
    assert again[2].not_run == []


def test_a_run_the_budget_stopped_before_its_planned_steps_is_not_run(tmp_path: Path, store: Store) -> None:
    # `--budget-minutes 6`: every run cancelled at step 0-2 of 4, yet "minimal stable batch_size = 2" and
    # B = 1 "unstable"; a budget-cut run is not a completed run, even with a held-out evaluation
    cut = [
        _run(
            v,
            s,
            status="budget",
            reason=f"wall-time budget spent at step {k}",
            steps=k,
            curve=[],
            planned_steps=4,
        )
        for v, k in ((1, 1), (2, 2))
        for s in (0, 1)
    ] + [
        _run(v, s, status="budget", reason="budget", steps=0, curve=[], eval=None, planned_steps=4)
        for v in (4, 8)
        for s in (0, 1)
    ]
    cut = [o.model_copy(update={"curve": [(i + 1, 0.25) for i in range(o.steps)]}) for o in cut]
    assert (
        not_run_reason(cut[2]) == "cancelled by the budget at step 2 of 4: wall-time budget spent at step 2"
    )
    configs = verdicts(cut, baseline=BASELINE, criterion=StabilityCriterion())
    assert [c.stable for c in configs] == [None] * 4 and not any(c.ran for c in configs)
    assert configs[1].not_run_short.startswith("seeds 0, 1: cancelled by the budget at step 2 of 4")
    conclusion, _, findings = _report(tmp_path, store, cut)
    assert "minimal stable" not in conclusion and not conclusion.startswith("refuted")
    assert all("is unstable" not in f.statement and "is stable" not in f.statement for f in findings)
    # a run that reached its planned steps before the budget stopped it is judged; older records
    # (planned_steps None) are judged as before
    assert not_run_reason(_run(1, 0, status="budget", planned_steps=4)) is None
    assert not_run_reason(_run(1, 0, status="budget", steps=2, curve=[(1, 0.2), (2, 0.3)])) is None


def test_no_stable_value_is_refuted_only_when_every_planned_configuration_ran(
    tmp_path: Path, store: Store
) -> None:
    # `--budget-minutes 4`: "refuted (0.95): no batch_size that ran (1) was stable" while B = 2, 4, 8 did not run
    failed = [_run(1, s, status="crashed", reason="swarm run exited with code 1", eval=None) for s in (0, 1)]
    runs = failed + [_cancelled(v, s) for v in (2, 4, 8) for s in (0, 1)]
    conclusion, _, findings = _report(tmp_path, store, runs)
    assert conclusion.startswith(
        "unconfirmed: no batch_size that ran (1) was stable on every seed (with every larger value stable) "
        "under the pre-registered definition; batch_size = 2, 4, 8 did not run, so the hypothesis is not refuted"
    )
    assert "--budget-minutes" in conclusion and "would have run them" in conclusion
    (study,) = [f for f in findings if f.statement == conclusion]
    assert study.status is FindingStatus.unconfirmed and study.confidence < 0.95
    # every planned value ran and the largest failed for a reason noise cannot explain: refuted
    conclusion, _, _ = _report(
        tmp_path / "all",
        store,
        [_run(v, s, status="crashed", reason="x", eval=None) for v in (1, 2, 4, 8) for s in (0, 1)],
    )
    assert conclusion.startswith("refuted: no batch_size that ran (1, 2, 4, 8) was stable")


def test_a_study_that_stopped_after_a_start_failure_lists_every_planned_configuration(
    tmp_path: Path, store: Store
) -> None:
    log = "/work/studies/17/runs/coarse-batch_size=1-s0/coarse-batch_size=1-s0.server.log"
    reason = f"swarm serve exited with code 1: torch.OutOfMemoryError: CUDA out of memory (log: {log})"
    failed = _run(1, 0, status="failed_to_start", reason=reason, steps=0, curve=[], eval=None)
    stop = f"stopped: the sweep run {failed.key} ended failed_to_start: {reason}"
    conclusion, report, findings = _report(tmp_path, store, [failed], conclusion=stop)
    assert conclusion == stop
    # a row per planned value, not run with the reason
    assert (
        "| 1 | [] | [] | not run (seed 0: start failure (failed (failed_to_start)); seed 1: not started: the study "
        "stopped after a start failure) |" in report
    )
    for v in (2, 4, 8):
        assert (
            f"| {v} | [] | [] | not run (seeds 0, 1: not started: the study stopped after a start failure) |"
            in report
        )
    # not-run findings, no claim, like the dropped ones
    for v in (1, 2, 4, 8):
        (finding,) = [f for f in findings if f"batch_size={v} " in f.statement]
        assert finding.statement.startswith(
            f"not run: batch_size={v} gave no evidence, no claim is made about it"
        )
        assert finding.confidence == 0.0 and finding.status is FindingStatus.not_run
    (four,) = [f for f in findings if "batch_size=4 " in f.statement]
    assert "seed 1: not started: the study stopped after a start failure" in four.statement
    # the finding's title (its one line) names every seed, not only seed 0
    title = headline(four.statement, four.evidence, question="q", kind="research", status="unconfirmed")
    assert title == (
        "not run: batch_size=4 gave no evidence, no claim is made about it (seeds 0, 1: not started: the "
        "study stopped after a start failure)"
    )
    # the one-line verdict shortens the reason, never cuts a path; the derivation keeps the run dir
    line = conclusion_line(
        conclusion, findings, question="find min stable batch size on arithmetic", kind="research"
    )
    assert len(line) <= 160 and "(log:" not in line and "/work/studies" not in line
    assert line.startswith("stopped: the sweep run coarse-batch_size=1-s0 ended failed_to_start: swarm serve")
    assert log in conclusion


def test_a_run_whose_step_ended_after_the_budget_stop_is_not_evaluated_for_the_budget(
    tmp_path: Path, store: Store
) -> None:
    # fresh-s6 #2: a tenant run's step 1 ended after the budget stop; its row shows that step and says why
    # there is no held-out evaluation (the budget), never "no step trained"
    late = _cancelled(2, 1).model_copy(
        update={
            "steps": 1,
            "curve": [(1, 0.25)],
            "reason": "wall-time budget of 40 s spent at step 0; the step under way then ended: step 1",
        }
    )
    _, report, _ = _report(tmp_path, store, [_run(1, 0), _run(1, 1), _run(2, 0), late])
    (row,) = [line for line in report.splitlines() if line.startswith("| coarse-batch_size=2-s1 |")]
    assert "| 1 |" in row and "– (not evaluated: budget)" in row and "no step trained" not in row
