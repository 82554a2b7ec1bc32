"""Swarm subprocesses driven by the runner: ``swarm serve``, ``swarm run`` and held-out evaluation.

Generated code (workflows, rewards) runs only in these client subprocesses, never in the a3r process.
Each subprocess writes its combined output to a log file, records its pid in a pid file next to it
(so a resumed a3r can end what a killed one left), and on Linux receives SIGKILL when the a3r process
dies (``PR_SET_PDEATHSIG``), so a ``kill -9`` of a3r leaves no orphan training server behind.

The server's admin token is a fresh random secret per server, handed over in the environment (never on
the command line, where ``ps`` shows it) and kept only in memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from a3r.errors import SwarmProcessError
from a3r.swarmops.credentials import write_admin_token
from swarm.client import ClientError, RetryPolicy, ServeOptions, SwarmClient

__all__ = [
    "ManagedProcess",
    "ServerHandle",
    "end_stale",
    "error_line",
    "free_port",
    "launch",
    "start_server",
    "swarm_command",
]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def console_command(name: str, module: str) -> list[str]:
    """How to invoke console script ``name`` (whose entry point is ``module.main``): the script next to
    this interpreter, else the one on ``PATH``, else ``module.main`` through this Python (a GPU host that
    runs the tree from ``PYTHONPATH`` has no scripts)."""
    script = Path(sys.executable).with_name(name)
    if script.is_file():
        return [str(script)]
    found = shutil.which(name)
    if found:
        return [found]
    return [sys.executable, "-c", f"from {module} import main; main()"]


def swarm_command() -> list[str]:
    """How to invoke the ``swarm`` CLI (`console_command`)."""
    return console_command("swarm", "swarm.cli")


@dataclass
class ManagedProcess:
    """A subprocess with its log file and pid file.

    Attributes:
        name: Short label (``server``, ``client``, ``eval``).
        popen: The process.
        log_path: Combined stdout/stderr.
        pid_path: JSON ``{"pid", "cmd"}`` written at start, removed when it ends.
        log_start: Bytes the log held at the start (an earlier process's output, the log being appended to).
    """

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    pid_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)
    log_start: int = 0
    _log_at_stop: int | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """Exit code, or ``None`` while running."""
        return self.popen.poll()

    def log_text(self, limit: int = 200_000) -> str:
        """The last ``limit`` bytes of the log (decoded, invalid UTF-8 replaced)."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", errors="replace")

    def own_log_text(self, limit: int = 200_000) -> str:
        """What this process wrote by itself, the last ``limit`` bytes: its log from its start up to
        the signal `stop` sent (to its end when it ended by itself, or was never stopped).

        What a process prints after a3r's stop signal (the ``KeyboardInterrupt`` raised wherever the signal
        landed, a library's clean-up failing on the way out) is the stop's doing, never the run's crash; an
        earlier process's output in the same log (a resumed run's) is not this one's.
        """
        try:
            with self.log_path.open("rb") as log:
                log.seek(self.log_start)
                size = None if self._log_at_stop is None else max(0, self._log_at_stop - self.log_start)
                data = log.read() if size is None else log.read(size)
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", errors="replace")

    def stop(self, *, sig: int = signal.SIGINT, grace_s: float = 15.0) -> int | None:
        """Send ``sig``, wait ``grace_s`` seconds, then SIGKILL; returns the exit code.

        Whatever the process left running in its process group (`launch` starts each in its own) is
        then killed: a server killed before it could stop its vLLM engine core would otherwise leave that
        process holding its share of the GPU.
        """
        if self.popen.poll() is None:
            with contextlib.suppress(OSError):  # the output is unbuffered: all it wrote so far is there
                self._log_at_stop = self.log_path.stat().st_size
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.popen.kill()
                self.popen.wait(timeout=30)
        self._end_group()
        self.close()
        return self.popen.returncode

    def _end_group(self) -> None:
        if sys.platform.startswith("linux"):  # launch made the process a group leader there
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait for the end (``None`` on timeout)."""
        try:
            code = self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self.close()
        return code

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        self.pid_path.unlink(missing_ok=True)


def launch(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> ManagedProcess:
    """Start ``argv`` with output appended to ``log_path`` and a pid file ``<log_path>.pid``.

    Raises:
        SwarmProcessError: The executable cannot be started.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pid_path = log_path.with_suffix(".pid")
    log = log_path.open("ab")
    start = log.seek(0, os.SEEK_END)
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    try:
        popen = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=full_env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            start_new_session=sys.platform.startswith("linux"),  # its children form a group `stop` can end
        )
    except OSError as exc:
        log.close()
        raise SwarmProcessError(f"cannot start {name}: {exc.strerror} ({argv[0]})") from None
    pid_path.write_text(json.dumps({"pid": popen.pid, "cmd": list(argv)}), encoding="utf-8")
    return ManagedProcess(
        name=name, popen=popen, log_path=log_path, pid_path=pid_path, _log=log, log_start=start
    )


