"""A budget stop is a cancellation in every state a run can be in (issue 33, part 2): while its client
is still starting (importing), during a smoke or training episode, and during a held-out evaluation.
The processes are real subprocesses stopped the way the runner stops them (`ManagedProcess.stop`,
SIGINT); their logs then hold a ``KeyboardInterrupt`` traceback, which is our stop, not a crash.
Crashes stay the run's own failures, with their traceback."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from a3r.study.analysis import DiagnosisKind, detect_all, detect_crash
from a3r.study.runs import STORE_STATUS, RunOutcome, status_text
from a3r.swarmops.monitoring import Observation, RunWatch, WatchRules, judge
from a3r.swarmops.processes import launch
from memory import RunStatus

# Each program prints a marker once it is in the state, then waits there until it is stopped.
_STATES = {
    # a client still importing its libraries when the budget ends (the H200 study's B = 2 seed 1)
    "start-up": "import time\nprint('importing', flush=True)\ntime.sleep(60)\n",
    # an episode under way in the client's event loop (smoke and training runs run the same loop)
    "smoke": (
        "import asyncio\nasync def episode():\n    print('episode', flush=True)\n    await asyncio.sleep(60)\n"
        "asyncio.run(episode())\n"
    ),
    "training": (
        "import asyncio\nasync def step():\n    while True:\n        print('step', flush=True)\n"
        "        await asyncio.sleep(0.2)\nasyncio.run(step())\n"
    ),
    # a library handling an exception of its own (an optional import's fallback) when the signal lands: the
    # log holds the ImportError's traceback, "During handling of the above exception…", the KeyboardInterrupt
    "optional-import": (
        "try:\n    import a3r_no_such_module\nexcept ImportError:\n    import time\n"
        "    print('fallback', flush=True)\n    time.sleep(60)\n"
    ),
    # the client's runner: its slots are tasks of an asyncio.TaskGroup, whose stop prints exception groups
    "task-group": (
        "import asyncio\nasync def slot():\n    await asyncio.sleep(60)\nasync def slots():\n"
        "    async with asyncio.TaskGroup() as group:\n        for _ in range(2):\n"
        "            group.create_task(slot())\n        print('slots', flush=True)\nasyncio.run(slots())\n"
    ),
    # the held-out evaluator's attempts under way at once (`a3r.swarmops.evaluate` runs them as tasks)
    "evaluation": (
        "import asyncio\nasync def attempts():\n    print('attempt', flush=True)\n"
        "    await asyncio.gather(*(asyncio.sleep(60) for _ in range(4)))\n"
        "asyncio.run(attempts())\n"
    ),
}


def _stopped_log(tmp_path: Path, state: str) -> str:
    proc = launch(state, [sys.executable, "-c", _STATES[state]], log_path=tmp_path / f"{state}.log")
    deadline = time.monotonic() + 30
    while not proc.log_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.log_text().strip(), "the child never reached its state"
    proc.stop(grace_s=10)
    return proc.log_text()


@pytest.mark.parametrize("state", sorted(_STATES))
def test_a_budget_stop_in_every_state_is_no_crash(tmp_path: Path, state: str) -> None:
    log = _stopped_log(tmp_path, state)
    assert "Traceback" in log and ("KeyboardInterrupt" in log or "CancelledError" in log), log
    if state == "optional-import":  # the whole log, as a3r read it before it knew when it sent the signal
        assert "ModuleNotFoundError" in log and "During handling of the above exception" in log, log
    # the runner passes no exit code for a run it stopped itself (`execution._conclude`)
    found = detect_all(rows=[], episodes=[], group_size=4, log_text=log, exit_code=None)
    assert [d for d in found if d.kind is DiagnosisKind.crash] == []


def test_what_a_client_prints_after_the_stop_signal_is_not_its_own(tmp_path: Path) -> None:
    """`ManagedProcess.own_log_text`: the log from the process's start to a3r's stop signal. A traceback
    printed before the signal is kept (the run's own failure); whatever the stop makes it print is not, and
    neither is an earlier process's output in the same log (a resumed run's client appends to it)."""
    log_path = tmp_path / "client.log"
    log_path.write_text(
        'Traceback (most recent call last):\n  File "x", line 1\nValueError: an earlier run\n'
    )
    program = (
        "import signal, time, traceback\n"
        "def on_stop(*_):\n    raise RuntimeError('clean-up failed on the way out')\n"
        "signal.signal(signal.SIGINT, on_stop)\n"
        "try:\n    {}[1]\nexcept KeyError:\n    traceback.print_exc()\n"
        "print('running', flush=True)\ntime.sleep(60)\n"
    )
    proc = launch("client", [sys.executable, "-c", program], log_path=log_path)
    deadline = time.monotonic() + 30
    while "running" not in proc.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.stop(grace_s=10)
    whole, own = proc.log_text(), proc.own_log_text()
    assert "an earlier run" in whole and "RuntimeError: clean-up failed" in whole, whole
    assert "an earlier run" not in own and "RuntimeError" not in own and "KeyError: 1" in own, own
    (crash,) = detect_crash(own, exit_code=None)
    assert crash.evidence["tracebacks"] == 1 and "KeyError" in crash.summary
    # a process that ends by itself keeps all it wrote
    ended = launch("client", [sys.executable, "-c", "print('done')"], log_path=tmp_path / "client.log")
    assert ended.wait(30) == 0 and ended.own_log_text().strip() == "done"


def test_the_runs_own_failure_is_still_a_crash_with_its_traceback(tmp_path: Path) -> None:
    proc = launch(
        "client",
        [sys.executable, "-c", "import json\njson.loads('{not json')\n"],
        log_path=tmp_path / "own.log",
    )
    code = proc.wait(30)
    (crash,) = detect_crash(proc.log_text(), exit_code=code)
    assert "JSONDecodeError" in crash.summary
    assert "JSONDecodeError" in str(crash.evidence["traceback_tail"])
    # a stop after an own failure keeps the own failure
    both = proc.log_text() + 'Traceback (most recent call last):\n  File "x", line 1\nKeyboardInterrupt\n'
    (kept,) = detect_crash(both, exit_code=None)
    assert "JSONDecodeError" in kept.summary and kept.evidence["tracebacks"] == 1


def test_a_task_groups_own_failure_is_a_crash_named_by_its_error(tmp_path: Path) -> None:
    """A failing slot of the client's runner ends it with an exception group (PEP 654), whose lines start
    with ``|``: the crash names the sub-exception, and an error chained from the group counts once."""
    program = (
        "import asyncio\nasync def bad():\n    raise AttributeError('no text')\n"
        "async def slots():\n    async with asyncio.TaskGroup() as group:\n        group.create_task(bad())\n"
        "try:\n    asyncio.run(slots())\nexcept ExceptionGroup as group:\n"
        "    raise RuntimeError('the runner gave up') from group\n"
    )
    proc = launch("client", [sys.executable, "-c", program], log_path=tmp_path / "group.log")
    code = proc.wait(30)
    log = proc.own_log_text()
    assert "Exception Group Traceback" in log and "direct cause" in log, log
    (crash,) = detect_crash(log, exit_code=code)
    assert crash.evidence["tracebacks"] == 1 and "RuntimeError: the runner gave up" in crash.summary
    # the group alone, with output after it: named by its sub-exception, not by the next line
    group_only = log.split("\nThe above exception")[0] + "\nREADY\n"
    (alone,) = detect_crash(group_only, exit_code=None)
    assert "AttributeError: no text" in alone.summary, alone.summary


@pytest.mark.parametrize(
    ("state", "target", "observation"),
    [
        # start-up: the client has shown no sign of life yet
        ("start-up", 5, Observation(now=50.0, step=0, finished=0)),
        # smoke: no step target, episodes flow
        ("smoke", None, Observation(now=50.0, step=0, finished=3)),
        # training: a step is under way on the server
        ("training", 5, Observation(now=50.0, step=2, finished=9, state="training")),
    ],
)
def test_the_watch_ends_every_state_as_a_budget_cancellation(
    state: str, target: int | None, observation: Observation
) -> None:
    rules = WatchRules(hang_after_s=600.0, budget_s=40.0, target=target)
    watch = RunWatch.begin(started=0.0, now=0.0, step=0, cpu_s=None)
    end = judge(watch, observation, rules).end
    assert end is not None and end.status == "budget", (state, end)
    assert STORE_STATUS[end.status] is RunStatus.cancelled
    assert status_text(end.status) == "cancelled (budget)"


def test_a_preflight_evaluation_the_budget_stopped_is_a_cancellation() -> None:
    from a3r.swarmops.execution import _Evaluation, _preflight_end

    status, reason = _preflight_end(
        _Evaluation(None, "evaluation stopped after 30 s", 30.0, None, timed_out=True)
    )
    assert status == "budget" and STORE_STATUS[status] is RunStatus.cancelled
    assert reason.startswith("the budget stopped it")
    outcome = RunOutcome(key="preflight", run_id=1, purpose="preflight", status=status, reason=reason)
    assert status_text(outcome.status) == "cancelled (budget)"
