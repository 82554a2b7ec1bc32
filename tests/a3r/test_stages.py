"""The research study's stages without a graph (`a3r.study.stages`), the one price of a run
(`a3r.study.price`), the re-plan of a run after every step (`a3r.study.research.replan_training`) and the
dry runs that refuse what cannot answer (issue 33, parts 4 and 5)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from a3r.app.cli import app
from a3r.graph.builder import serializer
from a3r.providers import OfflineProvider
from a3r.study.analysis import RewardSummary
from a3r.study.effects import MIN_STEPS
from a3r.study.plans import TrainingSettings
from a3r.study.price import SERVER_OVERHEAD_S, UPDATE_SHARE, estimate_run_s, run_s, step_s, vibe_thread_s
from a3r.study.research import SAFETY_SHARE, Replan, replan_training, size_training, sweep_specs
from a3r.study.runs import RunOutcome
from a3r.study.sequential import SignalRule
from a3r.study.stages import Stage, StageBudget, StudyProgress, next_stage, refit_queue

BASELINE = RewardSummary(tasks=8, episodes=32, mean_reward=0.3, pass_at_1=0.3, pass_at_2=0.45)


def _plan(question: str = "find min stable batch size on arithmetic"):  # type: ignore[no-untyped-def]
    return OfflineProvider().plan(question, mode="research")


def _preflight(mean: float = 0.3, seconds_per_episode: float = 0.5) -> RunOutcome:
    evaluation = RewardSummary(tasks=8, episodes=32, mean_reward=mean, pass_at_1=mean, pass_at_2=mean)
    return RunOutcome(
        key="preflight",
        run_id=1,
        purpose="preflight",
        status="finished",
        reason="",
        eval=evaluation,
        wall_s=40.0,
        seconds_per_episode=seconds_per_episode,
    )


def _sweep(value: float, seed: int, curve: list[float], *, seconds_per_episode: float = 0.5) -> RunOutcome:
    """A sweep run whose held-out mean after training is its curve's last value (stability compares it
    with the held-out mean before training, like for like)."""
    after = curve[-1] if curve else 0.3
    return RunOutcome(
        key=f"coarse-batch_size={value:g}-s{seed}",
        run_id=10 + seed,
        purpose="sweep",
        stage="coarse",
        seed=seed,
        value=value,
        status="finished",
        reason="",
        steps=len(curve),
        wall_s=50.0,
        curve=[(i + 1, v) for i, v in enumerate(curve)],
        eval=RewardSummary(tasks=2, episodes=4, mean_reward=after, pass_at_1=after, pass_at_2=after),
        seconds_per_episode=seconds_per_episode,
    )


# ------------------------------------------------------------------------------ the stage decision


def test_a_preflight_with_signal_queues_the_coarse_stage_that_fits() -> None:
    plan = _plan()
    progress = StudyProgress(plan=plan, outcomes=[_preflight()])
    roomy = next_stage(progress, StageBudget(left_s=36_000, eval_episodes=8))
    assert roomy.stage is Stage.coarse and roomy.goto == "runner"
    assert sorted({s.value or 0.0 for s in roomy.queue}) == [1, 2, 4, 8] and roomy.dropped == []
    assert roomy.baseline == _preflight().eval and roomy.lines[0].startswith(
        "preflight: untrained model on 8"
    )
    update = roomy.update()
    assert update["stage"] == "coarse" and len(update["queue"]) == 8 and update["budget_cuts"] == []
    # 100 s hold only B = 1 on both seeds (2 × 32 s): the rest is dropped, said, and kept for re-admission
    tight = next_stage(progress, StageBudget(left_s=100, eval_episodes=8))
    assert [s.value for s in tight.queue] == [1, 1] and tight.dropped == [2, 4, 8]
    (cut,) = tight.budget_cuts
    assert (
        cut.startswith("budget: dropped batch_size values [2, 4, 8] from the coarse stage")
        and cut in tight.lines
    )


def test_a_preflight_without_signal_stops_with_the_templates_advice_unless_forced() -> None:
    plan = _plan()
    zero = StudyProgress(plan=plan, outcomes=[_preflight(mean=0.0)])
    budget = StageBudget(left_s=36_000, eval_episodes=8, signal=SignalRule(), advice="an easier level")
    stop = next_stage(zero, budget)
    assert stop.stage is Stage.done and stop.goto == "reporter" and stop.queue == []
    assert stop.conclusion is not None and stop.conclusion.startswith(
        "stopped before the sweep: the untrained model"
    )
    assert "Recommendations: an easier level, or --force" in stop.conclusion
    assert "budget_cuts" not in stop.update() and stop.update()["conclusion"] == stop.conclusion
    forced = next_stage(StudyProgress(plan=plan, outcomes=[_preflight(mean=0.0)], force=True), budget)
    assert forced.stage is Stage.coarse and forced.queue


def test_no_configuration_that_fits_names_the_budget_that_would() -> None:
    plan = _plan()
    progress = StudyProgress(plan=plan, outcomes=[_preflight()])
    stop = next_stage(progress, StageBudget(left_s=30, eval_episodes=8, total_s=400))
    assert stop.conclusion is not None and "fits the remaining budget of 30 s" in stop.conclusion
    # B = 1 on two seeds at 0.5 s per episode: 2 × (20 s + 4 steps × 1 × 4 episodes × 0.5 s + 8 × 0.5 s)
    need = 400 - 30 + 2 * (SERVER_OVERHEAD_S + 4 * 4 * 0.5 + 8 * 0.5)
    match = re.search(r"give --budget-minutes ([\d.]+) or more$", stop.conclusion)
    assert match is not None and float(match.group(1)) == math.ceil(need / 6) / 10


def test_a_best_value_question_that_fits_one_value_stops_with_the_budget_for_two() -> None:
    # issue 33 (5): one value alone cannot answer "which is best"; min-stable is answered by one
    plan = _plan("find the best learning rate on arithmetic")
    run_of_one = sum(
        estimate_run_s(s, seconds_per_episode=0.5, eval_episodes=8)
        for s in sweep_specs(plan, plan.sweep.coarse[:1], "coarse")
    )
    progress = StudyProgress(plan=plan, outcomes=[_preflight()])
    stop = next_stage(progress, StageBudget(left_s=run_of_one * 1.5, eval_episodes=8, total_s=400))
    assert stop.stage is Stage.done and stop.queue == [] and stop.conclusion is not None
    assert stop.conclusion.startswith(
        "stopped: a best-value question compares at least two lr values on 2 seeds"
    )
    match = re.search(r"give --budget-minutes ([\d.]+) or more$", stop.conclusion)
    need = 400 - run_of_one * 1.5 + 2 * run_of_one  # the two cheapest values, both seeds
    assert match is not None and float(match.group(1)) == math.ceil(need / 6) / 10
    two = next_stage(progress, StageBudget(left_s=run_of_one * 2, eval_episodes=8, total_s=400))
    assert two.stage is Stage.coarse and len({s.value for s in two.queue}) == 2


def test_after_the_coarse_stage_refine_bisects_between_stable_and_unstable() -> None:
    plan = _plan()
    unstable, stable = [0.0, 0.0, 0.0, 0.0], [0.3, 0.35, 0.4, 0.42]
    outcomes = [
        _preflight(),
        *(_sweep(1, s, unstable) for s in (0, 1)),
        *(_sweep(4, s, stable) for s in (2, 3)),
        *(_sweep(8, s, stable) for s in (4, 5)),
    ]
    progress = StudyProgress(plan=plan, stage=Stage.coarse, outcomes=outcomes, baseline=BASELINE)
    decision = next_stage(progress, StageBudget(left_s=36_000, eval_episodes=8))
    assert decision.stage is Stage.refine and decision.refine_rounds == 1
    assert {s.value for s in decision.queue} == {2.0} and {s.stage for s in decision.queue} == {"refine1"}
    assert (
        decision.events == [decision.lines[-1]] and "refine: testing batch_size ∈ {2}" in decision.lines[-1]
    )
    # no time left: the refine and replicate stages are skipped, said as budget cuts, and the study reports
    done = next_stage(progress, StageBudget(left_s=1, eval_episodes=8))
    assert done.stage is Stage.done and done.goto == "reporter"
    assert done.budget_cuts and all(c.startswith("budget: ") for c in done.budget_cuts)


def test_the_stage_survives_a_checkpoint_as_an_enum_and_as_an_old_string() -> None:
    codec = serializer()
    assert codec.loads_typed(codec.dumps_typed({"stage": Stage.refine}))["stage"] is Stage.refine
    old = codec.loads_typed(codec.dumps_typed({"stage": "coarse"}))["stage"]  # before the enum existed
    assert Stage(old) is Stage.coarse and old == Stage.coarse


# ------------------------------------------------------------------------------ research re-plans


def test_a_sweep_stage_re_plans_its_queue_after_each_run_down_and_up() -> None:
    """Issue 33 (4): research stages re-plan from the measured speed after every run."""
    plan = _plan()
    queue = sweep_specs(plan, [2, 4, 8], "coarse")
    ran = [_preflight(), *(_sweep(1, s, [0.0] * 4, seconds_per_episode=2.0) for s in (0, 1))]
    progress = StudyProgress(plan=plan, stage=Stage.coarse, outcomes=ran, baseline=BASELINE)
    budget = StageBudget(left_s=600, eval_episodes=8)
    # at the measured 2 s per episode, B = 8 on two seeds (2 × (20 + 256 + 16) s) no longer fits
    down = refit_queue(progress, queue, budget)
    assert down is not None and {s.value for s in down.queue} == {2, 4} and down.dropped == [8]
    (line,) = down.budget_cuts
    assert line.startswith("budget: re-planned the coarse stage at the measured 2.0 s per episode: dropped")
    # nothing changes while everything still fits
    assert refit_queue(progress, queue, StageBudget(left_s=36_000, eval_episodes=8)) is None
    # a dropped value comes back once the runs measured a speed that fits it
    fast = StudyProgress(
        plan=plan,
        stage=Stage.coarse,
        outcomes=[_preflight(), *(_sweep(1, s, [0.0] * 4, seconds_per_episode=0.2) for s in (0, 1))],
        baseline=BASELINE,
        dropped=[8.0],
    )
    up = refit_queue(fast, sweep_specs(plan, [2, 4], "coarse"), budget)
    assert up is not None and {s.value for s in up.queue} == {2, 4, 8} and up.dropped == []
    assert "re-admitted batch_size values [8]" in up.lines[0]


# ------------------------------------------------------------------------------ one price


def test_one_price_for_sweep_runs_the_vibe_dry_run_and_the_vibe_sizing() -> None:
    settings = TrainingSettings(steps=10, batch_size=2, group_size=4)
    assert step_s(2, 4, 3.0) == 24.0 and step_s(2, 4, 3.0, update_share=UPDATE_SHARE) == pytest.approx(31.2)
    assert run_s(settings, seconds_per_episode=3.0, eval_episodes=8) == SERVER_OVERHEAD_S + 10 * 24.0 + 24.0
    (spec,) = sweep_specs(_plan(), [2], "coarse", seeds=[0])
    expected = SERVER_OVERHEAD_S + spec.settings.steps * 2 * spec.settings.group_size * 3.0 + 8 * 3.0
    assert estimate_run_s(spec, seconds_per_episode=3.0, eval_episodes=8) == pytest.approx(expected)
    thread = vibe_thread_s(settings, seconds_per_episode=3.0, eval_episodes=8)
    smoke = settings.smoke_tasks * 4 * 3.0
    training = run_s(settings, seconds_per_episode=3.0, update_share=UPDATE_SHARE)
    assert thread == pytest.approx(smoke + training + 2 * 8 * 3.0)
    sizing = size_training(settings, seconds_per_episode=3.0, budget_s=10_000, reserve_s=0)
    assert sizing.seconds_per_step == step_s(2, 4, 3.0, update_share=UPDATE_SHARE)


# ------------------------------------------------------------------------------ issue 33, part 4


def _replan(step: int, target: int, batch_size: int, seconds_per_step: float, time_left_s: float) -> Replan:
    """A run asked for 10 steps at B = 2, re-planned after ``step``."""
    return replan_training(
        step=step,
        target=target,
        batch_size=batch_size,
        asked_target=10,
        asked_batch_size=2,
        seconds_per_step=seconds_per_step,
        time_left_s=time_left_s,
    )


def test_a_run_re_plans_after_each_step_up_to_the_steps_asked_for() -> None:
    """The README's main job on a busy box: the smoke run's 52.7 s per episode sized training to 3 of
    10 steps at B = 1; its steps then took 13-48 s, so the run goes back up to all 10 steps and B."""
    up = _replan(2, 3, 1, seconds_per_step=20.0, time_left_s=1000.0)
    assert (up.target, up.batch_size) == (10, 2) and up.note is not None
    assert "steps 3 → 10 (all asked for)" in up.note and "B 1 → 2" in up.note
    # only B = 1 holds the 8 steps left: B stays down, the steps go up
    steps_only = _replan(2, 3, 1, seconds_per_step=20.0, time_left_s=200.0)
    assert (steps_only.target, steps_only.batch_size) == (10, 1)
    # slower than planned: B down first, then fewer steps (6 more at 50 s)
    down = _replan(2, 10, 2, seconds_per_step=100.0, time_left_s=300.0)
    assert (down.target, down.batch_size) == (8, 1) and down.note is not None and "B 2 → 1" in down.note
    # no time for even one step: still one more (the budget's own stop ends the run)
    assert _replan(2, 10, 1, seconds_per_step=100.0, time_left_s=10.0).target == 3
    # ... but never a raise with no time for one step: a run at its target ends there (a fresh user's
    # 2-minute vibe printed "re-plan after step 1: … 0 s left …: steps 1 → 2")
    spent = _replan(1, 1, 1, seconds_per_step=60.0, time_left_s=0.0)
    assert spent.target == 1 and spent.note is None
    same = _replan(4, 10, 2, seconds_per_step=10.0, time_left_s=1000.0)
    assert same.note is None and (same.target, same.batch_size) == (10, 2)


def test_a_sizing_below_the_verdicts_minimum_says_so_before_training() -> None:
    settings = TrainingSettings(steps=10, batch_size=2, group_size=4)
    budget = 1800.0
    sizing = size_training(
        settings,
        seconds_per_episode=52.7,
        budget_s=budget - 400,
        reserve_s=300,
        margin_s=SAFETY_SHARE * budget,
    )
    assert sizing.steps < MIN_STEPS and sizing.batch_size == 1
    assert f"fewer than the {MIN_STEPS} the train-reward verdict needs" in sizing.note
    enough = size_training(settings, seconds_per_episode=12.8, budget_s=budget - 271, reserve_s=276)
    assert "verdict needs" not in enough.note


# ------------------------------------------------------------------------------ issue 33, part 5


def test_a_research_dry_run_that_cannot_answer_refuses_in_one_line_with_the_budget(tmp_path: Path) -> None:
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    question = "find the best learning rate on gsm8k"
    dry = CliRunner().invoke(app, ["research", question, "--dry-run", *common])
    assert dry.exit_code == 1, dry.output
    (line,) = dry.output.strip().splitlines()
    match = re.search(r"give --budget-minutes ([\d.]+) or more$", line)
    assert line.startswith("error: not one stage of the study fits the budget of 60 min: ") and match
    real = CliRunner().invoke(app, ["research", question, *common])
    assert real.exit_code == 1 and real.output.strip() == line
    assert not (tmp_path / ".a3r").exists()  # refused before a thread or a store exists
    fits = CliRunner().invoke(
        app, ["research", question, "--dry-run", "--budget-minutes", match.group(1), *common]
    )
    assert fits.exit_code == 0 and "not one stage" not in fits.output
    # the budget it names runs a best-value question's least answer: two values on every seed, not one
    assert "its cheapest configurations that can answer (lr = " in line and " on 2 seeds each " in line
    (coarse,) = [row for row in fits.output.splitlines() if row.strip().startswith("coarse:")]
    planned = re.search(r"lr ∈ \{([^}]*)\}", coarse)
    assert planned is not None
    dropped = re.search(r"would drop lr values \{([^}]*)\}", fits.output)
    kept = len(planned.group(1).split(", ")) - (len(dropped.group(1).split(", ")) if dropped else 0)
    assert kept >= 2, fits.output


def test_the_re_plan_prices_a_run_at_what_its_configuration_measured_and_says_the_price_it_cut() -> None:
    """fresh-s5 #7: B = 1 seed 0 ran in 75 s at 3.3 s per training episode; its seed 1, priced at
    20 s + 16 training and 32 held-out episodes at 3.3 s ≈ 178 s, was refused with 142 s left, and the line
    said "0 runs left fit the 142 s left; each run priced at no less than the measured 75 s per run"."""
    plan = _plan()
    one = _sweep(1, 0, [0.3] * 4, seconds_per_episode=3.3).model_copy(update={"wall_s": 75.0})
    progress = StudyProgress(
        plan=plan,
        stage=Stage.coarse,
        outcomes=[_preflight(), one],
        baseline=BASELINE,
        dropped=[2.0, 4.0, 8.0],
    )
    (second,) = [s for s in sweep_specs(plan, [1], "coarse") if s.seed == 1]
    assert estimate_run_s(second, seconds_per_episode=3.3, eval_episodes=32) > 142  # the speed's price
    assert refit_queue(progress, [second], StageBudget(left_s=142, eval_episodes=32)) is None  # it starts
    cut = refit_queue(progress, [second], StageBudget(left_s=60, eval_episodes=32))
    assert cut is not None and cut.queue == [] and (1.0, 1) in cut.unstarted
    assert "0 runs left fit the 60 s left" in cut.lines[0]
    assert "batch_size = 1, seed 1 is priced at 75 s" in cut.lines[0]
    # a dropped configuration's line names what its seeds together cost
    fresh = StudyProgress(plan=plan, stage=Stage.coarse, outcomes=[_preflight(), one], baseline=BASELINE)
    down = refit_queue(fresh, sweep_specs(plan, [8], "coarse"), StageBudget(left_s=142, eval_episodes=32))
    assert down is not None and (8.0, 0) in down.unstarted
    assert re.search(
        r"the cheapest dropped configuration, batch_size = 8 on 2 seeds .* is priced at \d+ s", down.lines[0]
    )
    # the up-front drop at the preflight's speed says what was kept and what the cheapest dropped cost
    upfront = next_stage(
        StudyProgress(plan=plan, outcomes=[_preflight(seconds_per_episode=0.9)]), StageBudget(217, 32)
    )
    (line,) = [x for x in upfront.lines if x.startswith("budget: dropped")]
    assert re.search(
        r"the kept runs are priced at \d+ s; the cheapest dropped configuration, batch_size = 2", line
    )


def test_a_vibe_dry_run_below_the_verdicts_minimum_steps_warns(tmp_path: Path) -> None:
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db"), "--dry-run"]
    short = CliRunner().invoke(app, ["vibe", "train arithmetic", "--steps", "3", *common])
    assert short.exit_code == 0, short.output
    (warning,) = [line for line in short.output.splitlines() if "train-reward verdict" in line]
    assert warning.startswith(f"  warning: 3 steps < the {MIN_STEPS} steps the train-reward verdict needs")
    enough = CliRunner().invoke(app, ["vibe", "train arithmetic", "--steps", str(MIN_STEPS), *common])
    assert "train-reward verdict" not in enough.output


def test_the_re_plan_prices_a_run_at_its_measured_wall_time_and_never_starts_one_that_cannot_finish() -> None:
    """Issue 33, the H200 re-run: each coarse run cost 80-87 s (server and vLLM start, held-out
    evaluation), its 16 episodes at the measured 0.3 s each ≈ 10 s; the re-plan kept "2 runs left fit the
    159 s left", and the second began with 66 s left and was cancelled at step 0."""
    plan = _plan()

    def ran(value: float, seed: int, wall_s: float) -> RunOutcome:
        return _sweep(value, seed, [0.3] * 4, seconds_per_episode=0.3).model_copy(update={"wall_s": wall_s})

    # after B = 1 seed 0 (80 s), 249 s left: B = 1 seed 1 (80 s) and B = 2 (2 × 80 s) fit, B = 4 does not
    first = StudyProgress(
        plan=plan, stage=Stage.coarse, outcomes=[_preflight(), ran(1, 0, 80.0)], baseline=BASELINE
    )
    queue = [s for s in sweep_specs(plan, [1, 2, 4], "coarse") if (s.value, s.seed) != (1, 0)]
    down = refit_queue(first, queue, StageBudget(left_s=249, eval_episodes=32))
    assert down is not None and [(s.value, s.seed) for s in down.queue] == [(1, 1), (2, 0), (2, 1)]
    assert down.dropped == [4] and down.unstarted == [(4.0, 0), (4.0, 1)]
    assert "no less than the measured 80 s per run (median of the 1 run that ran" in down.lines[0]
    # after B = 2 seed 0 (87 s), 66 s left: B = 2 seed 1 would not finish, so it never starts
    last = StudyProgress(
        plan=plan,
        stage=Stage.coarse,
        outcomes=[_preflight(), ran(1, 0, 80.0), ran(1, 1, 85.0), ran(2, 0, 87.0)],
        baseline=BASELINE,
        dropped=[4.0],
    )
    cut = refit_queue(last, sweep_specs(plan, [2], "coarse")[1:], StageBudget(left_s=66, eval_episodes=32))
    assert cut is not None and cut.queue == [] and cut.goto == "reporter"
    assert (2.0, 1) in cut.unstarted
    assert "did not start batch_size = 2, seed 1 (it would not finish)" in cut.lines[0]
