"""The watch rules of a run (`a3r.swarmops.monitoring.judge`): hung vs slow, the step target, the
client's end, early stop and the wall-time budget. Pure: no server, no client, no clock."""

from __future__ import annotations

from a3r.swarmops.monitoring import (
    BUSY_CPU_SHARE,
    STARTUP_GRACE_S,
    TRAINING_HANG_FACTOR,
    Observation,
    RunEnd,
    RunWatch,
    Verdict,
    WatchRules,
    final_end,
    judge,
)

HANG = 100.0  # > STARTUP_GRACE_S, so the grace does not hide the plain hang rule


def _watch(step: int = 0) -> RunWatch:
    return RunWatch.begin(started=0.0, now=0.0, step=step, cpu_s=None)


def _alive(rules: WatchRules, *, step: int = 0) -> RunWatch:
    """A watch whose client has shown a sign of life: two polls with different counters."""
    watch = judge(_watch(step), Observation(now=1.0, step=step, finished=0), rules).watch
    watch = judge(watch, Observation(now=2.0, step=step, finished=1), rules).watch
    assert watch.alive_seen and watch.last_change == 2.0
    return watch


def _run(rules: WatchRules, watch: RunWatch, *observations: Observation) -> Verdict:
    verdict = Verdict(watch)
    for obs in observations:
        verdict = judge(verdict.watch, obs, rules)
        if verdict.end is not None:
            break
    return verdict


def test_no_progress_for_hang_after_is_hung() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=10_000.0)
    watch = _alive(rules)
    same = Observation(now=2.0 + HANG, step=0, finished=1)
    assert judge(watch, same, rules).end is None  # exactly at the limit: not yet
    verdict = judge(watch, Observation(now=2.0 + HANG + 1, step=0, finished=1), rules)
    assert verdict.end is not None and verdict.end.status == "hung"
    assert verdict.end.reason == "no progress (step 0, 1 episodes, no event) for 101 s"


def test_any_counter_change_is_progress() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=10_000.0)
    base = Observation(now=2.0, step=0, finished=1)
    for change in (
        {"finished": 2},
        {"aborted": 1},
        {"open": 3},
        {"client_records": 4},
        {"event_seq": 5},
        {"model_calls": 6},
        {"step": 1},
    ):
        watch = _alive(rules)
        moved = Observation(**{**base.__dict__, "now": 2.0 + HANG + 1, **change})
        verdict = judge(watch, moved, rules)
        assert verdict.end is None, change
        assert verdict.watch.last_change == 2.0 + HANG + 1, change


def test_a_computing_server_is_slow_not_hung() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=10_000.0)
    watch = judge(
        RunWatch.begin(started=0.0, now=0.0, step=0, cpu_s=10.0),
        Observation(now=1.0, server_cpu_s=10.0),
        rules,
    ).watch
    watch = judge(watch, Observation(now=2.0, finished=1, server_cpu_s=10.0), rules).watch
    later = 2.0 + HANG + 1
    busy = Observation(now=later, finished=1, server_cpu_s=10.0 + (BUSY_CPU_SHARE + 0.1) * (later - 2.0))
    verdict = judge(watch, busy, rules)
    assert verdict.end is None and verdict.watch.last_change == later
    idle = Observation(now=later, finished=1, server_cpu_s=10.0 + (BUSY_CPU_SHARE - 0.1) * (later - 2.0))
    verdict = judge(watch, idle, rules)
    assert verdict.end is not None and verdict.end.status == "hung"


def test_training_or_draining_stretches_the_hang_limit() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=100_000.0)
    for state in ("training", "draining"):
        watch = _alive(rules)
        inside = Observation(now=2.0 + HANG * TRAINING_HANG_FACTOR, finished=1, state=state)
        assert judge(watch, inside, rules).end is None
        past = Observation(now=3.0 + HANG * TRAINING_HANG_FACTOR, finished=1, state=state)
        verdict = judge(watch, past, rules)
        assert verdict.end is not None and verdict.end.status == "hung"


def test_startup_grace_until_the_client_shows_life() -> None:
    rules = WatchRules(hang_after_s=10.0, budget_s=10_000.0)  # shorter than the grace
    watch = judge(_watch(), Observation(now=1.0), rules).watch
    assert not watch.alive_seen
    assert judge(watch, Observation(now=1.0 + STARTUP_GRACE_S), rules).end is None
    verdict = judge(watch, Observation(now=2.0 + STARTUP_GRACE_S), rules)
    assert verdict.end is not None and verdict.end.status == "hung"
    # Once alive, the plain limit applies.
    watch = judge(watch, Observation(now=2.0, finished=1), rules).watch
    verdict = judge(watch, Observation(now=13.0, finished=1), rules)
    assert verdict.end is not None and verdict.end.status == "hung"


def test_slow_is_reported_once_per_step_and_not_stopped() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=100_000.0, target=5)
    verdict = _run(
        rules,
        _watch(),
        *(Observation(now=t, step=0, finished=int(t)) for t in (1.0, 50.0, HANG + 1)),
    )
    assert verdict.end is None and verdict.slow_s == HANG + 1
    again = judge(verdict.watch, Observation(now=HANG + 20, step=0, finished=500), rules)
    assert again.end is None and again.slow_s is None  # noted once
    stepped = judge(again.watch, Observation(now=HANG + 30, step=1, finished=501), rules)
    assert stepped.stepped and stepped.watch.last_step == 1 and not stepped.watch.slow_noted
    slow_again = judge(stepped.watch, Observation(now=2 * HANG + 31, step=1, finished=502), rules)
    assert slow_again.slow_s == HANG + 1


