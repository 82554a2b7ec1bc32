"""This process's connection to Ray, for verl's worker group: opened with ``ray.init``, closed with the server.

``swarm serve --trainer verl`` connects to Ray (`swarm.train.verl_backend.ray_worker_group`): it joins
the cluster ``--ray-address`` (or ``RAY_ADDRESS``) names, or else starts a local Ray, whose head
(``gcs_server``, ``raylet``, the dashboard agent, the runtime-env agent, Ray's reaper) are children of
the server's process and whose workers (``ray::SwarmActorWorker``: the actor's weights and AdamW state
on the GPU, ``ray::IDLE``) are children of the raylet.

**Why close explicitly.** ``swarm serve`` ends a SIGTERMed process by re-raising the signal with its
default action (`swarm.server.shutdown`), so Ray's own ``atexit`` ``ray.shutdown`` never runs. Measured on
an H100 (``bench/multi_gpu.py --gpus 1``), 15 processes of a stopped server's session outlived it (raylet,
gcs_server, dashboard, the actor, six ``ray::IDLE``, the vLLM engine core, …). :meth:`RayConnection.close`
kills the worker group's actors (``ray.kill``, no restart) and, when this process called ``ray.init``,
calls ``ray.shutdown``: for a Ray this process started, that ends the head's processes (the raylet ends
its workers) and waits for them; for a joined cluster it only disconnects (the cluster and its other jobs
go on). Both are bounded by a timeout.

**Signals.** Connecting a driver installs Ray's failure signal handler (abseil's, installed by Ray's
``logging.cc``) for SIGTERM among the crash signals, in place of the process's own handler. On SIGTERM
it prints ``*** SIGTERM received …`` and a stack, calls the previous handler, and arms ``alarm(3)``, which
aborts the process (SIGABRT, exit status 134) three seconds later, whatever its graceful shutdown is
doing (ray-project/ray#64830; measured here: a driver whose shutdown after SIGTERM takes 6 s is aborted
3 s in, status 134; with its Python handler re-installed after ``ray.init`` it finishes and exits 0). That is how a stopped
verl server died during its app's shutdown, before anything closed. On the main thread ``ray.init`` also
replaces the Python SIGTERM handler with one that calls ``sys.exit``. :meth:`RayConnection.open` puts
back the Python handlers of SIGTERM and SIGINT that were there when it runs on the main thread; off the
main thread (``swarm serve`` builds its trainer in a worker thread) Python cannot set a handler, and
`swarm.server.shutdown.Server` re-installs its own once the app has started.

Ray is an optional extra (``a3r[verl]``), imported when a connection opens.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["RAY_CLOSE_TIMEOUT_S", "RayClosed", "RayConnection"]

RAY_CLOSE_TIMEOUT_S = 5.0
"""How long :meth:`RayConnection.close` waits for Ray to stop (seconds): inside a3r's 15 s between its
SIGTERM and its SIGKILL, with room for the engine's close and the reaping of children that follow."""

KEPT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals whose Python handlers :meth:`RayConnection.open` keeps in front of Ray's."""


@dataclass(frozen=True)
class RayClosed:
    """What :meth:`RayConnection.close` did."""

    actors: int
    """Actors killed (``ray.kill``)."""
    stopped_ray: bool
    """This process had started the Ray it was connected to, and its processes were ended."""
    disconnected: bool
    """This process called ``ray.shutdown`` (it had called ``ray.init``)."""
    seconds: float
    """Wall time of the close, in seconds (≤ the timeout, plus a few ms)."""
    timed_out: bool
    """``ray.shutdown`` was still running at the timeout (left running in a daemon thread)."""
    error: str | None = None
    """What ``ray.kill`` or ``ray.shutdown`` raised (``Type: message``), if anything."""

    @property
    def message(self) -> str:
        """One line saying what was freed, for the server's ``trainer.closed`` event."""
        what = f"{self.actors} Ray actor(s) killed"
        if self.stopped_ray:
            what += ", the local Ray this process started stopped"
        elif self.disconnected:
            what += ", disconnected from the Ray cluster"
        if self.timed_out:
            return f"{what}: ray.shutdown still running after {self.seconds:.1f} s (left behind)"
        if self.error is not None:
            return f"{what}: {self.error}"
        return f"{what} in {self.seconds:.1f} s"


