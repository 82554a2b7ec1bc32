"""The host-wide per-GPU lock (`swarm.engine.gpu_lock`) with real processes and threads, and the points
where the ``vllm`` engine takes it.

Holders in other processes are forked children (``multiprocessing`` fork context, the module already
imported) that take the lock themselves; a probe from a fresh open file description tells whether the
file is locked, as another server would see it. No GPU: the lock is keyed by a made-up identity in the
test's own directory.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarm.engine import gpu_lock as gl
from swarm.engine.gpu_lock import GpuIdentity, GpuLock, GpuLockTimeout, gpu_identity, gpu_lock, lock_path

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def lock(tmp_path: Path) -> GpuLock:
    return gpu_lock(GpuIdentity(key="GPU-test", label="GPU 7"), directory=tmp_path)


def locked_elsewhere(path: Path) -> bool:
    """Whether another open file description (another server) would find the file locked now."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _hold_in_child(directory: str, hold_s: float, held: Any) -> None:
    lock = gpu_lock(GpuIdentity(key="GPU-test", label="GPU 7"), directory=Path(directory))
    with lock.hold("start"):
        held.set()
        time.sleep(hold_s)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Any]:
    """Start a child process that holds the lock for ``hold_s`` seconds; returns it once it holds."""
    children: list[Any] = []

    def start(hold_s: float) -> Any:
        held = FORK.Event()
        child = FORK.Process(target=_hold_in_child, args=(str(tmp_path), hold_s, held), daemon=True)
        child.start()
        assert held.wait(20), "the child never took the lock"
        children.append(child)
        return child

    yield start
    for child in children:
        if child.is_alive():
            child.kill()
        child.join(5)


# -- identity ---------------------------------------------------------------------------------------------
def test_the_gpu_is_named_by_its_uuid_else_its_physical_index() -> None:
    uuid = "1f2e3d4c-0000-1111-2222-333344445555"
    assert gpu_identity(0, uuid, None) == GpuIdentity(f"GPU-{uuid}", "GPU 0")
    assert gpu_identity(1, f"GPU-{uuid}", "3,5") == GpuIdentity(f"GPU-{uuid}", "GPU 5")
    # without a UUID: the physical index behind CUDA_VISIBLE_DEVICES, so two servers that see the same
    # GPU as cuda:0 and cuda:1 still share one lock
    assert gpu_identity(0, None, "5").key == gpu_identity(1, None, "3, 5").key == "index-5"
    assert gpu_identity(0, None, None) == GpuIdentity("index-0", "GPU 0")
    assert gpu_identity(0, None, f"GPU-{uuid}") == GpuIdentity(f"GPU-{uuid}", f"GPU GPU-{uuid}")
    assert gpu_identity(0, None, "MIG-a/b c").key == "MIG-a_b_c"  # only safe file-name characters
    assert lock_path("GPU-x", Path("/somewhere")) == Path("/somewhere/swarm-gpu-GPU-x.lock")


def test_one_lock_per_gpu_per_process(tmp_path: Path) -> None:
    a = gpu_lock(GpuIdentity("GPU-a", "GPU 0"), directory=tmp_path)
    assert gpu_lock(GpuIdentity("GPU-a", "GPU 0"), directory=tmp_path) is a
    assert gpu_lock(GpuIdentity("GPU-b", "GPU 1"), directory=tmp_path) is not a


