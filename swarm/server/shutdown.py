"""A ``swarm serve`` process's end: it comes promptly, and nothing it started outlives it.

When the stop begins (before uvicorn waits for the open connections to finish their responses),
:class:`Server` calls its ``on_stop`` hook: ``swarm serve`` ends its long-lived responses there (event
followers, live chat streams: `swarm.server.stopping`), which uvicorn would otherwise wait for forever.
uvicorn's ``timeout_graceful_shutdown`` bounds the wait for whatever else is in flight.

uvicorn answers SIGTERM and SIGINT by shutting the app down (its lifespan closes the engine) and then
raising the signal again, which ends a SIGTERMed process at once. :class:`Server` runs an exit hook in
between, after the app's shutdown and before that re-raise (also when the app never started, or a second
Ctrl-C skipped its shutdown): ``swarm serve`` closes its engine there and ends every child process with
:func:`reap_children`.

Signals: a library may replace the process's SIGTERM handler from C while the app starts. Ray's driver
(``swarm serve --trainer verl``) installs abseil's failure signal handler, which on SIGTERM prints a stack,
calls the previous handler (uvicorn's) and arms a 3 s alarm that aborts the process (SIGABRT), midway
through the app's shutdown: measured on an H100, a stopped verl server died at "Waiting for application
shutdown." and left its Ray processes and vLLM engine core behind (`swarm.train.ray_connection`).
:class:`Server` re-installs the Python handlers of SIGTERM and SIGINT once the app has started, before any
request is answered.

Why reap: a child left behind keeps what it holds (an engine core keeps its share of the GPU) or dies a
moment after the server, racing whoever starts the next server. Measured on the H200, a vLLM server left
one direct child alive after its exit: Python's ``multiprocessing`` resource tracker, which vLLM's
``spawn``-started engine core starts and which only exits once every process holding its pipe has exited
(it ignores SIGTERM and SIGINT). Here its pipe is closed, so it cleans up and exits; every other child gets
SIGTERM; all are waited for (``os.waitpid``, so none is left a zombie for init to reap) up to a bound,
then killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator
from multiprocessing import active_children, resource_tracker
from pathlib import Path

import uvicorn

log = logging.getLogger(__name__)

STARTUP_FAILURE = 3
"""Exit status of a server that never started (uvicorn's)."""

GRACEFUL_SHUTDOWN_S = 10
"""How long ``swarm serve``'s stop waits for requests still in flight (uvicorn's
``timeout_graceful_shutdown``, seconds); those left are then cancelled. Streams end at once (`Server`)."""

POLL_S = 0.01
"""How often :func:`reap_children` looks whether the children have exited (seconds)."""


class Server(uvicorn.Server):
    """``uvicorn.Server`` that calls ``on_stop`` when its stop begins and ``on_exit`` after the app's
    shutdown, before uvicorn re-raises a caught SIGTERM or SIGINT (see the module docstring).

    Args:
        config: uvicorn's configuration.
        on_exit: called once, from the serving thread, whatever ended the server (a signal, a startup
            failure, an exception); it should not raise (what it raises replaces the server's own error).
        on_stop: called on the event loop when the stop begins, after the listeners closed and before
            uvicorn waits for the open connections (what it raises is logged, and the stop goes on).
        on_started: called with the port it listens on once the server has started (the bound port
            where the configuration says 0).
    """

    def __init__(
        self,
        config: uvicorn.Config,
        on_exit: Callable[[], None],
        on_stop: Callable[[], None] | None = None,
        on_started: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._on_stop = on_stop
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        _reinstall_signal_handlers()  # before any request is answered: nothing else runs in between
        if self.started and self._on_started is not None:
            bound = [sock.getsockname() for server in self.servers for sock in server.sockets]
            ports = [name[1] for name in bound if isinstance(name, tuple)]
            if ports:
                self._on_started(int(ports[0]))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._on_stop is not None:
            try:
                self._on_stop()
            except Exception:
                log.exception("ending the long-lived responses failed; the server stops anyway")
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():  # its exit raises the signals it caught
            try:
                yield
            finally:
                self._on_exit()


def _reinstall_signal_handlers() -> None:
    """Put the Python handlers of SIGTERM and SIGINT (uvicorn's) back in front of any a library installed
    from C while the app started: Ray's driver installs abseil's failure signal handler for SIGTERM, which
    aborts the process 3 s after the signal, midway through the app's shutdown (see the module docstring).
    Main thread only (Python sets handlers there; uvicorn captures signals only there)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(sig)
        if handler is not None:  # None: not installed from Python, nothing to put back
            signal.signal(sig, handler)


def child_pids() -> list[int]:
    """The live (or not yet reaped) child processes of this process: from ``/proc`` on Linux, else those
    that :mod:`multiprocessing` started."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return [p.pid for p in active_children() if p.pid is not None]
    me, found = os.getpid(), []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # the name may hold spaces and ')'
        except (OSError, IndexError):
            continue  # exited while listed
        if int(fields[1]) == me:
            found.append(int(stat.parent.name))
    return sorted(found)


def _stop_resource_tracker() -> None:
    """Close this process's end of the multiprocessing resource tracker's pipe: the tracker then unlinks
    what was leaked and exits (it ignores SIGTERM). It is reaped with the other children."""
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    lock = getattr(tracker, "_lock", None)
    if tracker is None or lock is None:
        return
    with lock:
        fd = getattr(tracker, "_fd", None)
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.close(fd)
        tracker._fd = None
        tracker._pid = None  # it is reaped below, not by the tracker's own (blocking) stop


def _reaped(pid: int) -> bool:
    """Whether child ``pid`` has exited, reaping it when it has (also when it is not our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # reaped elsewhere (its Popen or Process object) or not ours
    return done == pid


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait(pids: list[int], deadline: float) -> list[int]:
    """Reap ``pids`` until they have all exited or ``deadline`` (monotonic) passed; the ones left."""
    left = list(pids)
    while True:
        left = [pid for pid in left if not _reaped(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def reap_children(timeout_s: float = 10.0) -> list[int]:
    """End and reap every child process of this one, for a process about to exit.

    The multiprocessing resource tracker's pipe is closed, every other child gets SIGTERM, and all are
    reaped (``os.waitpid``) as they exit; those alive after ``timeout_s`` seconds get SIGKILL and up to
    5 s more. Returns at once when there is no child.

    Returns:
        The pids that had to be killed (empty when every child exited by itself or on SIGTERM).
    """
    _stop_resource_tracker()
    pids = child_pids()
    if not pids:
        return []
    _signal(pids, signal.SIGTERM)
    stubborn = _wait(pids, time.monotonic() + timeout_s)
    if stubborn:
        log.warning(
            "killing %d child process(es) alive %g s after the server stopped: %s",
            len(stubborn),
            timeout_s,
            stubborn,
        )
        _signal(stubborn, signal.SIGKILL)
        left = _wait(stubborn, time.monotonic() + 5.0)
        if left:
            log.error("child process(es) %s survived SIGKILL (uninterruptible?)", left)
    return stubborn


def run(
    config: uvicorn.Config,
    on_exit: Callable[[], None],
    on_stop: Callable[[], None] | None = None,
    on_started: Callable[[int], None] | None = None,
) -> None:
    """Serve as ``uvicorn.run`` does for one process (Ctrl-C ends it quietly; a server that never started
    exits with uvicorn's status 3), with ``on_started`` given the bound port, ``on_stop`` run when the
    stop begins and ``on_exit`` before a caught signal is re-raised (:class:`Server`)."""
    server = Server(config, on_exit, on_stop, on_started)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)
