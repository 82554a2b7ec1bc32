"""Server-sent ``chat.completion.chunk`` events for ``stream=true`` chat requests.

Two ways to stream, one wire format (OpenAI's, built by `swarm.server.openai_format`): a role chunk per
choice, content chunks, a finish chunk per choice, an optional usage chunk, then ``data: [DONE]``.

- `live_events` forwards tokens *as the engine samples them* (time to first token is one decode step).
  Text is released only once it is certain to be part of the answer (`openai_format.ChoiceText`). A
  client that disconnects mid-stream cancels its call: the engine stops sampling it and nothing is
  recorded (the agent never saw that answer, so it is not part of the trajectory). A server that stops
  cancels it the same way and ends the stream with an error event (`swarm.server.stopping`).
- `replay_events` sends a finished completion as chunks, one per token. Requests with ``tools`` use it:
  whether the text is a tool call is known only once the completion is complete.

The record is the same either way: the token ids, logprobs and text of `CallRecord`. Events are FastAPI
`ServerSentEvent` objects; `encode_events` writes them in the SSE wire format.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.encoders import jsonable_encoder
from fastapi.sse import ServerSentEvent, format_sse_event
from pydantic import BaseModel

from swarm.engine.base import SampledToken, TokenCallback
from swarm.errors import Unavailable
from swarm.protocol import ChatCompletion, ChoiceLogprobs
from swarm.server.chat import ChatResult
from swarm.server.detokenizer import Detokenizer
from swarm.server.openai_format import (
    ChoiceText,
    ResponseHeader,
    assistant_message,
    error_body,
    replay_chunks,
    token_logprob,
    usage,
)
from swarm.server.stopping import STOP_CANCEL, STOPPED_MESSAGE, Stopping
from swarm.tracking.records import CallRecord

__all__ = [
    "DONE",
    "Consume",
    "LiveStream",
    "StartCall",
    "encode_events",
    "event_stream_answer",
    "live_call",
    "live_events",
    "replay_events",
]

DONE = ServerSentEvent(raw_data="[DONE]")
"""The last event of every stream."""


def event_stream_answer(description: str) -> dict[str, Any]:
    """The OpenAPI ``200`` answer of a route that streams with ``stream: true``: ``text/event-stream``
    (next to the route's JSON model, which FastAPI adds), declared as one server-sent event, as FastAPI
    declares its own event streams (OpenAPI 3.2's ``itemSchema``: a checker validates each parsed event
    against it, not the whole body as one string). A fresh dict per call."""
    event = {
        "type": "object",
        "properties": {
            "data": {"type": "string"},
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer", "minimum": 0},
        },
    }
    return {"description": description, "content": {"text/event-stream": {"itemSchema": event}}}


StartCall = Callable[[TokenCallback], "asyncio.Future[ChatResult]"]
"""Starts sampling and recording the call with a per-token listener; returns the running call."""


def _event(payload: BaseModel) -> ServerSentEvent:
    return ServerSentEvent(raw_data=payload.model_dump_json(exclude_none=True))


def replay_events(
    completion: ChatCompletion,
    records: Sequence[CallRecord],
    detokenizer: Detokenizer,
    *,
    include_usage: bool,
) -> AsyncGenerator[ServerSentEvent, None]:
    """Events of a finished completion (`openai_format.replay_chunks`), then ``[DONE]``."""

    async def events() -> AsyncGenerator[ServerSentEvent, None]:
        for chunk in replay_chunks(completion, records, detokenizer, include_usage=include_usage):
            yield _event(chunk)
        yield DONE

    return events()


@dataclass(frozen=True)
class LiveStream:
    """Everything a live stream needs besides its tokens (streaming never calls back into the runtime)."""

    header: ResponseHeader
    n: int
    """Choices sampled for the request."""
    stop: tuple[str, ...]
    """The request's stop strings (text that could begin one is held back)."""
    stop_ids: frozenset[int]
    """The engine's end-of-turn token ids (held back: they never reach the text)."""
    detokenizer: Detokenizer
    logprobs: bool
    """Send each token's logprob (and top alternatives) with it."""
    include_usage: bool


Consume = Callable[
    ["asyncio.Queue[SampledToken | None]", "asyncio.Future[ChatResult]"], AsyncIterator[ServerSentEvent]
]
"""Turns a live call's tokens (``None`` after the last) and the call itself into events (a wire format)."""


def live_call(
    start: StartCall, consume: Consume, stopping: Stopping | None = None
) -> AsyncGenerator[ServerSentEvent, None]:
    """Start the call now and return the events ``consume`` makes of its tokens as they arrive.

    The wire-format-free half of a live stream (OpenAI's `live_events`, Anthropic's in
    `swarm.server.anthropic_routes`): closing the returned iterator before its end (the client went
    away) cancels the call. When the server stops first (``stopping``, `swarm.server.stopping`) the call
    is cancelled the same way (nothing is recorded) and ``consume`` sees it fail with `Unavailable`
    after the tokens sent so far, which each wire format answers with its error event.
    """
    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[SampledToken | None] = asyncio.Queue()

    def on_token(token: SampledToken) -> None:  # engine thread
        loop.call_soon_threadsafe(tokens.put_nowait, token)

    call = start(on_token)
    outcome: asyncio.Future[ChatResult] = loop.create_future()  # what ``consume`` awaits

    def settle(done: asyncio.Future[ChatResult]) -> None:
        tokens.put_nowait(None)
        if outcome.done():
            return
        if done.cancelled():
            outcome.cancel()
        elif (error := done.exception()) is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(done.result())

    def stop() -> None:
        if not outcome.done():
            outcome.set_exception(Unavailable(STOPPED_MESSAGE, retry_after_s=5.0))
            call.cancel(STOP_CANCEL)  # `settle` ends the tokens

    call.add_done_callback(settle)

    async def events() -> AsyncGenerator[ServerSentEvent, None]:
        unwatch = None if stopping is None else stopping.on_stop(stop)
        try:
            async for event in consume(tokens, outcome):
                yield event
        finally:
            if unwatch is not None:
                unwatch()
            if not call.done():  # the client went away: stop sampling an answer nobody will read
                call.cancel()
            if outcome.done() and not outcome.cancelled():
                outcome.exception()  # retrieved: a stream closed before reading it logs nothing

    return events()


def live_events(
    start: StartCall, stream: LiveStream, stopping: Stopping | None = None
) -> AsyncGenerator[ServerSentEvent, None]:
    """Start the call now and return its events as tokens arrive (`live_call`).

    Closing the returned iterator before its end (the client went away) cancels the call. A failure
    after the response has begun (the server's stop included) becomes an error event (OpenAI's form),
    with no ``[DONE]`` after it.
    """
    header, detokenizer = stream.header, stream.detokenizer

    async def _events(
        tokens: asyncio.Queue[SampledToken | None], call: asyncio.Future[ChatResult]
    ) -> AsyncIterator[ServerSentEvent]:
        choices = [ChoiceText(detokenizer, stream.stop_ids, stream.stop) for _ in range(stream.n)]
        for index in range(stream.n):
            yield _event(header.role_chunk(index))
        while (token := await tokens.get()) is not None:
            piece = choices[token.choice].push(token.id, last=token.last)
            logprobs = (
                ChoiceLogprobs(
                    content=[token_logprob(detokenizer, token.id, token.logprob, token.top_logprobs)]
                )
                if stream.logprobs
                else None
            )
            if piece or logprobs is not None:
                yield _event(header.content_chunk(token.choice, piece, logprobs))
        try:
            result = await call
        except Exception as exc:  # the response has begun: the error becomes an event
            yield _event(error_body(exc))
            return
        for index, record in enumerate(result.records):
            rest = choices[index].finish(assistant_message(record).content or "")
            if rest:
                yield _event(header.content_chunk(index, rest))
            yield _event(header.finish_chunk(index, record.finish_reason.value))
        for chunk in header.ending(usage(result) if stream.include_usage else None):
            yield _event(chunk)
        yield DONE

    return live_call(start, _events, stopping)


def encode_events(events: AsyncGenerator[ServerSentEvent, None]) -> AsyncGenerator[bytes, None]:
    """``events`` in the SSE wire format (``data: …\\n\\n``), for an `EventSourceResponse` body.

    A route that answers either JSON or a stream cannot be a FastAPI generator route (which encodes
    `ServerSentEvent` itself), so this does the same encoding with FastAPI's `format_sse_event`.
    Closing the encoder closes ``events``.
    """

    async def encoded() -> AsyncGenerator[bytes, None]:
        async with contextlib.aclosing(events):
            async for event in events:
                data = event.raw_data
                if data is None and event.data is not None:
                    payload = event.data
                    data = (
                        payload.model_dump_json()
                        if isinstance(payload, BaseModel)
                        else json.dumps(jsonable_encoder(payload))
                    )
                yield format_sse_event(
                    data_str=data, event=event.event, id=event.id, retry=event.retry, comment=event.comment
                )

    return encoded()
