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
by all threads: a thread lock orders them and only the owning thread holds the file lock, re-entrantly
(nested holds in one thread count up, the file is locked once). A forked child closes its inherited copy
of the descriptor, so it never keeps its parent's lock alive. The lock is advisory: processes that do not
take it (another program, an ``hf`` server) are not ordered by it. Processes that see different temp
directories (``TMPDIR``, separate containers) do not see each other's lock.

Uncontended, a hold costs one open, one flock, one small write and one close (measured 10-16 µs on the
shared CPU box, ``tests/engine/test_gpu_lock.py``); a nested hold costs no system call.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
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
"""The longest pause between two tries of the file lock (tries start at 1 ms and double)."""
LOCK_PREFIX = "swarm-gpu-"
HOLDER_LINE_BYTES = 64
"""The holder line's fixed size in the lock file."""


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
    """One GPU's host-wide lock as seen by this process: thread-ordered, re-entrant per thread.

    Use `hold` (or `acquire`/`release` in the same thread). Get the process's shared instance with
    `gpu_lock` rather than building several for one file: two instances in one process would each take
    the file lock, and one thread holding both would wait for itself.

    Args:
        path: the lock file (created if missing; never deleted: a waiter may have it open).
        label: how messages name the GPU.
    """

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label
        self._threads = threading.Lock()
        """Orders this process's threads; held by the owner for as long as it holds the file lock."""
        self._owner: int | None = None
        self._depth = 0
        self._fd: int | None = None

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
        """Take the lock for the calling thread, waiting up to ``timeout_s`` seconds; a thread that holds
        it already just counts one more hold. A wait over `ANNOUNCE_AFTER_S` is logged once (warning).

        Args:
            purpose: what the hold is for (``"start"``, ``"step"``, ``"stop"``, …): written into the lock
                file for waiters' messages.
            timeout_s: the longest wait, for other threads of this process and other processes together.

        Raises:
            GpuLockTimeout: still held elsewhere after ``timeout_s``; one line naming the holder's pid and
                purpose where it wrote them, and the lock file.
        """
        me = threading.get_ident()
        if self._owner == me:  # only this thread sets or clears its own ident
            self._depth += 1
            return
        timeout_s = max(0.0, timeout_s)
        started = time.monotonic()
        deadline = started + timeout_s
        if not self._threads.acquire(timeout=min(ANNOUNCE_AFTER_S, timeout_s)):
            log.warning("waiting for this server's own vLLM start/step on %s (another thread)", self.label)
            if not self._threads.acquire(timeout=max(0.0, deadline - time.monotonic())):
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
        """Drop one hold of the calling thread; the last one unlocks the file and lets the next thread in.

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
                os.close(fd)  # the kernel drops the flock with the last descriptor
        finally:
            self._threads.release()

    # -- internals -------------------------------------------------------------------------------------
    def _lock_file(self, purpose: str, started: float, deadline: float, timeout_s: float) -> int:
        fd = _open_lock_file(self.path)
        try:
            pause, announced = 0.001, False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pass
                now = time.monotonic()
                if now >= deadline:
                    raise GpuLockTimeout(
                        f"{self.label}: GPU lock {self.path} still held after {timeout_s:g} s by "
                        f"{_holder(fd)}; is a server stuck starting or stepping?"
                    )
                if not announced and now - started > ANNOUNCE_AFTER_S:
                    log.warning(
                        "waiting for another server's vLLM start/step on %s: held by %s",
                        self.label,
                        _holder(fd),
                    )
                    announced = True
                time.sleep(min(pause, deadline - now))
                pause = min(2 * pause, MAX_POLL_S)
            with contextlib.suppress(OSError):  # a read-only lock file (another user's) keeps no holder line
                os.pwrite(fd, _holder_line(purpose), 0)
            if announced:
                log.warning("got the GPU lock on %s after %.1f s", self.label, time.monotonic() - started)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _forget_after_fork(self) -> None:
        """In a forked child: drop the inherited descriptor (the parent's lock stays the parent's) and
        start unheld (the holding thread does not exist here)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._threads, self._owner, self._depth, self._fd = threading.Lock(), None, 0, None


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
