"""`swarm.train.ray_connection`: a real local Ray on the CPU, started by :meth:`RayConnection.open` and
stopped by its close, with nothing of Ray's left among this process's descendants; a connection that
joined one already open kills its actors only; the close is bounded."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, SimpleNamespace

import pytest

from swarm.train.ray_connection import RayConnection
from tests.conftest import descendant_pids, running, wait_for

ray = pytest.importorskip("ray")


@pytest.fixture
def ray_temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A short temp folder for a local Ray (its socket paths must fit AF_UNIX's 107 bytes); afterwards
    Ray is shut down and every process it left below this one is killed."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # start a local Ray, never join one
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no token written to ~/.ray
    before = set(descendant_pids(os.getpid()))
    kept = signal.getsignal(signal.SIGTERM)
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    try:
        yield temp
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for pid in set(descendant_pids(os.getpid())) - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        signal.signal(signal.SIGTERM, kept)
        shutil.rmtree(temp, ignore_errors=True)


class Pid:
    """An actor that tells its process id."""

    def pid(self) -> int:
        return os.getpid()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise AssertionError("not called: the test only checks that this handler stays installed")


def test_a_ray_this_process_started_is_stopped_by_its_close(ray_temp: str) -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    before = set(descendant_pids(os.getpid()))
    connection = RayConnection.open(None, num_cpus=1, include_dashboard=False, _temp_dir=ray_temp)
    assert connection.initialized_here and connection.started_ray
    assert signal.getsignal(signal.SIGTERM) is _on_sigterm  # ray.init's own handler was taken back out
    pid_of = ray.remote(num_cpus=0)(Pid)
    actor = pid_of.remote()
    actor_pid = ray.get(actor.pid.remote())
    ray_processes = set(descendant_pids(os.getpid())) - before
    assert actor_pid in ray_processes  # the raylet's child

    joined = RayConnection.open(None)  # the process is connected already: not this one's to close
    assert not joined.initialized_here and not joined.started_ray
    other = pid_of.remote()
    other_pid = ray.get(other.pid.remote())
    closed = joined.close([other])
    assert (closed.actors, closed.disconnected, closed.stopped_ray, closed.error) == (1, False, False, None)
    assert ray.is_initialized()
    wait_for(lambda: not running(other_pid), 30, "the killed actor's process to end")
    assert running(actor_pid)

    closed = connection.close([actor], timeout_s=60)
    assert closed.actors == 1 and closed.stopped_ray and closed.disconnected, closed
    assert not closed.timed_out and closed.error is None, closed
    assert closed.message.startswith("1 Ray actor(s) killed, the local Ray this process started stopped in ")
    assert not ray.is_initialized()
    assert sorted(pid for pid in ray_processes if running(pid)) == []  # waited for: no wait here
    assert connection.close([actor]) == type(closed)(0, False, False, 0.0, False)  # once only


def test_a_verl_trainer_closes_its_actors_and_the_ray_it_started(ray_temp: str, tmp_path: Path) -> None:
    """`VerlTrainer.close` closes the connection its worker group runs on (verl's Ray group needs CUDA:
    here the group is the actor alone, on a real local Ray), reports it for ``trainer.closed``, and
    the trainer starts no worker group after it."""
    pytest.importorskip("verl")
    from torch import nn

    from swarm.train import TrainerConfig, TrainerError
    from swarm.train.verl_backend import RAY_CONNECTION_ATTR, VerlTrainer

    before = set(descendant_pids(os.getpid()))
    connection = RayConnection.open(None, num_cpus=1, include_dashboard=False, _temp_dir=ray_temp)
    actor = ray.remote(num_cpus=0)(Pid).remote()
    group = SimpleNamespace(workers=[actor], **{RAY_CONNECTION_ATTR: connection})
    trainer = VerlTrainer(
        nn.Linear(2, 2), tmp_path, TrainerConfig(), 0, start=True, worker_group=lambda *_: group
    )
    actor_pid = ray.get(actor.pid.remote())
    ray_processes = set(descendant_pids(os.getpid())) - before
    assert actor_pid in ray_processes

    closed = trainer.close()
    assert closed is not None and closed.complete, closed
    assert closed.message.startswith("verl trainer closed: 1 Ray actor(s) killed, the local Ray this ")
    assert {k: closed.data[k] for k in ("actors", "stopped_ray", "disconnected", "timed_out", "error")} == {
        "actors": 1,
        "stopped_ray": True,
        "disconnected": True,
        "timed_out": False,
        "error": None,
    }
    assert sorted(pid for pid in ray_processes if running(pid)) == []
    assert trainer.close() is None
    with pytest.raises(TrainerError, match="the verl trainer is closed"):
        trainer._workers()  # what a step would start: refused, never a fresh Ray


def test_the_close_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``ray.shutdown`` that hangs is left running after the timeout, and said so."""
    monkeypatch.setattr(ray, "shutdown", lambda **_: time.sleep(30))
    started = time.monotonic()
    closed = RayConnection(initialized_here=True, started_ray=True).close(timeout_s=0.2)
    assert time.monotonic() - started < 5
    assert closed.timed_out and not closed.stopped_ray and not closed.disconnected
    assert "ray.shutdown still running after 0.2 s (left behind)" in closed.message
