"""Failure classification: which exceptions are the agent's fault and which the infrastructure's."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from swarm.client import EpisodeLost, FailureKind, classify_failure
from swarm.errors import ClientError

OWN = "http://127.0.0.1:8123/v1"


def _response(status: int, url: str) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("POST", url), json={"error": {"message": "x"}})


def _openai_status(cls: type[openai.APIStatusError], status: int, url: str) -> openai.APIStatusError:
    return cls("boom", response=_response(status, url), body=None)


INFRA = [
    TimeoutError("slow"),
    TimeoutError(),
    httpx.ConnectError("refused"),
    httpx.ReadTimeout("read timed out"),
    httpx.RemoteProtocolError("server went away"),
    openai.APIConnectionError(request=httpx.Request("POST", "https://api.example.com/v1/chat")),
    openai.APITimeoutError(request=httpx.Request("POST", "https://api.example.com/v1/chat")),
    _openai_status(openai.RateLimitError, 429, "https://api.example.com/v1/chat/completions"),
    _openai_status(openai.InternalServerError, 503, "https://api.example.com/v1/chat/completions"),
    httpx.HTTPStatusError(
        "bad gateway", request=httpx.Request("GET", "https://x"), response=_response(502, "https://x")
    ),
    ClientError("busy", status_code=503, url="http://elsewhere/api"),
    # our own server forgot the episode key (restart / reclaim): infra
    _openai_status(openai.AuthenticationError, 401, f"{OWN}/chat/completions"),
    _openai_status(openai.PermissionDeniedError, 403, f"{OWN}/chat/completions"),  # an ended episode's key
    httpx.HTTPStatusError(
        "gone",
        request=httpx.Request("POST", f"{OWN}/chat/completions"),
        response=_response(401, f"{OWN}/chat/completions"),
    ),
    EpisodeLost("ep-1", "404"),
]

AGENT = [
    KeyError("answer"),
    ValueError("could not parse"),
    ZeroDivisionError(),
    # a 401 from another service is a configuration bug of the workflow, not ours to retry
    _openai_status(openai.AuthenticationError, 401, "https://api.example.com/v1/chat/completions"),
    _openai_status(openai.PermissionDeniedError, 403, "https://api.example.com/v1/chat/completions"),
    # a prompt that is too long: the agent's failure
    _openai_status(openai.BadRequestError, 400, f"{OWN}/chat/completions"),
    ClientError("bad", status_code=422, url=f"{OWN}/x"),
]


@pytest.mark.parametrize("exc", INFRA, ids=lambda e: type(e).__name__)
def test_infrastructure_errors(exc: BaseException) -> None:
    assert classify_failure(exc, (OWN,)) is FailureKind.INFRA


@pytest.mark.parametrize("exc", AGENT, ids=lambda e: type(e).__name__)
def test_agent_errors(exc: BaseException) -> None:
    assert classify_failure(exc, (OWN,)) is FailureKind.AGENT


def test_explicit_cause_is_followed_but_implicit_context_is_not() -> None:
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError as err:
            raise RuntimeError("tool failed") from err
    except RuntimeError as wrapped:
        assert classify_failure(wrapped) is FailureKind.INFRA
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError:
            raise KeyError("bug in the handler")  # noqa: B904 - the implicit context is the point
    except KeyError as bug:
        assert classify_failure(bug) is FailureKind.AGENT


def test_exception_groups_are_searched() -> None:
    group = ExceptionGroup("tools", [ValueError("x"), httpx.ReadTimeout("t")])
    assert classify_failure(group) is FailureKind.INFRA
    assert classify_failure(ExceptionGroup("tools", [ValueError("x")])) is FailureKind.AGENT


def test_own_server_401_without_known_url_is_agent() -> None:
    # without the episode's base URL the runner cannot tell whose key failed
    exc = _openai_status(openai.AuthenticationError, 401, f"{OWN}/chat/completions")
    assert classify_failure(exc) is FailureKind.AGENT


def test_httpx2_errors_count_like_httpx() -> None:
    httpx2 = pytest.importorskip("httpx2")  # openai>=3 is built on this same-API fork of httpx
    assert classify_failure(httpx2.ConnectError("refused")) is FailureKind.INFRA
    assert classify_failure(httpx2.ReadTimeout("slow")) is FailureKind.INFRA


def test_a_real_403_from_our_server_after_the_episode_ended_is_infra(client_server) -> None:
    """An ended episode's key is refused with 403 (a wrong credential, issue 35; it was 401 before): a
    failure of the infrastructure when it comes from the episode's own server."""
    from swarm.client import AsyncSwarmClient

    async def go() -> tuple[BaseException, str]:
        async with AsyncSwarmClient(client_server.url) as client:
            ep = await client.begin("gone")
            await ep.abort("the server forgot it")
        sdk = openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
        try:
            await sdk.chat.completions.create(
                model=ep.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        except openai.PermissionDeniedError as exc:
            return exc, ep.base_url
        raise AssertionError("the ended episode's key still worked")

    exc, base_url = asyncio.run(go())
    assert classify_failure(exc, (base_url,)) is FailureKind.INFRA
    assert classify_failure(exc) is FailureKind.AGENT