def end_stale(pid_path: Path) -> bool:
    """End a process a killed a3r left behind, if its pid file says it is still ours.

    The pid is signalled only when ``/proc/<pid>/cmdline`` still matches the recorded command (a
    reused pid is left alone).

    Returns:
        ``True`` when a live process was ended.
    """
    try:
        record = json.loads(pid_path.read_text(encoding="utf-8"))
        pid, cmd = int(record["pid"]), list(record["cmd"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    ended = False
    try:
        live = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if [part.decode(errors="replace") for part in live if part] == cmd:
            os.kill(pid, signal.SIGKILL)
            ended = True
    except (OSError, ProcessLookupError):
        pass
    pid_path.unlink(missing_ok=True)
    return ended


@dataclass
class ServerHandle:
    """A started (or attached) swarm server.

    Attributes:
        url: Root URL, e.g. ``http://127.0.0.1:8123``.
        admin_token: Control-route token (in memory only; ``None`` for an open loopback server).
        process: The subprocess, or ``None`` when attached to an existing server.
        client_token: The client token its ``swarm run`` clients and evaluations send (in memory only;
            ``None``: the environment's ``SWARM_CLIENT_TOKEN``, if any, is inherited).
    """

    url: str
    admin_token: str | None
    process: ManagedProcess | None = None
    client_token: str | None = None

    def client_env(self) -> dict[str, str]:
        """Environment for a client process of this server (the client token, never on a command line)."""
        return {"SWARM_CLIENT_TOKEN": self.client_token} if self.client_token else {}

    def client(self, *, timeout_s: float = 10.0, deadline_s: float = 10.0) -> SwarmClient:
        """A client of this server's control routes that tries once (a busy answer is waited out up to
        ``deadline_s``); close it after use."""
        retry = RetryPolicy(attempts=1, max_wait_s=deadline_s, deadline_s=deadline_s)
        return SwarmClient(self.url, admin_token=self.admin_token, timeout_s=timeout_s, retry=retry)

    def stop(self) -> None:
        """Checkpoint and stop a server we started; an attached one is left running.

        The checkpoint is skipped when the server cannot take one: it trains nothing (409), or it is
        down or does not answer within two minutes.
        """
        if self.process is None:
            return
        if self.process.poll() is None:
            with (
                self.client(timeout_s=120.0) as control,
                contextlib.suppress(ClientError, httpx.TransportError),
            ):
                control.checkpoint()
        self.process.stop(sig=signal.SIGTERM, grace_s=30)


def serve_argv(run_dir: Path, port: int, *, model: str | None, options: ServeOptions | None) -> list[str]:
    """The ``swarm serve`` command line of a started server: ``options`` with its port, run dir and
    model, and the access log on (the run monitor counts model calls in it: `execution._LogCounter`)."""
    placed = {"port": port, "run_dir": run_dir, "access_log": True, **({"model": model} if model else {})}
    return [*swarm_command(), "serve", *(options or ServeOptions()).model_copy(update=placed).argv()]


def start_server(
    run_dir: Path,
    *,
    model: str | None = None,
    options: ServeOptions | None = None,
    port: int | None = None,
    ready_timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
) -> ServerHandle:
    """Start ``swarm serve`` on loopback with its own run dir, a fresh admin token and a fresh client
    token (so that other users of the machine can neither steer it nor open episodes on it); wait until
    ``GET /api/v1/status`` answers.

    Args:
        run_dir: Server run dir (pool, checkpoints, metrics); reusing it resumes.
        model: ``--model`` (``None``: the embedded default).
        options: Further ``swarm serve`` options (training settings).
        port: TCP port (default: a free one).
        ready_timeout_s: How long to wait for the server to answer.
        env: Further environment of the server (e.g. a teacher's ``SWARM_TEACHER_TOKEN``).

    Raises:
        SwarmProcessError: The server exited or did not answer in time (the log tail is in the message).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    end_stale(run_dir.parent / f"{run_dir.name}.server.pid")
    port = port or free_port()
    token = secrets.token_urlsafe(24)
    client_token = secrets.token_urlsafe(24)
    argv = serve_argv(run_dir, port, model=model, options=options)
    process = launch(
        "server",
        argv,
        log_path=run_dir.parent / f"{run_dir.name}.server.log",
        env={**(env or {}), "SWARM_ADMIN_TOKEN": token, "SWARM_CLIENT_TOKEN": client_token},
    )
    handle = ServerHandle(
        url=f"http://127.0.0.1:{port}", admin_token=token, process=process, client_token=client_token
    )
    deadline = time.monotonic() + ready_timeout_s
    with handle.client(timeout_s=5.0) as control:
        while not _answers(control):
            code = process.poll()
            if code is not None:
                process.close()
                reason = error_line(process.log_text(4000))
                raise SwarmProcessError(
                    f"swarm serve exited with code {code}: {reason} (log: {process.log_path})"
                )
            if time.monotonic() > deadline:
                process.stop(sig=signal.SIGKILL)
                raise SwarmProcessError(
                    f"swarm serve did not answer within {ready_timeout_s:g} s (log: {process.log_path})"
                )
            time.sleep(0.25)
    # 0600: for `a3r tui` of the same user, no one else. Written once the server answers: a server
    # refused the run dir (another one serves it: `swarm.server.run_dir_lock`) leaves its token alone.
    write_admin_token(run_dir, token)
    return handle


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
"""A terminal escape sequence (colour, cursor movement)."""

_PROGRESS = re.compile(r"\d+%\||\|\s*\d+/\d+\s*\[")
"""A progress bar's text (tqdm's ``Loading weights:  40%|####   | 2/5 [00:01<...]``)."""


def error_line(log: str) -> str:
    """The last meaningful line of a server's log, for a one-line failure: progress bars (tqdm's
    ``\\r``-rewritten lines) and terminal escapes dropped, the last line starting with ``error:``
    preferred, else the last line left; ``(no output)`` when none is.

    Args:
        log: The log's text (its tail).
    """
    lines = [
        part.strip()
        for raw in _ANSI.sub("", log).splitlines()
        for part in raw.split("\r")
        if part.strip() and not _PROGRESS.search(part)
    ]
    errors = [line for line in lines if line.lower().startswith("error:")]
    return (errors or lines or ["(no output)"])[-1]


def _answers(control: SwarmClient) -> bool:
    """Whether the server answers ``GET /api/v1/status`` yet (not listening yet, or still starting: no)."""
    try:
        control.status()
    except (ClientError, httpx.TransportError):
        return False
    return True
