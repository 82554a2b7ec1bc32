"""A host-wide advisory lock per GPU, held by vLLM engines while they measure or move GPU memory.

Why: vLLM sizes its KV cache at start-up from two readings of the GPU's *device-wide* free memory,
taken before and after a profiling forward pass, and assumes nothing else on the GPU changes meanwhile.
If another process frees memory in between, vLLM 0.25.1 aborts the start (``AssertionError: Error in
memory profiling. Initial free memory X, current free memory Y. This happens when other processes
sharing the same container release GPU memory …``; vllm-project/vllm#56830, open; the opt-in
``VLLM_MEMORY_PROFILER_ALLOW_FREE_MEMORY_INCREASE`` of vllm#45534 is not in 0.25.1). If another process
takes memory in between, vLLM counts it as its own and sizes the KV cache wrong (vllm#55169). Our
servers move memory often: every training step puts the engine to sleep (KV cache freed) and wakes it,
and every stop frees everything. So a vLLM server starting beside a training one failed at random.

What: every `swarm.engine.vllm.VLLMEngine` on a GPU takes this lock around its start-up (memory check,
profiling, KV-cache allocation, CUDA graphs), around each sleep → step → wake window, around its first
load of the trainer's copy and around its shutdown. Those operations then never overlap across servers
on one GPU; sampling and the weight push (which moves no device memory) never take it.

How: ``fcntl.flock`` on ``<tempdir>/swarm-gpu-<identity>.lock``, the identity being the GPU's UUID (the
same physical GPU whatever ``CUDA_VISIBLE_DEVICES`` says), else its physical index. flock locks belong to
an open file description and the kernel drops them when the holder's last descriptor closes, so a
crashed holder (even ``kill -9``) frees the lock at once. Inside a process one `GpuLock` per GPU is shared
by all threads: a first-come-first-served thread queue orders them and only the owning thread holds the
file lock, re-entrantly (nested holds in one thread count up, the file is locked once). A forked child
closes its inherited copies of the descriptors (held or still waiting), so it never keeps its parent's
lock or queue place alive. The lock is advisory: processes that do not take it (another program, an
``hf`` server) are not ordered by it. Processes that see different temp directories (``TMPDIR``,
separate containers) do not see each other's lock.

Fair: first come, first served across processes too. A bare flock polled with pauses is not: a process
that releases and asks again at once (a start, then its first sleep → wake; step after step) retakes
the free lock before a waiter's next poll, and a server's start once waited 3.5 min behind others' starts
and steps until its deadline killed it. So a process that finds the lock taken, or others queued, joins a
queue: a ticket file in ``swarm-gpu-<identity>.queue/`` beside the lock file, named
``<CLOCK_MONOTONIC ns>-<pid>-<n>.ticket`` (system-wide clock; names sort in arrival order), made under a
``.pending`` name, flocked by its owner and renamed into place. A waiter tries the lock file only while no
live ticket is older than its own, and removes its ticket once it holds the lock; a holder that asks again
queues behind those already waiting. A ticket is live while its owner's flock on it is: a probe that can
take a shared flock on it finds a dead owner (``kill -9`` too) and removes it, so a dead waiter never
blocks the queue. A waiter that times out removes its ticket. The first waiter polls the lock file
(pauses from 1 ms, doubling to `MAX_HEAD_POLL_S`, 5 ms), so a handover costs up to 5 ms; those behind it
look at the queue at most every `MAX_POLL_S` (50 ms). Limits: a live waiter that stops polling (stopped
with SIGSTOP, a debugger) holds up those behind it until their timeouts; a waiter that cannot write the
queue directory (another user's, a read-only file system) polls the lock file unqueued, as before; arrival
order is the moment a waiter made its ticket (threads of a process queue among themselves first).
No library does this: ``filelock``, ``portalocker`` and ``fasteners`` poll or block on a plain lock (a
blocking flock has no order either: the kernel wakes every waiter and the fastest wins); ``syngate`` (a
file queue) frees a crashed holder's place only after a freshness time-out; ``dflockd`` (FIFO) is a
server with leases.

Cost: uncontended, a hold is one directory listing (the queue: missing or empty), one open, one flock, one
small write and one close; a nested hold costs no system call. Measured with
``tests/engine/test_gpu_lock.py``'s loop on the shared 2-core CPU box, best of several runs: 5.3 µs
before the queue, 7.4 µs after (8.6 µs once a queue directory exists); under load (load average ~4)
9.3, 13.2 and 16.6 µs; nested 0.9 µs before and after. A step takes seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import re
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from swarm.errors import SwarmError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1200.0
"""How long a hold waits for another holder: generous, a big model's vLLM start (CUDA graphs, compile)
or a training step can take minutes, and several may queue."""
STOP_TIMEOUT_S = 10.0
"""How long a stopping engine waits for the lock before freeing its memory without it: below the 15 s
a3r gives a stopping server before SIGKILL (``a3r/swarmops/processes.py``), so that waiting never gets a
server killed before it commits its queued finishes (``SwarmRuntime.close`` closes the engine first)."""
ANNOUNCE_AFTER_S = 1.0
"""A wait longer than this is logged, once."""
MAX_POLL_S = 0.05
"""The longest pause between two looks at the queue of a waiter with others ahead (from 1 ms, doubling):
when the one ahead gets the lock, a hold of seconds follows, so noticing late costs nothing."""
MAX_HEAD_POLL_S = 0.005
"""The longest pause between two tries of the file lock by the first waiter (from 1 ms, doubling): the
handover after a release takes 2.5 ms on average; a try is a listing and a flock (a few µs)."""
LOCK_PREFIX = "swarm-gpu-"
HOLDER_LINE_BYTES = 64
"""The holder line's fixed size in the lock file."""
QUEUE_SUFFIX = ".queue"
"""The waiters' queue directory: the lock file's name with this suffix instead of ``.lock``."""
TICKET_SUFFIX = ".ticket"
PENDING_SUFFIX = ".pending"
"""A ticket being made (created and flocked under this name, then renamed into the queue)."""
PENDING_STALE_S = 60.0
"""A ``.pending`` file this old whose flock is free was left by a waiter that died making it: removed."""

