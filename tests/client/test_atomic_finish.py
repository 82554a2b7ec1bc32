"""Atomic finish across servers (docs/ARCHITECTURE.md §Multi-server finish).

Two real ``swarm serve`` processes, one killed with SIGKILL in the middle of a multi-server finish
(between the prepare and its commit). Whichever one dies, the episode ends finished on both servers or
on neither, once the killed one is back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.client import AsyncSwarmClient, MultiEpisode, RetryPolicy, SwarmClient, UndecidedFinishError
from swarm.protocol import EpisodeStatus
from tests.conftest import build_tiny_model, free_port, serve_process, wait_for

FAST = RetryPolicy(attempts=2, max_wait_s=0.05, deadline_s=3)


class Server:
    """A ``swarm serve`` process that can be killed and started again on the same run dir and port."""

    def __init__(self, model_dir: Path, run_dir: Path) -> None:
        self.model_dir, self.run_dir, self.port = model_dir, run_dir, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        flags = ("--no-train", "--prepare-timeout", "1")
        self.proc = serve_process(self.model_dir, self.run_dir, self.port, *flags)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def status_of(self, episode_id: str) -> EpisodeStatus:
        with SwarmClient(self.url) as client:
            return client.get_episode(episode_id).status


class KillAtCommit(httpx.AsyncHTTPTransport):
    """Kills ``server`` (SIGKILL) when the client sends it its first ``/commit``, then sends the request
    on (it finds nobody listening)."""

    def __init__(self, server: Server) -> None:
        super().__init__()
        self.server = server
        self.fired = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/commit") and not self.fired:
            self.fired = True
            await asyncio.to_thread(self.server.kill)
        return await super().handle_async_request(request)


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory, embedded_source: Any, tokenizer: Any
) -> Iterator[dict[str, Server]]:
    root = tmp_path_factory.mktemp("atomic")
    model_dir = root / "tiny"
    build_tiny_model(embedded_source, seed=3).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    both = {name: Server(model_dir, root / name).start() for name in ("primary", "secondary")}
    yield both
    for server in both.values():
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(timeout=30)


async def _play_and_finish(
    servers: dict[str, Server], killed: str, task_id: str
) -> tuple[dict[str, str], Any]:
    """One multi-server episode (a chat call on each member), finished while ``killed`` dies at its commit."""
    clients = {
        name: AsyncSwarmClient(
            s.url, client_id="atomic", retry=FAST, transport=KillAtCommit(s) if name == killed else None
        )
        for name, s in servers.items()
    }
    outcome: Any = None
    try:
        eps = MultiEpisode(clients, task_id=task_id)
        async with eps:
            for name in eps.names:
                async with eps[name].llm.openai(max_retries=0) as oai:
                    await oai.chat.completions.create(
                        model=eps[name].model, messages=[{"role": "user", "content": name}], max_tokens=2
                    )
            try:
                await eps.finish({"primary": 0.25, "secondary": 0.75})
                outcome = eps.unconfirmed
            except UndecidedFinishError as exc:
                outcome = exc
        return {name: ep.id for name, ep in eps.episodes.items()}, outcome
    finally:
        for client in clients.values():
            await client.aclose()


def test_a_server_killed_mid_finish_leaves_no_half_finished_episode(servers: dict[str, Server]) -> None:
    primary, secondary = servers["primary"], servers["secondary"]

    # 1. the secondary dies at its commit: the primary committed, so the transaction did; the restarted
    #    secondary reads the primary's fate and finishes its member
    ids, unconfirmed = asyncio.run(_play_and_finish(servers, "secondary", "kill-secondary"))
    assert unconfirmed == ["secondary"]
    assert primary.status_of(ids["primary"]) is EpisodeStatus.FINISHED
    secondary.start()
    assert secondary.status_of(ids["secondary"]) in (EpisodeStatus.PREPARED, EpisodeStatus.FINISHED)
    wait_for(
        lambda: secondary.status_of(ids["secondary"]) is EpisodeStatus.FINISHED, 30, "the secondary's commit"
    )
    with SwarmClient(secondary.url) as client:
        view = client.get_episode(ids["secondary"])
    assert view.reward == 0.75 and len(view.calls) == 1  # its reward and its call survived the kill

    # 2. the primary dies at its commit: the client cannot know the outcome and aborts nothing; the
    #    secondary waits (prepared, never trained as such) until the restarted primary expires its
    #    uncommitted member, then follows it: finished on neither server
    ids, undecided = asyncio.run(_play_and_finish(servers, "primary", "kill-primary"))
    assert isinstance(undecided, UndecidedFinishError) and undecided.aborted == []
    assert secondary.status_of(ids["secondary"]) is EpisodeStatus.PREPARED
    primary.start()
    wait_for(
        lambda: primary.status_of(ids["primary"]) is EpisodeStatus.INFRA_FAILURE, 30, "the primary's expiry"
    )
    wait_for(
        lambda: secondary.status_of(ids["secondary"]) is EpisodeStatus.INFRA_FAILURE,
        30,
        "the secondary's abort",
    )
    with SwarmClient(secondary.url) as client:
        assert client.status().episodes.prepared == 0
