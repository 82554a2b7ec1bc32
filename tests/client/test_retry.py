"""Retries: ``Retry-After`` is waited out exactly and does not use up attempts; the deadline still holds."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest

from swarm.client import RetryPolicy, SwarmClient
from swarm.errors import ClientError

CREATED = {"episode_id": "ep-1", "base_url": "http://s/v1", "api_key": "sk-swarm-x", "model": "m"}


def _server(answers: list[httpx.Response]) -> tuple[httpx.MockTransport, list[float]]:
    times: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        times.append(time.monotonic())
        return answers.pop(0) if len(answers) > 1 else answers[0]

    return httpx.MockTransport(handler), times


def _busy(status: int, after: str | None) -> httpx.Response:
    headers = {"Retry-After": after} if after is not None else {}
    return httpx.Response(
        status, headers=headers, json={"error": {"type": "quota", "message": "family full"}}
    )


def test_retry_after_is_honoured_and_not_counted_as_an_attempt() -> None:
    transport, times = _server([_busy(429, "0.3")] * 4 + [httpx.Response(201, json=CREATED)])
    with SwarmClient("http://s", retry=RetryPolicy(attempts=2), transport=transport) as client:
        ep = client.begin("t1", family="math")
    assert ep.id == "ep-1"
    assert len(times) == 5
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.28 <= g < 1.0 for g in gaps), gaps


def test_errors_without_retry_after_use_up_attempts() -> None:
    transport, times = _server([_busy(503, None)])
    with (
        SwarmClient(
            "http://s", retry=RetryPolicy(attempts=3, max_wait_s=0.05), transport=transport
        ) as client,
        pytest.raises(ClientError) as info,
    ):
        client.begin("t1")
    assert info.value.status_code == 503 and info.value.retry_after_s is None
    assert len(times) == 3


def test_deadline_bounds_busy_waiting() -> None:
    transport, times = _server([_busy(429, "0.2")])
    start = time.monotonic()
    with (
        SwarmClient("http://s", retry=RetryPolicy(attempts=2, deadline_s=0.7), transport=transport) as client,
        pytest.raises(ClientError) as info,
    ):
        client.begin("t1")
    assert info.value.status_code == 429 and info.value.retry_after_s == pytest.approx(0.2)
    assert 0.6 <= time.monotonic() - start < 2.0
    assert 4 <= len(times) <= 6


def test_client_errors_are_not_retried() -> None:
    transport, times = _server(
        [
            httpx.Response(
                422, json={"error": {"type": "invalid_request_error", "message": "task_id: too short"}}
            )
        ]
    )
    with (
        SwarmClient("http://s", transport=transport) as client,
        pytest.raises(ClientError, match="too short"),
    ):
        client.begin("t1")
    assert len(times) == 1