_ticket_numbers = itertools.count()
"""This process's ticket counter: the last part of a ticket's name (two tickets of one process in one
nanosecond stay distinct)."""


class GpuLockTimeout(SwarmError, TimeoutError):
    """The GPU lock was still held by another holder when the timeout ran out."""


@dataclass(frozen=True)
class GpuIdentity:
    """Which physical GPU a lock guards.

    Attributes:
        key: the lock file's name part: ``GPU-<uuid>`` (or a MIG id) where known, else ``index-<n>`` with
            the physical index after ``CUDA_VISIBLE_DEVICES``; only ``[A-Za-z0-9_.-]``.
        label: how messages name it: ``"GPU <physical index>"``, or ``"GPU <uuid>"`` where
            ``CUDA_VISIBLE_DEVICES`` names it by UUID.
    """

    key: str
    label: str


def gpu_identity(visible_index: int, uuid: str | None, visible_devices: str | None) -> GpuIdentity:
    """The identity of visible CUDA device ``visible_index`` (pure; `current_gpu_identity` reads it).

    Args:
        visible_index: the device index as this process sees it (``cuda:<i>``).
        uuid: the device's UUID as torch reports it (``8-4-4-4-12`` hex, with or without ``GPU-``), or
            ``None`` where unknown.
        visible_devices: ``CUDA_VISIBLE_DEVICES`` (``None`` when unset): comma-separated physical indices,
            or ``GPU-``/``MIG-`` UUIDs.

    Returns:
        The UUID-based identity where a UUID is known (from torch or from ``CUDA_VISIBLE_DEVICES``), else
        the physical index (``visible_index`` itself when the variable is unset or unreadable).
    """
    entries = [e.strip() for e in visible_devices.split(",")] if visible_devices else []
    entry = entries[visible_index] if visible_index < len(entries) else None
    if entry is not None and not entry.isdigit():  # a UUID or MIG id names the GPU already
        label = f"GPU {entry}"
        physical = visible_index
    else:
        physical = int(entry) if entry is not None else visible_index
        label = f"GPU {physical}"
    if uuid:
        raw: str | None = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    else:
        raw = entry if entry is not None and entry.startswith(("GPU-", "MIG-")) else None
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", raw) if raw else f"index-{physical}"
    return GpuIdentity(key=key, label=label)


def current_gpu_identity(visible_index: int = 0) -> GpuIdentity:
    """`gpu_identity` of ``cuda:<visible_index>`` in this process: its UUID from torch (CUDA must be
    usable; vLLM's engine core serves on visible device 0), else its physical index."""
    import torch

    uuid: str | None = None
    with contextlib.suppress(Exception):  # older torch or a build without device UUIDs: index below
        uuid = str(torch.cuda.get_device_properties(visible_index).uuid) or None
    return gpu_identity(visible_index, uuid, os.environ.get("CUDA_VISIBLE_DEVICES"))


