"""A chat call whose HTTP client goes away (a timeout, Ctrl-C, an SDK retry) is aborted in the engine, is not
recorded in its episode (the agent never saw the answer) and is logged as ``call.abandoned``; other clients
are answered meanwhile. Real server on loopback, real tiny model."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from swarm.client import SwarmClient
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from tests.conftest import LiveServer, make_server, wait_for

QUESTION = [{"role": "user", "content": "hi"}]
LONG = 8000
"""Completion tokens the abandoned call asks for (the tiny random model rarely ends a turn by itself:
many seconds of sampling, clipped to the context window)."""


@pytest.fixture
def live(tmp_path: Path, tiny_engine: HFEngine) -> Iterator[LiveServer]:
    server = make_server(tmp_path, tiny_engine, training=TrainingConfig(enabled=False))
    yield server
    server.stop()


def _request(route: str, ep: Any, max_tokens: int, **extra: Any) -> tuple[str, dict[str, Any]]:
    """The URL and body of a call of ``ep`` on ``route`` (``chat``: OpenAI's, ``messages``: Anthropic's)."""
    body: dict[str, Any] = {"model": ep.model, "messages": QUESTION, "max_tokens": max_tokens, **extra}
    if route == "chat":
        return f"{ep.base_url}/chat/completions", body
    return f"{ep.base_url.removesuffix('/v1')}/v1/messages", body


def _abandoned(client: SwarmClient, episode_id: str) -> list[Any]:
    return [e for e in client.events() if e.kind == "call.abandoned" and e.data["episode_id"] == episode_id]


def _short_call(route: str, ep: Any) -> float:
    """Seconds one 4-token call of ``ep`` takes, answered 200."""
    url, body = _request(route, ep, 4, temperature=0.0)
    started = time.perf_counter()
    answer = httpx.post(url, json=body, headers={"Authorization": f"Bearer {ep.api_key}"}, timeout=120)
    elapsed = time.perf_counter() - started
    assert answer.status_code == 200, answer.text
    return elapsed


@pytest.mark.parametrize("route", ["chat", "messages"])
def test_a_client_that_times_out_is_not_recorded_and_frees_the_engine(live: LiveServer, route: str) -> None:
    with SwarmClient(live.url) as client:
        gone, other = client.begin("gone"), client.begin("other")
        solo = statistics.median(_short_call(route, other) for _ in range(3))
        url, body = _request(route, gone, LONG, temperature=1.0)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up; its connection closes
            httpx.post(
                url,
                json=body,
                headers={"Authorization": f"Bearer {gone.api_key}"},
                timeout=httpx.Timeout(30, read=0.5),
            )
        after = _short_call(route, other)  # sent at once: the abandoned call must not hold the engine
        wait_for(lambda: len(_abandoned(client, gone.id)) == 1, 20, "call.abandoned")
        (event,) = _abandoned(client, gone.id)
        assert event.data["max_tokens"] == LONG and event.data["waited_s"] > 0
        client.finish(gone.id, 0.0)  # idle again: no call of it is running
        assert client.get_episode(gone.id).calls == []  # the agent never saw that answer
        client.finish(other.id, 0.0)
        assert len(client.get_episode(other.id).calls) == 4
    # Without the abort the short call waits for thousands of tokens behind the abandoned one.
    assert after < 10 * solo, f"a short call took {after:.3f} s after the abandonment, {solo:.3f} s alone"


def test_a_client_that_leaves_a_stream_is_logged_the_same_way(live: LiveServer) -> None:
    with SwarmClient(live.url) as client:
        ep = client.begin("stream")
        url, body = _request("chat", ep, LONG, temperature=1.0, seed=4, stream=True)
        headers = {"Authorization": f"Bearer {ep.api_key}"}
        with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as response:
            lines = response.iter_lines()
            while "content" not in next(lines):  # the first text has arrived
                pass
        wait_for(lambda: len(_abandoned(client, ep.id)) == 1, 20, "call.abandoned")
        client.finish(ep.id, 0.0)
        assert client.get_episode(ep.id).calls == []


def test_an_sdk_retry_after_a_timeout_records_one_call(live: LiveServer, tiny_engine: HFEngine) -> None:
    """The OpenAI SDK's first attempt times out while the engine is held (a long batch of others); it
    retries and is answered. The episode records the answer it received, once."""
    with SwarmClient(live.url) as client, client.episode("retry") as ep:
        released = threading.Event()

        def hold_the_engine() -> None:
            with tiny_engine.pause():
                released.wait(60)

        def release_once_abandoned() -> None:
            try:
                wait_for(lambda: len(_abandoned(client, ep.id)) >= 1, 60, "call.abandoned")
            finally:
                released.set()

        holder = threading.Thread(target=hold_the_engine)
        holder.start()
        watcher = threading.Thread(target=release_once_abandoned)
        watcher.start()
        try:
            sdk = OpenAI(base_url=ep.base_url, api_key=ep.api_key, timeout=1.0, max_retries=3)
            answer = sdk.chat.completions.create(
                model=ep.model,
                messages=QUESTION,
                max_tokens=4,
                temperature=0.0,  # type: ignore[arg-type]
            )
        finally:
            released.set()
            holder.join()
            watcher.join()
        assert answer.choices[0].finish_reason in ("length", "stop")
        ep.finish(1.0)
        view = client.get_episode(ep.id)
    (call,) = view.calls  # the abandoned attempt left no record
    assert answer.usage is not None and len(call.completion_ids) == answer.usage.completion_tokens