# -- other processes ----------------------------------------------------------------------------------------
def test_a_second_process_waits_for_the_holder_and_says_so_once(
    lock: GpuLock, holder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    child = holder(2.0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=gl.__name__), lock.hold("step", timeout_s=30):
        waited = time.monotonic() - started
        assert lock.held
    assert 1.0 < waited < 15
    waiting = [r.getMessage() for r in caplog.records if "waiting for another server" in r.getMessage()]
    assert waiting == [
        f"waiting for another server's vLLM start/step on GPU 7: held by pid {child.pid} (start)"
    ]
    child.join(5)


def test_the_timeout_fails_in_one_line_naming_the_holder(lock: GpuLock, holder: Any) -> None:
    child = holder(60.0)
    with pytest.raises(GpuLockTimeout) as caught:
        lock.acquire("step", timeout_s=0.3)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"GPU 7: GPU lock {lock.path} still held after 0.3 s by pid {child.pid} (start); "
        "is a server stuck starting or stepping?"
    )
    assert not lock.held  # nothing half-taken: the next try starts clean
    with pytest.raises(GpuLockTimeout):
        lock.acquire("step", timeout_s=-1)  # a negative timeout is no wait, not threading's "forever"
    child.kill()
    child.join(5)
    with lock.hold("step", timeout_s=5):
        assert lock.held


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_holder_releases_the_lock_at_once(lock: GpuLock, holder: Any, sig: int) -> None:
    child = holder(600.0)
    assert locked_elsewhere(lock.path)
    os.kill(child.pid, sig)
    child.join(5)
    started = time.monotonic()
    with lock.hold("start", timeout_s=5):
        assert time.monotonic() - started < 1.0


def _run_and_sleep(running: Any) -> None:
    running.set()
    time.sleep(30)


def test_a_forked_child_does_not_keep_its_parents_lock(lock: GpuLock) -> None:
    """vLLM's engine core is spawned (a non-inheritable descriptor closes on exec); a plain fork copies
    the descriptor, and without `_forget_after_fork` the lock would outlive the parent's release."""
    lock.acquire("start")
    running = FORK.Event()
    child = FORK.Process(target=_run_and_sleep, args=(running,), daemon=True)
    child.start()
    try:
        assert running.wait(20)  # the child is past its at-fork handlers
        lock.release()
        assert child.is_alive()
        assert not locked_elsewhere(lock.path)
    finally:
        child.kill()
        child.join(5)


# -- first come, first served ------------------------------------------------------------------------------
def wait_until(condition: Any, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def tickets(lock: GpuLock) -> list[str]:
    return sorted(p.name for p in lock.queue.glob("*.ticket"))


def _take_and_report(directory: str, name: str, got: Any) -> None:
    lock = gpu_lock(GpuIdentity(key="GPU-test", label="GPU 7"), directory=Path(directory))
    with lock.hold("step", timeout_s=60):
        got.put(name)
        time.sleep(0.05)


def test_waiting_processes_get_the_lock_in_arrival_order(lock: GpuLock, holder: Any, tmp_path: Path) -> None:
    child = holder(600.0)
    got = FORK.Queue()
    waiters = []
    for i, name in enumerate(["a", "b", "c"], start=1):
        waiter = FORK.Process(target=_take_and_report, args=(str(tmp_path), name, got), daemon=True)
        waiter.start()
        waiters.append(waiter)
        wait_until(lambda i=i: len(tickets(lock)) == i, f"{name} queues")
    os.kill(child.pid, signal.SIGKILL)
    try:
        assert [got.get(timeout=20) for _ in waiters] == ["a", "b", "c"]
    finally:
        for waiter in waiters:
            waiter.join(10)
    assert tickets(lock) == [] and not locked_elsewhere(lock.path)


def _hold_again_and_again(directory: str, hold_s: float, holds: Any, stop: Any) -> None:
    lock = gpu_lock(GpuIdentity(key="GPU-test", label="GPU 7"), directory=Path(directory))
    while not stop.is_set():
        with lock.hold("step", timeout_s=60):  # released and asked for again at once, as step after step
            holds.value += 1
            time.sleep(hold_s)


def test_a_process_that_takes_the_lock_again_at_once_does_not_starve_a_waiter(
    lock: GpuLock, tmp_path: Path
) -> None:
    hold_s = 0.5
    holds, stop = FORK.Value("i", 0), FORK.Event()
    greedy = FORK.Process(
        target=_hold_again_and_again, args=(str(tmp_path), hold_s, holds, stop), daemon=True
    )
    greedy.start()
    try:
        wait_until(lambda: holds.value == 1, "the greedy process holds")
        started = time.monotonic()
        with lock.hold("start", timeout_s=10):
            waited = time.monotonic() - started
            assert holds.value == 1  # its next hold queued behind this one
        assert waited < hold_s + 1.0
        wait_until(lambda: holds.value >= 2, "the greedy process gets its turn back")
    finally:
        stop.set()
        greedy.join(10)
        if greedy.is_alive():
            greedy.kill()


def test_a_killed_waiters_ticket_does_not_block_the_queue(lock: GpuLock, holder: Any, tmp_path: Path) -> None:
    child = holder(600.0)
    doomed = FORK.Process(target=_take_and_report, args=(str(tmp_path), "doomed", FORK.Queue()), daemon=True)
    doomed.start()
    wait_until(lambda: len(tickets(lock)) == 1, "the doomed waiter queues")
    (dead,) = tickets(lock)
    assert doomed.pid is not None
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(5)
    assert (lock.queue / dead).exists()  # kill -9 runs no clean-up: only the ticket's flock is gone
    got: list[float] = []

    def wait() -> None:
        with lock.hold("step", timeout_s=20):
            got.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: not (lock.queue / dead).exists(), "the next waiter removes the dead ticket")
    assert len(tickets(lock)) == 1  # its own, behind nobody
    killed_at = time.monotonic()
    os.kill(child.pid, signal.SIGKILL)
    thread.join(20)
    assert got and got[0] - killed_at < 1.0
    assert tickets(lock) == []


