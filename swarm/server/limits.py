"""Enforcing :class:`swarm.protocol.Limits`: per-token request rates, the request body size and the caps
of a chat request (docs/ARCHITECTURE.md §Credentials and limits).

`ClientLimits` owns the limits in force, which may be replaced live (``PATCH /api/v1/config``); everything
here reads them when it checks, so a change applies to the next request. A chat call's ``max_tokens``
(its cap included) is ruled in one place, `swarm.server.chat_service.max_tokens_for`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swarm.errors import RequestError, Unavailable
from swarm.protocol import ADMIN_OWNER, ChatCompletionRequest, ErrorBody, ErrorDetail, Limits, LimitsPatch
from swarm.server.anthropic_format import error_body


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RequestRates:
    """Token buckets, one per client token name: ``rate`` requests per second sustained, bursts of up to
    ``max(1, rate)`` (one second's worth).

    Args:
        clock: monotonic seconds (tests pass a fake clock).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, owner: str, rate: float | None) -> None:
        """Count one request of ``owner``.

        Raises:
            Unavailable: 429 with ``Retry-After`` = seconds until the bucket holds a request again.
        """
        if rate is None:
            self._buckets.pop(owner, None)
            return
        burst = max(1.0, rate)
        now = self._clock()
        bucket = self._buckets.get(owner)
        if bucket is None:
            bucket = self._buckets[owner] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens < 1.0:
            wait = (1.0 - bucket.tokens) / rate
            raise Unavailable(
                f"client token {owner!r} is over its {rate:g} requests/s; retry after {wait:.2f} s",
                retry_after_s=max(1.0, math.ceil(wait)),
                status_code=429,
            )
        bucket.tokens -= 1.0

    def forget(self, owner: str) -> None:
        """Drop ``owner``'s bucket (a revoked token)."""
        self._buckets.pop(owner, None)


class ClientLimits:
    """The limits in force and the per-token request rates: one owner for both, read by begin and every
    chat call and replaced whole by the control routes (``PATCH /api/v1/config``).

    Args:
        limits: the limits at start (`ServerConfig.limits`).
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        """The limits in force (replaced whole by :meth:`replace`)."""
        self.rates = RequestRates()

    def take(self, owner: str | None) -> None:
        """Count one request (a begin or a chat call) of the client token named ``owner``; nothing for
        ``None`` (no token) or the admin.

        Raises:
            Unavailable: the token is over its request rate (429 + Retry-After).
        """
        if owner is not None and owner != ADMIN_OWNER:
            self.rates.take(owner, self.limits.requests_per_s_per_token)

    def check_open(self, owner: str, open_now: int) -> None:
        """Whether the client token ``owner``, with ``open_now`` episodes open, may open one more.

        Raises:
            Unavailable: it is at its open-episode limit (429 + Retry-After).
        """
        cap = self.limits.open_episodes_per_token
        if cap is not None and open_now >= cap:
            raise Unavailable(
                f"client token {owner!r} has {cap} episodes open, its limit; finish or abort one first",
                retry_after_s=1.0,
                status_code=429,
            )

    def checked(self, patch: LimitsPatch) -> Limits:
        """The limits ``patch`` would set (nothing changes).

        Raises:
            RequestError: a value is invalid (422 naming it).
        """
        try:
            return patch.applied_to(self.limits)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise RequestError(
                f"invalid config change: limits.{where}: {first['msg']}", status_code=422, param="limits"
            ) from None
        except ValueError as exc:
            raise RequestError(f"invalid config change: {exc}", status_code=422, param="limits") from None

    def replace(self, patch: LimitsPatch) -> dict[str, object]:
        """Apply ``patch`` at once; returns the fields it changed.

        Raises:
            RequestError: a value is invalid (422 naming it).
        """
        self.limits = self.checked(patch)
        return patch.model_dump(exclude_unset=True)


def context_cap(limits: Limits, share: float | None, max_context: int) -> Limits:
    """``limits`` with its ``max_tokens`` cap set to ``share`` of the context window where it has none
    (`ServerConfig.request_tokens_share`; ``swarm serve --max-request-tokens`` left out).

    Args:
        limits: the configured limits (an explicit ``max_tokens`` is kept).
        share: the share of the context window, in (0, 1]; ``None`` keeps ``limits`` as they are.
        max_context: the model's context window in tokens (`Engine.max_context`).

    Returns:
        The limits in force at start (``max_tokens`` >= 1).
    """
    if share is None or limits.max_tokens is not None:
        return limits
    return limits.model_copy(update={"max_tokens": max(1, int(max_context * share))})


def check_chat_request(limits: Limits, request: ChatCompletionRequest) -> None:
    """The message-count and ``n`` caps of a chat completion request (its ``max_tokens``:
    `swarm.server.chat_service.max_tokens_for`).

    Raises:
        RequestError: 422 naming the field over its cap.
    """
    if len(request.messages) > limits.max_messages:
        raise RequestError(
            f"messages: {len(request.messages)} messages; this server takes at most {limits.max_messages}",
            status_code=422,
            param="messages",
        )
    if request.n > limits.max_n:
        raise RequestError(
            f"n: {request.n} is above this server's cap of {limits.max_n}", status_code=422, param="n"
        )


class BodySizeLimit:
    """ASGI middleware answering 413 (JSON :class:`~swarm.protocol.ErrorBody`) to a request whose body
    exceeds ``limit()`` bytes: at once from ``Content-Length``, else once the streamed body passes it
    (an ``HTTPException(413)`` raised while the route reads the body, answered by the app's handler).
    Either answer closes the connection (`CLOSE`).
    Starlette's ``RequestBodyLimitMiddleware`` does the same with a fixed limit and a text answer.

    Args:
        app: the wrapped application.
        limit: the current limit in bytes (read per request, so a live change applies at once).
    """

    def __init__(self, app: ASGIApp, limit: Callable[[Scope], int | None]) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope)
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = None
        chunked = False
        for name, value in scope.get("headers") or ():
            if name == b"content-length":
                declared = value
            elif name == b"transfer-encoding":
                chunked = True
        if declared is not None and declared.isdigit():
            if int(declared) > limit:
                await _too_large(scope, receive, send, limit)
                return
            if not chunked:  # the server delivers exactly the declared length: nothing to count
                await self.app(scope, receive, send)
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, _too_large_message(limit), headers=dict(CLOSE))
            return message

        await self.app(scope, counted, send)


CLOSE = (("Connection", "close"),)
"""The header of a 413 answer: the rest of a refused body is never read, so the connection cannot carry
another request (uvicorn closes it once the answer is sent, as it does for the 400 and 408 it answers
before the app) and the client learns at once that it is done."""


def _too_large_message(limit: int) -> str:
    return f"the request body is larger than this server's limit of {limit} bytes"


async def _too_large(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    message = _too_large_message(limit)
    if str(scope.get("path", "")).startswith("/v1/messages"):  # Anthropic's routes answer in its shape
        content: dict[str, object] = error_body(413, message)
    else:
        content = ErrorBody(error=ErrorDetail(type="request_too_large", message=message)).model_dump(
            exclude_none=True
        )
    # rendered as every other error
    await JSONResponse(content, status_code=413, headers=dict(CLOSE))(scope, receive, send)