def test_no_slow_report_without_a_target() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=100_000.0, target=None)
    verdict = _run(rules, _watch(), *(Observation(now=t, finished=int(t)) for t in (1.0, 50.0, HANG + 1)))
    assert verdict.end is None and verdict.slow_s is None


def test_step_target_reached_finishes() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=10_000.0, target=3)
    verdict = _run(rules, _watch(), Observation(now=1.0, step=2), Observation(now=2.0, step=3))
    assert verdict.end is not None and verdict.end.status == "finished"
    assert verdict.end.reason == "reached step 3" and verdict.stepped and verdict.watch.last_step == 3


def test_unreachable_status_keeps_the_last_step() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=10_000.0, target=3)
    verdict = _run(rules, _watch(), Observation(now=1.0, step=2), Observation(now=2.0, step=None))
    assert verdict.end is None and verdict.watch.last_step == 2 and not verdict.stepped


def test_budget_spent_ends_the_run() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=50.0)
    watch = RunWatch.begin(started=0.0, now=0.0, step=0, cpu_s=None)
    assert judge(watch, Observation(now=50.0, finished=1), rules).end is None
    verdict = judge(watch, Observation(now=51.0, step=2, finished=1), rules)
    assert verdict.end is not None and verdict.end.status == "budget"
    assert verdict.end.reason == "wall-time budget of 50 s spent at step 2"


def test_a_run_whose_last_step_ends_after_the_budget_stop_completed() -> None:
    """Found by a fresh user: a run that trained all its steps was listed as "cancelled (budget)": the
    budget stopped it while its last step was under way, and that step then ended (read after the
    held-out evaluation). It completed; only a run stopped short is cancelled."""
    from a3r.study.runs import status_text

    rules = WatchRules(hang_after_s=HANG, budget_s=50.0, target=10)
    verdict = judge(_alive(rules, step=9), Observation(now=51.0, step=9, finished=40), rules)
    assert verdict.end is not None and verdict.end.status == "budget"
    done = final_end(verdict.end, last_step=10, target=10)
    assert done.status == "finished" and status_text(done.status) == "finished"
    assert done.reason.startswith(
        "reached step 10: all steps trained (the budget of 50 s spent at step 9 while"
    )
    short = final_end(verdict.end, last_step=9, target=10)  # stopped short: cancelled, as before
    assert short == verdict.end and status_text(short.status) == "cancelled (budget)"
    assert final_end(verdict.end, last_step=10, target=None) == verdict.end  # no step target: no claim
    hung = final_end(RunEnd("hung", "no progress"), last_step=10, target=10)
    assert hung.status == "hung"


def test_the_budget_also_reports_slowness_first() -> None:
    rules = WatchRules(hang_after_s=10.0, budget_s=50.0, target=5)
    watch = _alive(rules)
    verdict = judge(watch, Observation(now=51.0, finished=9), rules)
    assert verdict.end is not None and verdict.end.status == "budget" and verdict.slow_s == 51.0


def test_client_exit() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=10_000.0)
    crashed = judge(_watch(), Observation(now=1.0, client_exit=2), rules)
    assert crashed.end is not None and crashed.end.status == "crashed"
    assert crashed.end.reason == "swarm run exited with code 2"
    done = judge(_watch(), Observation(now=1.0, client_exit=0), rules)
    assert done.end is not None and (done.end.status, done.end.reason) == (
        "finished",
        "client finished its tasks",
    )


def test_tasks_exhausted_waits_for_the_server_to_finish_its_step() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=100_000.0, target=10)
    watch = _alive(rules, step=4)
    # Idle server, nothing pending: quiet for min(hang_after_s, 60) s ends the run.
    quiet = judge(watch, Observation(now=63.0, step=4, finished=1, client_exit=0), rules)
    assert quiet.end is not None and quiet.end.status == "finished"
    assert quiet.end.reason == "tasks exhausted at step 4 (target 10)"
    assert judge(watch, Observation(now=61.0, step=4, finished=1, client_exit=0), rules).end is None
    # Pending episodes (or a step under way): wait TRAINING_HANG_FACTOR × hang_after_s.
    pending = Observation(now=63.0, step=4, finished=1, client_exit=0, pending=2)
    assert judge(watch, pending, rules).end is None
    late = Observation(
        now=3.0 + HANG * TRAINING_HANG_FACTOR, step=4, finished=1, client_exit=0, state="training"
    )
    verdict = judge(watch, late, rules)
    assert verdict.end is not None and verdict.end.reason.startswith("tasks exhausted")


def test_early_stop_on_a_live_problem_while_the_client_runs() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=10_000.0, early_stop=True)
    verdict = judge(_watch(), Observation(now=1.0, live_problem="zero signal in 2 groups"), rules)
    assert verdict.end is not None
    assert (verdict.end.status, verdict.end.reason) == ("needs_attention", "zero signal in 2 groups")
    off = WatchRules(hang_after_s=HANG, budget_s=10_000.0, early_stop=False)
    assert judge(_watch(), Observation(now=1.0, live_problem="zero signal"), off).end is None


def test_a_dead_server_crashes_the_run_and_leaves_the_watch() -> None:
    rules = WatchRules(hang_after_s=HANG, budget_s=10_000.0, target=3)
    watch = _alive(rules, step=1)
    verdict = judge(watch, Observation(now=5.0, server_exit=-9), rules)
    assert verdict.end is not None and verdict.end.status == "crashed"
    assert verdict.end.reason == "swarm server exited with code -9"
    assert verdict.watch == watch
