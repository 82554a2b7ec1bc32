"""Voting batch policies (C4 ``all_clients_ready``, C5 ``any_client_ready``) with real ``swarm run``
processes against a real training server (its own tiny model), one runner killed with SIGKILL.

Each runner votes ready after every ``--vote-every`` tasks; a runner's client heartbeats keep it active;
the killed one stops counting after the server's client timeout, so it no longer blocks the others and
its finished episodes are trained with theirs."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.batch import BatchConfig
from swarm.client import SwarmClient
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.protocol import BatchPolicy, EpisodeStatus
from tests.client.conftest import episodes_of, swarm_run, write_jsonl, write_workflow
from tests.conftest import LiveServer, build_tiny_model, make_server, wait_for

CLIENT_TIMEOUT_S = 2.0

WORKFLOW = """
    import asyncio
    import pathlib
    import random

    RELEASE = pathlib.Path({release!r})

    async def run(task, llm):
        async with llm.openai(max_retries=0) as client:
            await client.chat.completions.create(
                model=llm.model, messages=[{{"role": "user", "content": task["id"]}}], max_tokens=2
            )
        if task.get("block"):  # wait for the test (a killed runner waits here for ever)
            while not RELEASE.exists():
                await asyncio.sleep(0.1)
        return random.random()
"""


@pytest.fixture
def voting_server(
    request: pytest.FixtureRequest, tmp_path: Path, embedded_source, tokenizer
) -> Iterator[LiveServer]:
    """A training server over a fresh tiny model (its weights change), voting policy from the test's param."""
    engine = HFEngine(build_tiny_model(embedded_source, seed=1), tokenizer, "tiny-votes")
    training = TrainingConfig(
        batch=BatchConfig(policy=request.param, batch_size=1, group_size=2),
        client_timeout_s=CLIENT_TIMEOUT_S,
        max_staleness=8,  # asynchronous: a step does not wait for the blocked episodes to drain
        checkpoint_every=100,
    )
    live = make_server(tmp_path / "server", engine, training=training, episode_timeout_s=600.0)
    try:
        yield live
    finally:
        live.stop()
        engine.close()


def _runner(
    tmp: Path, live: LiveServer, client_id: str, rows: list[dict[str, object]], vote_every: int
) -> subprocess.Popen[str]:
    workflow = write_workflow(tmp, WORKFLOW.format(release=str(tmp / "release")), name=f"wf_{client_id}.py")
    data = write_jsonl(tmp / f"{client_id}.jsonl", rows)
    args = [str(workflow), "--server", live.url, "--dataset", str(data), "--group-size", "2"]
    args += ["--concurrency", "2", "--client-id", client_id, "--state-dir", str(tmp / f"state-{client_id}")]
    args += ["--heartbeat", "0.3", "--vote-every", str(vote_every), "--no-progress"]
    return swarm_run(args)


def _trained(live: LiveServer, client_id: str, task_id: str) -> list[int | None]:
    return [
        e.trained_step
        for e in episodes_of(live, client_id)
        if e.task_id == task_id and e.status is EpisodeStatus.FINISHED
    ]


def _kill_all(procs: dict[str, subprocess.Popen[str]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


ROUNDS = [{"id": "t0"}, {"id": "t1", "block": True}]


@pytest.mark.parametrize("voting_server", [BatchPolicy.ALL_CLIENTS_READY], indirect=True)
def test_all_clients_ready_waits_for_a_live_client_and_not_for_a_killed_one(
    tmp_path: Path, voting_server: LiveServer
) -> None:
    live = voting_server
    status = live.runtime.status
    procs = {"c": _runner(tmp_path, live, "c", [{"id": "c0", "block": True}], vote_every=1)}
    try:
        wait_for(lambda: status().clients.get("c") == 2, 90, "runner c to open its episodes")
        procs |= {n: _runner(tmp_path, live, n, ROUNDS, vote_every=1) for n in ("a", "b")}
        wait_for(lambda: status().ready_clients == ["a", "b"], 90, "runners a and b to vote after t0")
        # c is alive (its heartbeats) and has not voted: no step, well past the client timeout
        time.sleep(2 * CLIENT_TIMEOUT_S)
        assert status().step == 0 and "c" in status().active_clients
        assert _trained(live, "a", "t0") == [None, None]

        procs["c"].send_signal(signal.SIGKILL)
        procs["c"].wait(timeout=30)
        killed_at = time.monotonic()
        wait_for(lambda: status().step >= 1, 30, "a step once the killed runner timed out")
        assert time.monotonic() - killed_at >= CLIENT_TIMEOUT_S - 0.5  # it waited for the timeout
        assert "c" not in status().active_clients
        assert _trained(live, "a", "t0") == [1, 1] and _trained(live, "b", "t0") == [1, 1]

        (tmp_path / "release").touch()  # a and b finish t1, vote for their last round and leave
        for name in ("a", "b"):
            assert "readiness votes" in _finish(procs[name])
        wait_for(lambda: status().step >= 2, 30, "the last round's step")
        assert _trained(live, "a", "t1") == [2, 2] and _trained(live, "b", "t1") == [2, 2]
        assert status().active_clients == []  # both left

        # the blocking client's own view of its state (sync client)
        with SwarmClient(live.url, client_id="probe") as probe:
            assert probe.client_heartbeat().active
            assert probe.vote_ready().ready and "probe" in status().ready_clients
            assert probe.vote_ready(False).ready is False
            left = probe.leave()
            assert not left.active and "probe" not in status().active_clients
    finally:
        _kill_all(procs)


@pytest.mark.parametrize("voting_server", [BatchPolicy.ANY_CLIENT_READY], indirect=True)
def test_any_client_ready_trains_the_voters_episodes_then_the_killed_runners(
    tmp_path: Path, voting_server: LiveServer
) -> None:
    live = voting_server
    status = live.runtime.status
    procs = {
        "a": _runner(tmp_path, live, "a", ROUNDS, vote_every=1),
        "b": _runner(tmp_path, live, "b", ROUNDS, vote_every=2),  # b never completes a round
    }
    try:
        wait_for(lambda: len(_trained(live, "b", "t0")) == 2, 90, "runner b to finish t0")
        wait_for(lambda: status().step >= 1, 90, "the step a's vote starts")
        assert _trained(live, "a", "t0") == [1, 1]
        assert _trained(live, "b", "t0") == [None, None]  # b has not voted: its episodes keep waiting

        procs["b"].send_signal(signal.SIGKILL)
        procs["b"].wait(timeout=30)
        wait_for(lambda: "b" not in status().active_clients, 30, "the killed runner to time out")
        (tmp_path / "release").touch()
        assert "readiness votes" in _finish(procs["a"])
        wait_for(lambda: status().step >= 2, 30, "the step of a's last round")
        assert _trained(live, "a", "t1") == [2, 2]
        assert _trained(live, "b", "t0") == [2, 2]  # no longer stranded: b will never vote
    finally:
        _kill_all(procs)
