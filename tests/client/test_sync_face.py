"""The blocking ``SwarmClient`` runs the async client on a private event loop: it works from many threads
at once, inside a running event loop (Jupyter-like) and in a forked child, and its episode block and
two-phase finish are the async client's."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from swarm.client import SwarmClient

CREATED = {"episode_id": "ep-1", "base_url": "http://s/v1", "api_key": "sk-swarm-x", "model": "m"}


class FakeServer:
    """A mock server that opens ``ep-1`` on every begin and records every request (path, body)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, object]]] = []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.seen.append((request.url.path, body))
        if request.url.path == "/api/v1/episodes":
            return httpx.Response(201, json=CREATED)
        return httpx.Response(200, json={})

    def paths(self) -> list[str]:
        return [path for path, _ in self.seen]


def _no_loop_threads() -> bool:
    return not any(t.name.startswith("swarm-client") for t in threading.enumerate())


def test_many_threads_share_one_client() -> None:
    server = FakeServer()
    with SwarmClient("http://s", transport=server.transport) as client, ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda i: client.begin(f"t{i}").id, range(32)))
    assert ids == ["ep-1"] * 32 and len(server.seen) == 32
    assert _no_loop_threads()  # close() stopped the private loop


def test_a_blocking_call_inside_a_running_event_loop() -> None:
    server = FakeServer()

    async def notebook_cell() -> str:
        with SwarmClient("http://s", transport=server.transport) as client:
            return client.begin("cell").id

    assert asyncio.run(notebook_cell()) == "ep-1"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_fresh_loop() -> None:
    server = FakeServer()
    with SwarmClient("http://s", transport=server.transport) as client:
        client.begin("parent")  # the private loop runs in the parent
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork of a multi-threaded process
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            try:
                code = 0 if client.begin("child").id == "ep-1" else 1
            except BaseException:
                code = 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert client.begin("parent-again").id == "ep-1"


def test_the_episode_block_aborts_on_an_exception_and_without_finish() -> None:
    server = FakeServer()
    with SwarmClient("http://s", transport=server.transport) as client:
        with pytest.raises(KeyError), client.episode("t1") as ep:
            raise KeyError("reward")
        assert ep.ended
        with client.episode("t2") as ep:
            pass
        with client.episode("t3") as ep:
            ep.finish(1.0)
    aborts = [body for path, body in server.seen if path.endswith("/abort")]
    assert [a["reason"] for a in aborts] == ["KeyError: 'reward'", "the episode block ended without finish()"]
    assert [a["infra_failure"] for a in aborts] == [False, False]
    assert server.paths()[-1] == "/api/v1/episodes/ep-1/finish"


def test_the_blocking_client_prepares_and_commits() -> None:
    server = FakeServer()
    with SwarmClient("http://s", transport=server.transport) as client:
        ep = client.begin("t")
        client.prepare(ep.id, 0.5, txn_id="txn-1")
        client.commit(ep.id, "txn-1")
    (_, prepared), (_, committed) = server.seen[1:]
    assert prepared["reward"] == 0.5 and prepared["txn_id"] == "txn-1" and committed == {"txn_id": "txn-1"}
    assert server.paths()[1:] == ["/api/v1/episodes/ep-1/prepare", "/api/v1/episodes/ep-1/commit"]
