"""Limits on a real server: per-token open episodes and request rate (429 + Retry-After), body size (413),
chat caps (422), event followers (503), all changed live through ``PATCH /api/v1/config``."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import json
import logging
import secrets
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from swarm.batch import BatchConfig, BatchPolicy
from swarm.client import SwarmClient
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.errors import Unavailable
from swarm.protocol import Limits, LimitsPatch
from swarm.server.limits import RequestRates
from tests.conftest import LiveServer, make_server

ADMIN = secrets.token_urlsafe(16)
CLIENT = secrets.token_urlsafe(16)
QUESTION = [{"role": "user", "content": "hi"}]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture(scope="module")
def limited(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Any, tokenizer: Any
) -> Iterator[LiveServer]:
    """A training server (that never forms a batch) with an admin and a client token."""
    engine = HFEngine(copy.deepcopy(tiny_model), tokenizer, "tiny-limits")
    training = TrainingConfig(batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=64, group_size=2))
    live = make_server(
        tmp_path_factory.mktemp("limits"),
        engine,
        training=training,
        admin_token=SecretStr(ADMIN),
        client_tokens={"c": SecretStr(CLIENT)},
    )
    yield live
    live.stop()


def patch(url: str, **limits: Any) -> httpx.Response:
    return httpx.patch(f"{url}/api/v1/config", json={"limits": limits}, headers=bearer(ADMIN))


def reset(url: str) -> None:
    defaults = Limits().model_dump()
    assert patch(url, **defaults).status_code == 200


def begin(url: str) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/episodes", json={"task_id": "lim"}, headers=bearer(CLIENT))


def test_request_rates_are_token_buckets() -> None:
    now = [100.0]
    rates = RequestRates(clock=lambda: now[0])
    rates.take("a", 2.0)
    rates.take("a", 2.0)
    with pytest.raises(Unavailable) as over:
        rates.take("a", 2.0)
    assert over.value.status_code == 429 and over.value.retry_after_s == 1.0
    rates.take("b", 2.0)  # buckets are per token
    now[0] += 0.5  # one request's worth refilled at 2/s
    rates.take("a", 2.0)
    with pytest.raises(Unavailable):
        rates.take("a", 2.0)
    rates.take("a", None)  # no limit


def test_open_episodes_per_token(limited: LiveServer) -> None:
    url = limited.url
    assert patch(url, open_episodes_per_token=2).json()["changed"] == {
        "limits": {"open_episodes_per_token": 2}
    }
    try:
        held = [begin(url).json() for _ in range(2)]
        over = begin(url)
        assert over.status_code == 429 and over.headers["retry-after"] == "1", over.text
        assert "2 episodes open" in over.json()["error"]["message"]
        admin = httpx.post(f"{url}/api/v1/episodes", json={"task_id": "lim"}, headers=bearer(ADMIN))
        assert admin.status_code == 201  # the admin is not limited per token
        first = held[0]
        ended = httpx.post(
            f"{url}/api/v1/episodes/{first['episode_id']}/abort", headers=bearer(first["api_key"])
        )
        assert ended.status_code == 200
        assert begin(url).status_code == 201
    finally:
        reset(url)
        with SwarmClient(url, admin_token=ADMIN) as ops:
            assert ops.client_tokens()[0].open_episodes == 2


def test_requests_per_second_per_token(limited: LiveServer) -> None:
    url = limited.url
    patch(url, requests_per_s_per_token=1)
    try:
        answers = [begin(url) for _ in range(3)]
        statuses = [a.status_code for a in answers]
        assert statuses[0] == 201 and 429 in statuses, statuses
        refused = next(a for a in answers if a.status_code == 429)
        assert int(refused.headers["retry-after"]) >= 1 and "requests/s" in refused.json()["error"]["message"]
        # as OpenAI's API answers a rate limit (it said type "unavailable")
        assert refused.json()["error"]["type"] == "requests", refused.text
        assert refused.json()["error"]["code"] == "rate_limit_exceeded", refused.text
    finally:
        reset(url)


def test_a_rate_limited_call_is_each_sdks_rate_limit_error(limited: LiveServer) -> None:
    """A chat call over the token's request rate is a 429 that OpenAI's and Anthropic's SDKs raise as
    their ``RateLimitError``, with each API's error type (``requests`` / ``rate_limit_error``)."""
    import anthropic
    import openai

    ep = begin(limited.url).json()
    patch(limited.url, requests_per_s_per_token=1)
    try:
        sdk = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
        with pytest.raises(openai.RateLimitError) as limited_openai:
            for _ in range(3):
                sdk.chat.completions.create(model=ep["model"], messages=QUESTION, max_tokens=1)
        error = limited_openai.value.body
        assert isinstance(error, dict) and error["type"] == "requests", error
        assert error["code"] == "rate_limit_exceeded", error
        claude = anthropic.Anthropic(base_url=limited.url, api_key=ep["api_key"], max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as limited_anthropic:
            for _ in range(3):
                claude.messages.create(model=ep["model"], messages=QUESTION, max_tokens=1)
        body = limited_anthropic.value.body
        assert isinstance(body, dict) and body["error"]["type"] == "rate_limit_error", body
    finally:
        reset(limited.url)


def test_count_tokens_takes_the_same_rate_and_caps_as_messages(limited: LiveServer) -> None:
    """Counting renders the whole conversation, so it spends the token's request rate and obeys the
    message cap like a Messages call (Anthropic's shape: a cap is 400, the rate 429)."""
    url = limited.url
    ep = begin(url).json()
    count_url = f"{url}/v1/messages/count_tokens"
    body = {"model": ep["model"], "messages": QUESTION}
    patch(url, max_messages=1, requests_per_s_per_token=1)
    try:
        over_cap = httpx.post(
            count_url, json={**body, "messages": QUESTION * 2}, headers={"x-api-key": ep["api_key"]}
        )
        assert over_cap.status_code == 400 and over_cap.json()["type"] == "error", over_cap.text
        assert (
            "max" in over_cap.json()["error"]["message"] or "messages" in over_cap.json()["error"]["message"]
        )
        answers = [httpx.post(count_url, json=body, headers={"x-api-key": ep["api_key"]}) for _ in range(3)]
        statuses = [a.status_code for a in answers]
        assert 429 in statuses, statuses
        refused = next(a for a in answers if a.status_code == 429)
        assert refused.json()["type"] == "error" and int(refused.headers["retry-after"]) >= 1
    finally:
        reset(url)
    counted = httpx.post(count_url, json=body, headers={"x-api-key": ep["api_key"]})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0, counted.text


def test_body_size_is_413(limited: LiveServer) -> None:
    url = limited.url
    patch(url, max_body_bytes=1024)
    try:
        big = {"task_id": "x", "metadata": {"pad": "y" * 2000}}
        declared = httpx.post(f"{url}/api/v1/episodes", json=big, headers=bearer(CLIENT))
        assert declared.status_code == 413 and declared.json()["error"]["type"] == "request_too_large"
        payload = httpx.Request("POST", "/", json=big).content

        def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed body is counted
            yield payload[:700]
            yield payload[700:]

        streamed = httpx.post(
            f"{url}/api/v1/episodes",
            content=chunks(),
            headers={**bearer(CLIENT), "Content-Type": "application/json"},
        )
        assert streamed.status_code == 413, streamed.text
        assert streamed.json()["error"]["type"] == "request_too_large"
        assert declared.content == streamed.content  # from the middleware or the app's handler, one format
        assert begin(url).status_code == 201  # small bodies pass
        # the Anthropic route answers in Anthropic's shape, before and after the body is read
        anthropic = httpx.post(f"{url}/v1/messages", json=big)
        assert anthropic.status_code == 413 and anthropic.json()["type"] == "error", anthropic.text
        assert anthropic.json()["error"]["type"] == "request_too_large"
    finally:
        reset(url)


def _raw_answer(url: str, request: bytes, chunks: Iterator[bytes] = iter(())) -> tuple[bytes, float]:
    """Send ``request`` (then ``chunks``) on a raw socket; what came back until the server closed the
    connection, and the seconds that took (a 10 s socket timeout fails the test)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10.0) as sock:
        start = time.monotonic()
        sock.sendall(request)
        for chunk in chunks:
            sock.sendall(chunk)
        out = b""
        while data := sock.recv(65536):
            out += data
        return out, time.monotonic() - start


def test_a_413_closes_its_connection(limited: LiveServer) -> None:
    """The rest of a refused body is never read: the answer says ``Connection: close`` and the server
    closes at once, as for the 400 and 408 answered before the app (a Content-Length of 9,000,000 with 2
    bytes sent waited for the 60 s request timer)."""
    head = (
        f"POST /api/v1/episodes HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {CLIENT}\r\n"
        "content-type: application/json\r\n"
    ).encode()
    declared, took = _raw_answer(limited.url, head + b"content-length: 9000000\r\n\r\n{}")
    status, _, body = declared.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413 ") and b"connection: close" in status.lower(), declared
    assert json.loads(body)["error"]["type"] == "request_too_large" and took < 5.0
    patch(limited.url, max_body_bytes=1024)
    try:  # no Content-Length: refused once the counted body passes the limit (the app's handler)
        chunked = head + b"transfer-encoding: chunked\r\n\r\n"
        pieces = iter([b"800\r\n" + b"x" * 2048 + b"\r\n"])
        streamed, took = _raw_answer(limited.url, chunked, pieces)
        status, _, body = streamed.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 413 ") and b"connection: close" in status.lower(), streamed
        assert json.loads(body)["error"]["type"] == "request_too_large" and took < 5.0
    finally:
        reset(limited.url)


def test_chat_caps_are_422_naming_the_field(limited: LiveServer) -> None:
    url = limited.url
    patch(url, max_tokens=4, max_n=2, max_messages=2)
    try:
        ep = begin(url).json()

        def chat(**body: Any) -> httpx.Response:
            return httpx.post(
                f"{ep['base_url']}/chat/completions",
                json={"model": ep["model"], "messages": QUESTION, **body},
                headers=bearer(ep["api_key"]),
                timeout=60,
            )

        for body, param in (
            ({"max_tokens": 5}, "max_tokens"),
            ({"max_completion_tokens": 9}, "max_completion_tokens"),
            ({"n": 3, "max_tokens": 1}, "n"),
            ({"messages": QUESTION * 3, "max_tokens": 1}, "messages"),
        ):
            r = chat(**body)
            assert r.status_code == 422 and r.json()["error"]["param"] == param, r.text
        assert chat(max_tokens=4, n=2).status_code == 200
        # leaving max_tokens out gets the cap, not the server's larger default (which bypassed it)
        left_out = chat(temperature=1.0, seed=7)
        assert left_out.status_code == 200 and left_out.json()["usage"]["completion_tokens"] <= 4
    finally:
        reset(url)


def test_a_vote_needs_no_body(limited: LiveServer) -> None:
    """``POST /api/v1/clients/{id}/ready``'s body is optional: none votes ready, as ``{}`` does (it was a
    422 ``body: Field required``)."""
    url = f"{limited.url}/api/v1/clients/bodiless/ready"
    voted = httpx.post(url, headers=bearer(CLIENT))
    assert voted.status_code == 200 and voted.json() == {"client_id": "bodiless", "ready": True}, voted.text
    withdrawn = httpx.post(url, json={"ready": False}, headers=bearer(CLIENT))
    assert withdrawn.status_code == 200 and withdrawn.json()["ready"] is False, withdrawn.text


def test_event_followers_are_bounded(limited: LiveServer) -> None:
    url = limited.url
    patch(url, max_event_subscribers=1)
    try:
        with (
            httpx.Client(timeout=10) as first,
            first.stream("GET", f"{url}/api/v1/events", headers=bearer(ADMIN)) as held,
        ):
            assert held.status_code == 200
            lines = held.iter_lines()  # kept: a dropped iterator closes the stream
            assert next(lines).startswith("event: ")  # the stream is open and subscribed
            second = httpx.get(f"{url}/api/v1/events", headers=bearer(ADMIN))
            assert second.status_code == 503 and second.headers["retry-after"] == "5"
            assert second.json()["error"]["message"].startswith("1 client already follows the events")
            unfollowed = httpx.get(f"{url}/api/v1/events?follow=false", headers=bearer(ADMIN))
            assert unfollowed.status_code == 200  # reading the buffer is not following
    finally:
        reset(url)


def test_a_follower_leaving_logs_no_error(limited: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    """A follower that leaves while its stream waits for the next event is normal: its pending wait is
    cancelled, so asyncio logs no "Task was destroyed but it is pending!" once it is collected."""
    url = limited.url
    for _ in range(3):
        with (
            httpx.Client(timeout=10) as http,
            http.stream("GET", f"{url}/api/v1/events", headers=bearer(ADMIN)) as followed,
        ):
            assert next(followed.iter_lines()).startswith("event: ")  # subscribed, now waiting
            time.sleep(0.2)
    deadline = time.monotonic() + 10  # the server sees each client gone and ends its stream
    while limited.runtime.events.subscribers():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.0)
    gc.collect()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


class _ErrorLines(logging.Handler):
    """Collects the messages of ERROR records (attached to uvicorn's error log, which does not reach
    ``caplog``: uvicorn's logger does not propagate to the root)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_follower_leaving_while_events_wait_for_it_logs_no_error(
    tmp_path: Any, tiny_engine: HFEngine
) -> None:
    """A follower that stops reading while events pile up for it and then leaves is normal too. Through
    FastAPI's generator route the stream passed each event through a keep-alive task whose send then
    raised BrokenResourceError: "Exception in ASGI application" and a traceback, every time here (and now
    and then for a follower that merely left: fresh35b). The flood fills the socket buffers so that the
    server holds events for the follower when it goes."""
    live = make_server(tmp_path, tiny_engine, training=TrainingConfig(enabled=False))
    errors = _ErrorLines()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "asyncio", "")]
    for logger in loggers:
        logger.addHandler(errors)
    pad = "x" * 16384
    try:
        for _ in range(5):
            since = live.runtime.events.emit("test.mark", "before a follower").seq
            follower = socket.socket()
            follower.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
            follower.connect(("127.0.0.1", live.config.port))
            follower.sendall(f"GET /api/v1/events?since={since} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            assert b" 200 " in follower.recv(4096)
            for _ in range(400):  # 6.5 MB the follower never reads
                live.runtime.events.emit("test.flood", "flood", pad=pad)
            time.sleep(0.5)
            follower.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            follower.close()  # a reset: gone at once
            deadline = time.monotonic() + 10
            while live.runtime.events.subscribers():
                assert time.monotonic() < deadline
                time.sleep(0.05)
        time.sleep(0.5)
        gc.collect()
    finally:
        for logger in loggers:
            logger.removeHandler(errors)
        live.stop()
    assert errors.lines == []


def test_simultaneous_followers_cannot_pass_the_bound_together(limited: LiveServer) -> None:
    """Followers that connect at the same moment are counted as they connect, not when their streams
    start: of five simultaneous connects, exactly the cap get a stream."""
    url = limited.url
    patch(url, max_event_subscribers=2)

    async def follow_all() -> list[int]:
        async with httpx.AsyncClient(timeout=10) as http, contextlib.AsyncExitStack() as stack:

            async def connect() -> int:
                response = await stack.enter_async_context(
                    http.stream("GET", f"{url}/api/v1/events", headers=bearer(ADMIN))
                )
                return response.status_code

            return list(await asyncio.gather(*(connect() for _ in range(5))))

    try:
        statuses = asyncio.run(follow_all())
        assert sorted(statuses) == [200, 200, 503, 503, 503], statuses
        deadline = time.monotonic() + 10  # the closed streams give their slots back
        while (statuses := asyncio.run(follow_all())).count(200) < 2:
            assert time.monotonic() < deadline, statuses
            time.sleep(0.2)
        assert sorted(statuses) == [200, 200, 503, 503, 503], statuses
    finally:
        reset(url)


def test_limits_patch_is_validated_and_shown(limited: LiveServer) -> None:
    url = limited.url
    bad = patch(url, max_n=99)
    assert bad.status_code == 422 and "max_n" in bad.json()["error"]["message"]
    lifted_wrongly = patch(url, max_body_bytes=None)
    assert (
        lifted_wrongly.status_code == 422 and "cannot be lifted" in lifted_wrongly.json()["error"]["message"]
    )
    mixed = httpx.patch(
        f"{url}/api/v1/config", json={"lr": 2e-5, "limits": {"max_n": 0}}, headers=bearer(ADMIN)
    )
    assert mixed.status_code == 422
    with SwarmClient(url, admin_token=ADMIN) as ops:
        assert ops.config().training["trainer"]["lr"] != 2e-5  # a bad limit fails the whole patch
        ops.patch_config(limits={"max_tokens": 7})
        assert ops.config().limits.max_tokens == 7
        ops.patch_config(limits={"max_tokens": None})  # null lifts a limit that can be off
        assert ops.config().limits.max_tokens is None
    assert LimitsPatch(max_n=3).applied_to(Limits()).max_n == 3


def test_an_inference_server_takes_limit_patches_only(server: LiveServer) -> None:
    answer = httpx.patch(f"{server.url}/api/v1/config", json={"limits": {"max_messages": 100}})
    assert answer.status_code == 200, answer.text
    assert (
        answer.json()["config"]["limits"]["max_messages"] == 100 and answer.json()["config"]["training"] == {}
    )
    assert httpx.patch(f"{server.url}/api/v1/config", json={"lr": 1e-5}).status_code == 409
    shown = httpx.get(f"{server.url}/api/v1/config")  # what was patched can be read back
    assert shown.status_code == 200 and shown.json()["limits"]["max_messages"] == 100, shown.text
    assert shown.json()["training"] == {} and shown.json()["sampling"]["temperature"] == 1.0
    httpx.patch(f"{server.url}/api/v1/config", json={"limits": {"max_messages": Limits().max_messages}})


def test_the_default_request_cap_is_a_share_of_the_context(tmp_path: Any, tiny_engine: HFEngine) -> None:
    """``swarm serve`` without ``--max-request-tokens`` (`ServerConfig.request_tokens_share` 0.5): a chat
    request may ask for half the context window, no more; the cap is shown and patched like any limit."""
    live = make_server(
        tmp_path, tiny_engine, training=TrainingConfig(enabled=False), request_tokens_share=0.5
    )
    try:
        cap = tiny_engine.max_context // 2
        limits = httpx.get(f"{live.url}/api/v1/config").json()["limits"]
        assert limits["max_tokens"] == cap
        with SwarmClient(live.url) as client, client.episode("cap") as ep:
            r = httpx.post(
                f"{ep.base_url}/chat/completions",
                json={"model": ep.model, "messages": QUESTION, "max_tokens": cap + 1},
                headers=bearer(ep.api_key),
            )
            assert r.status_code == 422 and f"cap of {cap}" in r.json()["error"]["message"]
            ep.finish(0.0)
    finally:
        live.stop()


def test_max_tokens_over_the_context_is_400_in_each_api(server: LiveServer) -> None:
    """With no request cap, a ``max_tokens`` above the model's whole context window cannot be met: a 400
    naming the field and the window in each API's shape (vLLM's OpenAI server answers 400 "This model's
    maximum context length is N tokens"), nothing recorded; at the window it is clipped to the room left
    after the prompt (``finish_reason`` length)."""
    import anthropic
    import openai

    context = server.engine.max_context if server.engine is not None else 0
    assert httpx.get(f"{server.url}/api/v1/config").json()["limits"]["max_tokens"] is None
    with SwarmClient(server.url) as client, client.episode("over-context") as ep:
        sdk = openai.OpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
        for field in ("max_tokens", "max_completion_tokens"):
            with pytest.raises(openai.BadRequestError) as refused:
                sdk.chat.completions.create(model=ep.model, messages=QUESTION, **{field: context + 1})  # type: ignore[call-overload]
            error = refused.value.body
            assert isinstance(error, dict) and error["type"] == "context_length_exceeded"
            assert (
                error["param"] == field and f"maximum context length of {context} tokens" in error["message"]
            )
        claude = anthropic.Anthropic(
            base_url=ep.base_url.removesuffix("/v1"), api_key=ep.api_key, max_retries=0
        )
        with pytest.raises(anthropic.BadRequestError) as caught:
            claude.messages.create(model=ep.model, messages=QUESTION, max_tokens=context + 1)
        body = caught.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert f"maximum context length of {context} tokens" in body["error"]["message"]
        assert client.get_episode(ep.id).calls == []
        ok = sdk.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=context, temperature=0)
        assert ok.usage is not None and ok.usage.prompt_tokens + ok.usage.completion_tokens <= context
        ep.finish(0.0)


def test_a_zero_request_cap_is_refused_saying_null_lifts_it(limited: LiveServer) -> None:
    """``--max-request-tokens 0`` lifts the cap on the command line; in a ``PATCH`` that is ``null``, and
    ``0`` is a 422 that says so (and names the bound); the document says the same."""
    url = limited.url
    try:
        zero = patch(url, max_tokens=0)
        assert zero.status_code == 422, zero.text
        error = zero.json()["error"]
        assert error["param"] == "limits.max_tokens"
        assert error["message"] == (
            "limits.max_tokens: 0 is not a cap: a cap is at least 1, and null lifts it "
            "(as swarm serve --max-request-tokens 0)"
        )
        assert patch(url, max_tokens=False).status_code == 422  # not an integer
        assert patch(url, max_tokens=1).json()["config"]["limits"]["max_tokens"] == 1
        assert patch(url, max_tokens=None).json()["config"]["limits"]["max_tokens"] is None
        schema = httpx.get(f"{url}/openapi.json").json()["components"]["schemas"]["LimitsPatch"]
        field = schema["properties"]["max_tokens"]
        assert {"type": "integer", "minimum": 1} in field["anyOf"] and "null lifts the cap" in field[
            "description"
        ]
    finally:
        reset(url)
