"""One server per run dir: ``swarm serve`` holds an exclusive lock on ``<run dir>/server.lock`` for its
whole life.

Two servers on one run dir both append to ``events.jsonl`` (duplicate ``seq`` numbers), both train from
``pool.db`` and both checkpoint: each one's restart logic then sees the other's work as lost
(``pool.rewound``, ``train.rewound``). The lock is ``fcntl.flock`` on a file inside the run dir, taken
before the server loads or opens anything; the operating system releases it when the process ends,
however it ends (kill -9 included), so a restart works at once. The file stays (removing it would let a
server lock a file another one is about to open); it holds the holder's pid and port, read only by a
server refused the lock (and by ``swarm serve --check``, `held_by`), to name the holder in its error. A
server started with ``--port 0`` writes port 0 at first and its bound port once it listens
(:meth:`RunDirLock.set_port`); a refusal in between says the port is not known yet.

The run dir is private: the lock makes it mode 0700 (created so, or tightened when it exists), since
``pool.db`` holds every episode's prompts, completions, rewards and owner; ``swarm serve`` also sets its
umask to 077 before it takes the lock, so every file it writes there (the pool, ``events.jsonl``,
checkpoints) is 0600 (a fresh user found them 0644 in a 0755 dir, readable by any local user).

Readers need no lock: ``swarm`` commands that read a run dir (SQLite's own locking covers ``pool.db``)
keep working while a server runs. A child process forked by the server (not spawned: spawning, and
``subprocess``, start it without the descriptor) holds the lock as long as it lives.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from swarm.errors import SwarmError

LOCK_NAME = "server.lock"
"""The lock file's name inside the run dir."""

RUN_DIR_MODE = 0o700
"""The run dir's mode once a server holds it: its owner only (module docstring)."""

PRIVATE_UMASK = 0o077
"""The umask ``swarm serve`` runs under, so what it writes in the run dir is its owner's only (0600 files)."""


def make_private(run_dir: Path) -> None:
    """Create ``run_dir`` (and missing parents) with mode `RUN_DIR_MODE`, or tighten it to that mode when it
    exists with group or other bits; a dir this user cannot chmod (not its owner) is left as it is.

    Raises:
        OSError: the run dir cannot be created.
    """
    run_dir.mkdir(mode=RUN_DIR_MODE, parents=True, exist_ok=True)
    if run_dir.stat().st_mode & 0o077:
        with contextlib.suppress(OSError):
            run_dir.chmod(RUN_DIR_MODE)


class RunDirInUse(SwarmError):
    """Another live process holds the run dir's lock (its message names the dir and the holder)."""

    status_code = 409
    error_type = "run_dir_in_use"


class RunDirLock:
    """The exclusive lock of one run dir, held until :meth:`release` or the process's end.

    Args:
        run_dir: the run dir (created when missing; made private, `make_private`).
        port: the port the server will listen on, written for a refused server's message (0: unknown).

    Raises:
        RunDirInUse: another process holds the lock; nothing in the run dir was changed.
        OSError: the run dir or its lock file cannot be created or opened.
    """

    def __init__(self, run_dir: Path, port: int = 0) -> None:
        make_private(run_dir)
        self.path = run_dir / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by exec'd children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirInUse(in_use(run_dir, holder)) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self.set_port(port)

    def set_port(self, port: int) -> None:
        """Write the holder's port (the one it listens on once bound, for ``--port 0``) into the lock file."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, json.dumps({"pid": os.getpid(), "port": port}).encode() + b"\n", 0)

    def release(self) -> None:
        """Release the lock (idempotent); the process's end releases it too."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the only descriptor of the open file releases its flock


def in_use(run_dir: Path, holder: str) -> str:
    """The one line that refuses a run dir ``holder`` (`held_by`'s words) serves."""
    return f"--run-dir {run_dir} is in use by another swarm serve ({holder})"


def held_by(run_dir: Path) -> str | None:
    """Who holds ``run_dir``'s lock (``"pid N, port P"``, as in :class:`RunDirInUse`'s message), or
    ``None`` when no live process does. Creates and changes nothing (``swarm serve --check``)."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no lock file (never served) or unreadable: nobody to name
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # granted unless a server holds it exclusively
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)  # releases the shared lock where it was granted
    return None


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says: ``"pid N, port P"`` (``port not known yet`` while a server
    started with ``--port 0`` has not bound its port)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0))
        pid, port = int(holder["pid"]), int(holder.get("port") or 0)
    except (OSError, ValueError, TypeError, KeyError):
        return "pid unknown"  # it has not written its pid yet
    where = f"pid {pid}, port {port}" if port else f"pid {pid}, port not known yet (--port 0, still starting)"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:  # it died; a process it forked still holds the lock (and what it had)
        return f"{where}, which has exited: a process it forked holds the lock"
    except OSError:
        pass  # alive, another user's
    return where