def test_a_waiter_that_gives_up_leaves_the_queue(lock: GpuLock, holder: Any) -> None:
    holder(600.0)
    with pytest.raises(GpuLockTimeout):
        lock.acquire("step", timeout_s=0.3)
    assert tickets(lock) == [] and not list(lock.queue.iterdir())


def test_a_waiter_that_cannot_queue_still_gets_the_lock(lock: GpuLock, holder: Any) -> None:
    """An unwritable queue (here: a file in its place) degrades to polling the lock file unqueued."""
    lock.queue.write_text("not a directory")
    holder(0.5)
    with lock.hold("step", timeout_s=10):
        assert lock.held


def test_waiting_threads_get_the_lock_in_arrival_order(lock: GpuLock) -> None:
    order: list[str] = []
    lock.acquire("step")
    threads = []
    for i, name in enumerate(["a", "b", "c"], start=1):

        def take(name: str = name) -> None:
            with lock.hold("step", timeout_s=20):
                order.append(name)

        thread = threading.Thread(target=take)
        thread.start()
        threads.append(thread)
        wait_until(lambda i=i: len(lock._threads._waiting) == i, f"thread {name} waits")
    lock.release()
    for thread in threads:
        thread.join(20)
    assert order == ["a", "b", "c"]


def test_a_thread_that_takes_the_lock_again_at_once_does_not_starve_another(lock: GpuLock) -> None:
    hold_s, holds, stop = 0.3, [0], threading.Event()

    def greedy() -> None:
        while not stop.is_set():
            with lock.hold("step", timeout_s=20):
                holds[0] += 1
                time.sleep(hold_s)

    thread = threading.Thread(target=greedy)
    thread.start()
    try:
        wait_until(lambda: holds[0] == 1, "the greedy thread holds")
        started = time.monotonic()
        with lock.hold("start", timeout_s=10):
            waited = time.monotonic() - started
            assert holds[0] == 1
        assert waited < hold_s + 1.0
    finally:
        stop.set()
        thread.join(10)


