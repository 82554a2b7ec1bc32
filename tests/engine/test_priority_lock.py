"""`swarm.engine.priority_lock.PriorityLock`: a `first` caller is served before looping `after_first`
holders; re-entrant; released only by its holder."""

from __future__ import annotations

import threading
import time

import pytest

from swarm.engine.priority_lock import PriorityLock


def test_a_first_caller_waits_for_one_hold_at_most_behind_a_looping_holder() -> None:
    lock = PriorityLock()
    stop = threading.Event()
    holds: list[float] = []

    def loop() -> None:  # takes the lock back at once, hold after hold (the hf worker, queued steps)
        while not stop.is_set():
            with lock.after_first():
                holds.append(time.monotonic())
                time.sleep(0.05)

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        time.sleep(0.2)
        asked = time.monotonic()
        with lock.first():
            got = time.monotonic()
            before = len(holds)
            time.sleep(0.2)  # while held here, the looping thread takes no hold
            assert len(holds) == before
    finally:
        stop.set()
        worker.join(5)
    assert got - asked < 0.5, f"waited {got - asked:.2f} s for a 0.05 s hold"


def test_after_first_is_reentrant_where_the_thread_holds_the_lock_and_release_needs_the_holder() -> None:
    lock = PriorityLock()
    with lock.first(), lock.after_first(), lock:  # one thread, nested: no wait, no deadlock
        assert lock._owner == threading.get_ident()
    assert lock._owner is None
    with pytest.raises(RuntimeError):
        lock.release()
    assert lock.acquire(blocking=False)
    done: list[bool] = []
    other = threading.Thread(target=lambda: done.append(lock.acquire(timeout=0.1)))
    other.start()
    other.join(5)
    assert done == [False]  # held by this thread: another cannot take it
    lock.release()