class RayConnection:
    """This process's connection to Ray, and whether it opened it (and started the Ray behind it).

    Use :meth:`open`; :meth:`close` once the actors are no longer needed.

    Args:
        initialized_here: this connection called ``ray.init`` (its :meth:`close` calls ``ray.shutdown``).
        started_ray: that ``ray.init`` started a local Ray (its head's processes are this process's
            children) rather than joining a running cluster.
    """

    def __init__(self, *, initialized_here: bool, started_ray: bool) -> None:
        self.initialized_here = initialized_here
        self.started_ray = started_ray
        self._closed = False

    @classmethod
    def open(
        cls, address: str | None, *, runtime_env: dict[str, Any] | None = None, **options: Any
    ) -> RayConnection:
        """Connect this process to Ray, as ``ray.init(address, runtime_env=…, **options)`` does: join
        ``address`` (``auto``, ``host:port``, ``ray://host:port``), or with ``None`` the cluster
        ``RAY_ADDRESS`` names, else start a local Ray (Ray's rules). A process already connected (a test,
        a benchmark) keeps its connection, which is not this object's to close.

        On the main thread, the Python handlers of SIGTERM and SIGINT are re-installed after ``ray.init``
        (in front of Ray's, see the module docstring).

        Raises:
            ConnectionError: ``ray.init`` found no cluster at ``address``.
        """
        import ray

        if ray.is_initialized():
            return cls(initialized_here=False, started_ray=False)
        with _keeping_signal_handlers():
            ray.init(address=address, ignore_reinit_error=True, runtime_env=runtime_env, **options)
        # Ray marks the node it started for this driver (a joined cluster's node is "connect only").
        node = getattr(ray._private.worker, "_global_node", None)
        return cls(initialized_here=True, started_ray=bool(getattr(node, "ray_init_cluster", False)))

    def close(self, actors: Sequence[Any] = (), timeout_s: float = RAY_CLOSE_TIMEOUT_S) -> RayClosed:
        """Kill ``actors`` (``ray.kill``, not restarted) and, if this connection called ``ray.init``, call
        ``ray.shutdown`` (a local Ray it started: its processes end and are waited for; a joined cluster:
        only disconnect), within ``timeout_s`` seconds. Never raises: what Ray raised is in the result.
        A second close does nothing (``actors`` 0).

        Returns:
            What was done; ``timed_out`` when ``ray.shutdown`` was still running at the timeout (it is
            left running in a daemon thread; the server's exit then ends its children,
            `swarm.server.shutdown.reap_children`).
        """
        started = time.monotonic()
        if self._closed:
            return RayClosed(0, False, False, 0.0, False)
        self._closed = True
        import ray

        errors: list[str] = []
        killed = 0
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
                killed += 1
            except Exception as exc:  # an actor already dead, a connection already gone
                errors.append(f"{type(exc).__name__}: {exc}")
        finished, stopped = True, False
        if self.initialized_here:
            failed = len(errors)
            finished = _within(lambda: ray.shutdown(wait_for_processes=True), timeout_s, errors)
            stopped = self.started_ray and finished and len(errors) == failed
        closed = RayClosed(
            actors=killed,
            stopped_ray=stopped,
            disconnected=self.initialized_here and finished,
            seconds=time.monotonic() - started,
            timed_out=not finished,
            error="; ".join(errors) or None,
        )
        (log.info if finished and not errors else log.warning)("ray closed: %s", closed.message)
        return closed


def _within(work: Callable[[], object], timeout_s: float, errors: list[str]) -> bool:
    """Run ``work`` in a daemon thread for at most ``timeout_s`` seconds; whether it returned (what it
    raised is appended to ``errors``)."""
    done = threading.Event()

    def run() -> None:
        try:
            work()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            done.set()

    threading.Thread(target=run, name="ray-close", daemon=True).start()
    return done.wait(timeout_s)


@contextlib.contextmanager
def _keeping_signal_handlers() -> Iterator[None]:
    """Re-install the Python handlers of `KEPT_SIGNALS` on the way out (main thread only: elsewhere
    Python can neither read nor set them meaningfully)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in KEPT_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:  # None: a handler not installed from Python, which cannot be restored
                signal.signal(sig, handler)