def test_a_child_forked_while_its_parent_waits_does_not_keep_the_lock(lock: GpuLock, holder: Any) -> None:
    """The waiting thread's descriptors (lock file, ticket) are copied into a child forked meanwhile; the
    parent's later flock belongs to that shared file description, so the child must close its copies."""
    child = holder(600.0)
    released = threading.Event()

    def wait_hold_release() -> None:
        with lock.hold("step", timeout_s=20):
            pass
        released.set()

    waiting = threading.Thread(target=wait_hold_release)
    waiting.start()
    wait_until(lambda: len(tickets(lock)) == 1, "the parent queues")
    running = FORK.Event()
    forked = FORK.Process(target=_run_and_sleep, args=(running,), daemon=True)
    forked.start()
    try:
        assert running.wait(20)
        os.kill(child.pid, signal.SIGKILL)
        waiting.join(20)
        assert released.is_set() and forked.is_alive()
        assert not locked_elsewhere(lock.path) and tickets(lock) == []
    finally:
        forked.kill()
        forked.join(5)


# -- threads and re-entrancy -------------------------------------------------------------------------------
def test_nested_holds_in_one_thread_lock_the_file_once(lock: GpuLock) -> None:
    with lock.hold("step"):
        with lock.hold("weight load"), lock.hold("wake"):
            assert locked_elsewhere(lock.path)
        assert lock.held and locked_elsewhere(lock.path)  # the outer hold still has it
    assert not lock.held and not locked_elsewhere(lock.path)


def test_another_thread_of_the_process_waits_its_turn(lock: GpuLock) -> None:
    order: list[str] = []
    first_holds, second_tried = threading.Event(), threading.Event()

    def first() -> None:
        with lock.hold("step"):
            first_holds.set()
            second_tried.wait(10)
            time.sleep(0.2)
            order.append("first done")

    def second() -> None:
        first_holds.wait(10)
        second_tried.set()
        with lock.hold("stop"):
            order.append("second holds")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert order == ["first done", "second holds"]
    assert not locked_elsewhere(lock.path)


def test_a_thread_that_times_out_behind_another_says_which(lock: GpuLock) -> None:
    errors: list[BaseException] = []
    with lock.hold("step"):

        def late() -> None:
            try:
                lock.acquire("start", timeout_s=0.2)
            except GpuLockTimeout as exc:
                errors.append(exc)

        thread = threading.Thread(target=late)
        thread.start()
        thread.join(10)
        with pytest.raises(RuntimeError, match="does not hold it"):
            threading_release(lock)
    assert len(errors) == 1 and "another thread of this process" in str(errors[0])


def threading_release(lock: GpuLock) -> None:
    """Release ``lock`` from another thread and re-raise what that raised."""
    raised: list[BaseException] = []

    def release() -> None:
        try:
            lock.release()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=release)
    thread.start()
    thread.join(10)
    if raised:
        raise raised[0]


def test_an_uncontended_hold_costs_microseconds(lock: GpuLock) -> None:
    rounds = 2000
    started = time.perf_counter()
    for _ in range(rounds):
        with lock.hold("step"):
            pass
    outer_us = (time.perf_counter() - started) / rounds * 1e6
    with lock.hold("step"):
        started = time.perf_counter()
        for _ in range(rounds):
            with lock.hold("wake"):
                pass
        nested_us = (time.perf_counter() - started) / rounds * 1e6
    print(f"uncontended hold+release: {outer_us:.1f} µs; nested: {nested_us:.2f} µs")
    assert outer_us < 1000 and nested_us < 100  # a step takes seconds; a generous bound for a busy box


