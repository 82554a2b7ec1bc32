"""Why an episode failed: the agent's fault (user code) or the infrastructure's.

The distinction decides what the server does with the episode: an agent failure is aborted as a
failed rollout (it counts in its GRPO group), an infrastructure failure is aborted with
``infra_failure=true`` and kept out of group statistics (and the runner may retry it).

Infrastructure, anywhere in the exception's explicit cause chain (``raise … from err``) or among the
members of an exception group (an implicit ``__context__`` is not followed: a bug raised while
handling a timeout is still a bug):

- timeouts: :class:`TimeoutError` (``asyncio.TimeoutError``), ``httpx.TimeoutException``,
  ``openai.APITimeoutError``;
- transport errors: ``httpx.TransportError``, ``openai.APIConnectionError`` (httpx2, the fork
  ``openai>=3`` is built on, is recognised like httpx);
- answers that say "not your fault, try later": HTTP 429 and 5xx (``httpx.HTTPStatusError``,
  ``openai.RateLimitError`` / ``InternalServerError`` / any ``APIStatusError`` with such a status,
  :class:`swarm.errors.ClientError`);
- a 401/403/404/409 from the episode's own swarm server (its key stopped working: the server restarted or
  reclaimed or ended the episode; an ended episode's key is a 403 since issue 35), recognised by the
  request URL starting with the episode's base URL;
- :class:`EpisodeLost` (the runner's heartbeat found the episode gone).

Everything else (a ``KeyError`` in a reward function, a 400 for a prompt that is too long…) is the
agent's failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import httpx

from swarm.errors import ClientError, SwarmError


class FailureKind(StrEnum):
    """Who is to blame for a failed episode."""

    AGENT = "agent"
    """User code raised (a bug, a bad reward function, an agent error): aborted, counts in its group."""
    INFRA = "infra"
    """Timeouts, transport errors, 429/5xx, a lost episode: aborted as ``infra_failure``, retried."""


class EpisodeLost(SwarmError):
    """The server no longer knows an open episode (it restarted, or reclaimed the episode as idle)."""

    error_type = "episode_lost"

    def __init__(self, episode_id: str, reason: str) -> None:
        super().__init__(f"episode {episode_id} is gone on the server: {reason}")
        self.episode_id = episode_id


_INFRA_STATUS_FROM_OWN_SERVER = frozenset({401, 403, 404, 409})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its explicit causes, and the members of exception groups (each once)."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        if current.__cause__ is not None:
            stack.append(current.__cause__)


def _http_libraries() -> list[Any]:
    """httpx, and httpx2 when installed (``openai>=3`` is built on httpx2, a same-API fork)."""
    libraries: list[Any] = [httpx]
    try:
        import httpx2
    except ImportError:
        return libraries
    libraries.append(httpx2)
    return libraries


def _status_and_url(exc: BaseException) -> tuple[int, str] | None:
    """HTTP status and request URL of an error answer (httpx/httpx2, the OpenAI SDK, our client)."""
    if isinstance(exc, ClientError):
        return exc.status_code, exc.url
    response = getattr(exc, "response", None)  # httpx(2).HTTPStatusError, openai.APIStatusError
    status = getattr(response, "status_code", None)
    if response is None or not isinstance(status, int):
        return None
    try:
        url = str(response.request.url)
    except (AttributeError, RuntimeError):  # a response built without a request
        url = ""
    return status, url


def _is_infra(exc: BaseException, own_base_urls: tuple[str, ...]) -> bool:
    if isinstance(exc, EpisodeLost | TimeoutError):
        return True
    for lib in _http_libraries():
        if isinstance(exc, lib.TimeoutException | lib.TransportError):
            return True
    try:
        import openai
    except ImportError:  # pragma: no cover - openai is a core dependency
        openai = None  # type: ignore[assignment]
    if openai is not None and isinstance(exc, openai.APIConnectionError):  # APITimeoutError is one
        return True
    answer = _status_and_url(exc)
    if answer is None:
        return False
    status, url = answer
    if status == 429 or status >= 500:
        return True
    return status in _INFRA_STATUS_FROM_OWN_SERVER and any(
        url.startswith(base) for base in own_base_urls if base
    )


def classify_failure(exc: BaseException, own_base_urls: tuple[str, ...] = ()) -> FailureKind:
    """Blame a failed episode on the agent or on the infrastructure.

    Args:
        exc: what the workflow (or the runner around it) raised.
        own_base_urls: the episode's own OpenAI base URLs (``…/v1``); a 401/403/404/409 from them means the
            episode key stopped working, which is the infrastructure's doing.

    Returns:
        :attr:`FailureKind.INFRA` when any exception in the cause chain (or exception group) is
        an infrastructure error as listed in the module docstring, else :attr:`FailureKind.AGENT`.
    """
    if any(_is_infra(e, own_base_urls) for e in _chain(exc)):
        return FailureKind.INFRA
    return FailureKind.AGENT