def lock_path(key: str, directory: Path | None = None) -> Path:
    """The lock file of GPU ``key``: ``<directory or the system temp dir>/swarm-gpu-<key>.lock``."""
    return Path(directory or tempfile.gettempdir()) / f"{LOCK_PREFIX}{key}.lock"


class GpuLock:
    """One GPU's host-wide lock as seen by this process: first come, first served, re-entrant per thread.

    Use `hold` (or `acquire`/`release` in the same thread). Get the process's shared instance with
    `gpu_lock` rather than building several for one file: two instances in one process would each take
    the file lock, and one thread holding both would wait for itself.

    Args:
        path: the lock file (created if missing; never deleted: a waiter may have it open).
        label: how messages name the GPU.

    Attributes:
        queue: the waiters' queue directory beside the lock file (``swarm-gpu-<key>.queue``; created on the
            first wait, never deleted): one ``<monotonic ns>-<pid>-<n>.ticket`` file per waiting process.
    """

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.queue = path.with_suffix(QUEUE_SUFFIX)
        self.label = label
        self._threads = _ThreadQueue()
        """Orders this process's threads; held by the owner for as long as it holds the file lock."""
        self._owner: int | None = None
        self._depth = 0
        self._fd: int | None = None
        self._fds: set[int] = set()
        """Every descriptor open for this lock now (the lock file while waiting or holding, the ticket while
        queued): a forked child closes them all."""

    @property
    def held(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident()

    @contextlib.contextmanager
    def hold(self, purpose: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
        """Hold the lock for the ``with`` block (see `acquire`)."""
        self.acquire(purpose, timeout_s)
        try:
            yield
        finally:
            self.release()

    def acquire(self, purpose: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Take the lock for the calling thread, waiting up to ``timeout_s`` seconds in arrival order (other
        threads of this process first in theirs, then other processes' waiters); a thread that holds it
        already just counts one more hold. A wait over `ANNOUNCE_AFTER_S` is logged once (warning).

        Args:
            purpose: what the hold is for (``"start"``, ``"step"``, ``"stop"``, …): written into the lock
                file for waiters' messages.
            timeout_s: the longest wait, for other threads of this process and other processes together.

        Raises:
            GpuLockTimeout: still held elsewhere after ``timeout_s``; one line naming the holder's pid and
                purpose where it wrote them (and how many other waiters were ahead, if any), and the lock
                file.
        """
        me = threading.get_ident()
        if self._owner == me:  # only this thread sets or clears its own ident
            self._depth += 1
            return
        timeout_s = max(0.0, timeout_s)
        started = time.monotonic()
        deadline = started + timeout_s
        if not self._threads.acquire(deadline, started + ANNOUNCE_AFTER_S, self._announce_other_thread):
            raise GpuLockTimeout(
                f"{self.label}: GPU lock {self.path} held by another thread of this process for over "
                f"{timeout_s:g} s"
            )
        try:
            fd = self._lock_file(purpose, started, deadline, timeout_s)
        except BaseException:
            self._threads.release()
            raise
        self._fd, self._owner, self._depth = fd, me, 1

    def release(self) -> None:
        """Drop one hold of the calling thread; the last one unlocks the file and lets the next waiter in.

        Raises:
            RuntimeError: the calling thread does not hold the lock.
        """
        if self._owner != threading.get_ident():
            raise RuntimeError(f"{self.label}: GPU lock released by a thread that does not hold it")
        self._depth -= 1
        if self._depth:
            return
        fd, self._fd, self._owner = self._fd, None, None
        try:
            if fd is not None:
                self._close(fd)  # the kernel drops the flock with the last descriptor
        finally:
            self._threads.release()

    # -- internals -------------------------------------------------------------------------------------
    def _announce_other_thread(self) -> None:
        log.warning("waiting for this server's own vLLM start/step on %s (another thread)", self.label)

    def _lock_file(self, purpose: str, started: float, deadline: float, timeout_s: float) -> int:
        """The lock file's descriptor, flocked: at once where nobody queues and nobody holds it, else after
        queueing a ticket and waiting until no live ticket is older and the flock is free."""
        fd = self._open(_open_lock_file(self.path))
        ticket: tuple[int, str] | None = None
        announced = False
        try:
            if _tickets(self.queue) or not _try_flock(fd, fcntl.LOCK_EX):
                ticket = self._enqueue()
                pause = 0.001
                while True:
                    ahead = 0 if ticket is None else _live_ahead(self.queue, ticket[1])
                    if not ahead and _try_flock(fd, fcntl.LOCK_EX):
                        break
                    now = time.monotonic()
                    if now >= deadline:
                        raise GpuLockTimeout(
                            f"{self.label}: GPU lock {self.path} still held after {timeout_s:g} s by "
                            f"{self._describe_holder(fd, ticket)}; is a server stuck starting or stepping?"
                        )
                    if not announced and now - started > ANNOUNCE_AFTER_S:
                        log.warning(
                            "waiting for another server's vLLM start/step on %s: held by %s",
                            self.label,
                            self._describe_holder(fd, ticket),
                        )
                        announced = True
                    time.sleep(min(pause, deadline - now))
                    pause = min(2 * pause, MAX_POLL_S if ahead else MAX_HEAD_POLL_S)
                if ticket is not None:
                    self._dequeue(ticket)
                    ticket = None
            with contextlib.suppress(OSError):  # a read-only lock file (another user's) keeps no holder line
                os.pwrite(fd, _holder_line(purpose), 0)
            if announced:
                log.warning("got the GPU lock on %s after %.1f s", self.label, time.monotonic() - started)
            return fd
        except BaseException:
            if ticket is not None:
                self._dequeue(ticket)
            self._close(fd)
            raise

    def _enqueue(self) -> tuple[int, str] | None:
        """Queue a ticket (descriptor, file name) named by this moment, flocked for as long as it waits;
        ``None`` where the queue directory cannot be written (another user's with a narrow mode, a
        read-only file system): this waiter then polls the lock file unqueued, as before the queue.

        The file is made and locked under a ``.pending`` name and renamed into place, so no other waiter
        ever sees it unlocked (and takes it for a dead one's)."""
        name = f"{time.monotonic_ns():020d}-{os.getpid()}-{next(_ticket_numbers)}{TICKET_SUFFIX}"
        pending = self.queue / f"{name}{PENDING_SUFFIX}"
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.queue, 0o777)
                with contextlib.suppress(OSError):  # as the lock file: others' umask must not lock them out
                    os.chmod(self.queue, 0o777)
            _remove_stale_pending(self.queue)
            fd = self._open(os.open(pending, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        except OSError as exc:
            log.debug("GPU lock on %s: no ticket in %s (%s); waiting unqueued", self.label, self.queue, exc)
            return None
        queued = False
        try:
            # a new file: only a stale-file sweep (`PENDING_STALE_S`) could hold or remove it meanwhile
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(pending, self.queue / name)
            queued = True
        except OSError as exc:
            log.debug("GPU lock on %s: ticket %s lost (%s); waiting unqueued", self.label, pending, exc)
        finally:
            if not queued:
                with contextlib.suppress(OSError):
                    os.unlink(pending)
                self._close(fd)
        return (fd, name) if queued else None

    def _dequeue(self, ticket: tuple[int, str]) -> None:
        """Remove a ticket of this process: unlinked first, so nobody sees it unlocked."""
        fd, name = ticket
        with contextlib.suppress(OSError):
            os.unlink(self.queue / name)
        self._close(fd)

    def _describe_holder(self, fd: int, ticket: tuple[int, str] | None) -> str:
        """`_holder` of the lock file, with the live waiters queued ahead of ``ticket`` where there are."""
        holder = _holder(fd)
        ahead = _live_ahead(self.queue, ticket[1], count_all=True) if ticket else 0
        return f"{holder}, {ahead} more waiting ahead" if ahead else holder

    def _open(self, fd: int) -> int:
        self._fds.add(fd)
        return fd

    def _close(self, fd: int) -> None:
        self._fds.discard(fd)
        os.close(fd)

    def _forget_after_fork(self) -> None:
        """In a forked child: drop the inherited descriptors (the parent's lock and queue place stay the
        parent's) and start unheld (the holding and waiting threads do not exist here)."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = set()
        self._threads, self._owner, self._depth, self._fd = _ThreadQueue(), None, 0, None


class _ThreadQueue:
    """One process's threads, first come first served (a `threading.Lock` is not fair: a thread that
    releases it and asks again at once usually gets it back before a waiting thread wakes)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._waiting: deque[object] = deque()
        self._taken = False

    def acquire(self, deadline: float, announce_at: float, announce: Callable[[], None]) -> bool:
        """Take it, waiting behind the threads already waiting until ``deadline`` (`time.monotonic`);
        ``announce`` is called once if the wait goes past ``announce_at`` (before the deadline).

        Returns:
            Whether it was taken (``False``: the deadline passed; the place in the queue is given up).
        """
        with self._cond:
            if not self._taken and not self._waiting:
                self._taken = True
                return True
            me = object()
            self._waiting.append(me)

            def my_turn() -> bool:
                return not self._taken and self._waiting[0] is me

            got = False
            try:
                got = self._cond.wait_for(my_turn, min(announce_at, deadline) - time.monotonic())
                if not got and announce_at < deadline:
                    announce()
                    got = self._cond.wait_for(my_turn, deadline - time.monotonic())
            finally:
                self._waiting.remove(me)
                if got:
                    self._taken = True
                elif self._waiting:
                    self._cond.notify_all()  # the next one may be first now
            return got

    def release(self) -> None:
        """Let the first waiting thread in."""
        with self._cond:
            self._taken = False
            if self._waiting:
                self._cond.notify_all()


def _open_lock_file(path: Path) -> int:
    """A descriptor of ``path`` (created, readable and writable by all); read-only where another user
    created it (flock needs no write access). Non-inheritable (``O_CLOEXEC``): a spawned child never
    holds it."""
    flags = os.O_CREAT | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_RDWR, 0o666)
    except PermissionError:
        return os.open(path, flags | os.O_RDONLY)
    with contextlib.suppress(OSError):  # only the creator may; others' umask must not lock them out
        os.fchmod(fd, 0o666)
    return fd


def _holder_line(purpose: str) -> bytes:
    """``"pid <pid> (<purpose>)"`` padded to `HOLDER_LINE_BYTES`: written over the previous holder's line
    in place, because truncating first costs ~3 ms on ext4 (it flushes a file truncated and rewritten)."""
    text = f"pid {os.getpid()} ({purpose})"[: HOLDER_LINE_BYTES - 1]
    return (text.ljust(HOLDER_LINE_BYTES - 1) + "\n").encode()


def _holder(fd: int) -> str:
    """The holder line the current holder wrote (``"pid 123 (start)"``), else ``"another process"``."""
    with contextlib.suppress(OSError):
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if text:
            return text
    return "another process"


def _try_flock(fd: int, operation: int) -> bool:
    """Whether ``flock(fd, operation | LOCK_NB)`` got the lock (``False``: another description holds it)."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _tickets(queue: Path) -> list[str]:
    """The ticket files' names in ``queue``, oldest first (none where it does not exist yet or cannot be
    read)."""
    try:
        names = os.listdir(queue)
    except OSError:
        return []
    return sorted(n for n in names if n.endswith(TICKET_SUFFIX))


def _live_ahead(queue: Path, ticket: str, count_all: bool = False) -> int:
    """How many live tickets are older than ``ticket`` (counting stops at the first unless ``count_all``).

    A ticket is live while its owner holds a flock on it: a shared probe that gets it proves the owner
    dead (its process ended, ``kill -9`` too), and that ticket is removed on the way."""
    live = 0
    for name in _tickets(queue):
        if name >= ticket:
            break
        if _ticket_alive(queue / name):
            live += 1
            if not count_all:
                break
    return live


def _ticket_alive(path: Path) -> bool:
    """Whether ``path``'s owner still holds it; a dead one's ticket is removed. Gone or unreadable (another
    user's, left with a narrow mode) counts as not waiting."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not _try_flock(fd, fcntl.LOCK_SH):  # shared: two probes of one dead ticket do not see each other
            return True
        with contextlib.suppress(OSError):
            os.unlink(path)
        return False
    finally:
        os.close(fd)


def _remove_stale_pending(queue: Path) -> None:
    """Remove ``.pending`` files a waiter left when it died between creating and queueing its ticket
    (microseconds; older than `PENDING_STALE_S` and unlocked)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(queue):
            if name.endswith(PENDING_SUFFIX):
                path = queue / name
                with contextlib.suppress(OSError):
                    if time.time() - path.stat().st_mtime > PENDING_STALE_S:
                        _ticket_alive(path)  # removes it unless its owner holds it


_registry: dict[Path, GpuLock] = {}
_registry_lock = threading.Lock()


def gpu_lock(identity: GpuIdentity | None = None, directory: Path | None = None) -> GpuLock:
    """This process's one `GpuLock` for a GPU (created on first use).

    Args:
        identity: the GPU; ``None`` reads `current_gpu_identity` (visible device 0, where vLLM serves).
        directory: where the lock file lives; ``None`` is the system temp dir (tests pass their own).
    """
    identity = identity or current_gpu_identity()
    path = lock_path(identity.key, directory)
    with _registry_lock:
        lock = _registry.get(path)
        if lock is None:
            lock = _registry[path] = GpuLock(path, identity.label)
        return lock


def _after_fork_in_child() -> None:
    global _registry_lock
    _registry_lock = threading.Lock()
    for lock in _registry.values():
        lock._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "GpuIdentity",
    "GpuLock",
    "GpuLockTimeout",
    "current_gpu_identity",
    "gpu_identity",
    "gpu_lock",
    "lock_path",
]