# -- where the vllm engine takes it --------------------------------------------------------------------------
class RecordingLLM:
    """Stands in for vLLM's ``AsyncLLM`` (not installed on the CPU box): records each call the engine
    makes and whether the GPU lock file was locked while it ran (checked as another server would)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls: list[tuple[str, bool]] = []

    def _note(self, name: str) -> None:
        self.calls.append((name, locked_elsewhere(self.path)))

    async def sleep(self, level: int) -> None:
        self._note(f"sleep({level})")

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self._note(f"wake_up({tags})")

    async def collective_rpc(self, method: str, args: tuple[Any, ...]) -> list[Any]:
        self._note(method)
        return [None]

    async def reset_prefix_cache(self) -> None:
        self._note("reset_prefix_cache")

    def shutdown(self) -> None:
        self._note("shutdown")


@pytest.fixture
def engine(lock: GpuLock) -> Iterator[Any]:
    """A `VLLMEngine` past its constructor (which needs vLLM and a GPU), driving a `RecordingLLM` on its
    real private loop thread."""
    from swarm.engine.vllm import VLLMEngine

    engine: Any = VLLMEngine.__new__(VLLMEngine)
    engine._gpu, engine._sleep_hold, engine._sleeping, engine._closed = lock, False, False, False
    engine.policy_version = 0
    engine._loop = asyncio.new_event_loop()
    engine._thread = threading.Thread(target=engine._loop.run_forever, daemon=True)
    engine._thread.start()
    engine._llm = RecordingLLM(lock.path)
    yield engine
    engine.close()
    engine._loop.close()


def test_the_engine_holds_the_lock_from_sleep_to_wake(engine: Any, lock: GpuLock) -> None:
    engine.release_memory()
    assert lock.held and locked_elsewhere(lock.path)  # the trainer steps on lent memory: nobody profiles
    engine.restore_memory()
    assert not lock.held and not locked_elsewhere(lock.path)
    engine._push("swarm_load_ipc_weights", b"", 1)  # awake: the push moves no device memory
    assert engine._llm.calls == [
        ("sleep(1)", True),
        ("wake_up(None)", True),
        ("swarm_load_ipc_weights", False),
        ("reset_prefix_cache", False),
    ]
    assert engine.policy_version == 1


def test_a_push_while_asleep_wakes_under_the_lock_and_ends_the_sleep_hold(engine: Any, lock: GpuLock) -> None:
    engine.release_memory()
    engine._push("swarm_load_ipc_buckets", b"", 2)
    assert not engine._sleeping and not lock.held and not locked_elsewhere(lock.path)
    assert all(locked for _, locked in engine._llm.calls)
    engine.restore_memory()  # after the push: nothing asleep, nothing held
    assert len(engine._llm.calls) == 5 and not lock.held


def test_a_step_waits_for_another_servers_start(engine: Any, lock: GpuLock, holder: Any) -> None:
    holder(1.5)
    started = time.monotonic()
    engine.release_memory()
    assert time.monotonic() - started > 1.0
    engine.restore_memory()


def test_a_failed_sleep_or_wake_does_not_keep_the_lock(engine: Any, lock: GpuLock) -> None:
    async def fail(*_: Any, **__: Any) -> None:
        raise RuntimeError("CUDA error")

    engine._llm.sleep = fail
    with pytest.raises(RuntimeError):
        engine.release_memory()
    assert not lock.held and not engine._sleeping
    engine._llm.sleep = RecordingLLM.sleep.__get__(engine._llm)
    engine.release_memory()
    engine._llm.wake_up = fail
    with pytest.raises(RuntimeError):
        engine.restore_memory()
    assert not lock.held and engine._sleeping


def test_close_frees_the_gpu_under_the_lock_even_inside_its_sleep_window(engine: Any, lock: GpuLock) -> None:
    engine.release_memory()
    engine.close()
    assert engine._llm.calls[-1] == ("shutdown", True)
    assert not lock.held and not locked_elsewhere(lock.path)


def test_a_stop_waits_briefly_then_frees_the_gpu_without_the_lock(
    engine: Any, lock: GpuLock, holder: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopping server must not outwait a3r's stop grace (then SIGKILL) behind another server's long
    start: it waits `STOP_TIMEOUT_S`, warns, and stops."""
    import swarm.engine.vllm as vllm_module

    monkeypatch.setattr(vllm_module, "STOP_TIMEOUT_S", 0.3)
    child = holder(60.0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=vllm_module.__name__):
        engine.close()
    assert time.monotonic() - started < 10
    assert engine._llm.calls == [("shutdown", True)]  # locked: by the other server, not by this one
    assert any("stopping vLLM without the GPU lock" in r.getMessage() for r in caplog.records)
    assert not lock.held
    child.kill()
