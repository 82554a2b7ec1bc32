"""Server-sent ``chat.completion.chunk`` events for ``stream=true`` chat requests.

Two ways to stream, one wire format (OpenAI's): a role chunk per choice, content chunks, a finish chunk
per choice, an optional usage chunk, then ``data: [DONE]``.

- `live_chunks` forwards tokens *as the engine samples them* (time to first token is one decode step).
  Text is released only once it is certain to be part of the answer: an incomplete UTF-8 character, the
  end-of-turn token and the last ``len(stop) - 1`` characters (which could begin a stop string) are held
  back until the next token or the end. A client that disconnects mid-stream cancels its call: the
  engine stops sampling it and nothing is recorded (the agent never saw that answer, so it is not part
  of the trajectory).
- `replay_chunks` sends a finished completion as chunks, one per token. Requests with ``tools`` use it:
  whether the text is a tool call is known only once the completion is complete.

The record is the same either way: the token ids, logprobs and text of `CallRecord`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from swarm.engine.base import SampledToken
from swarm.errors import SwarmError
from swarm.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    ErrorBody,
    ErrorDetail,
    Usage,
)
from swarm.server.episodes import OpenEpisode
from swarm.server.runtime import PreparedCall, SwarmRuntime

__all__ = ["live_chunks", "replay_chunks"]

DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class _ChunkHeader:
    id: str
    created: int
    model: str
    system_fingerprint: str | None

    def event(self, choice: ChunkChoice | None, usage: Usage | None = None) -> str:
        msg = ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[choice] if choice is not None else [],
            usage=usage,
            system_fingerprint=self.system_fingerprint,
        )
        return f"data: {msg.model_dump_json(exclude_none=True)}\n\n"

    def finish(self, index: int, reason: Literal["stop", "length", "tool_calls"]) -> str:
        """The last chunk of choice ``index``: an empty delta with its finish reason."""
        return self.event(ChunkChoice(index=index, delta=ChunkDelta(), finish_reason=reason))

    def ending(self, usage: Usage | None) -> list[str]:
        """What follows the last choice: the usage chunk (when asked for) and ``[DONE]``."""
        return ([self.event(None, usage=usage)] if usage is not None else []) + [DONE]


def replay_chunks(
    completion: ChatCompletion, pieces: Sequence[Sequence[str]], include_usage: bool
) -> AsyncIterator[str]:
    """Chunks of a finished completion; ``pieces[i]`` is choice i's text split per token
    (`SwarmRuntime.text_pieces`)."""
    header = _ChunkHeader(completion.id, completion.created, completion.model, completion.system_fingerprint)

    async def events() -> AsyncIterator[str]:
        for choice, choice_pieces in zip(completion.choices, pieces, strict=True):
            yield header.event(
                ChunkChoice(index=choice.index, delta=ChunkDelta(role="assistant", content=""))
            )
            tokens = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
            for t, piece in enumerate(choice_pieces):
                logprobs = ChoiceLogprobs(content=[tokens[t]]) if t < len(tokens) else None
                if piece or logprobs is not None:
                    delta = ChunkDelta(content=piece)
                    yield header.event(ChunkChoice(index=choice.index, delta=delta, logprobs=logprobs))
            if choice.message.tool_calls:
                calls = [{"index": i, **tc.model_dump()} for i, tc in enumerate(choice.message.tool_calls)]
                yield header.event(ChunkChoice(index=choice.index, delta=ChunkDelta(tool_calls=calls)))
            yield header.finish(choice.index, choice.finish_reason)
        for event in header.ending(completion.usage if include_usage else None):
            yield event

    return events()


@dataclass
class _ChoiceText:
    """What one choice has sampled and sent so far."""

    ids: list[int] = field(default_factory=list)
    sent: str = ""
    ended: bool = False


def live_chunks(
    runtime: SwarmRuntime,
    episode: OpenEpisode,
    request: ChatCompletionRequest,
    prepared: PreparedCall,
    include_usage: bool,
) -> AsyncIterator[str]:
    """Start sampling ``request`` now and return its chunks as tokens arrive.

    Closing the returned iterator before its end (the client went away) cancels the call.
    """
    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[SampledToken | None] = asyncio.Queue()

    def on_token(token: SampledToken) -> None:  # engine thread
        loop.call_soon_threadsafe(tokens.put_nowait, token)

    call = runtime.spawn(runtime.chat(episode, request, prepared=prepared, on_token=on_token))
    call.add_done_callback(lambda _: tokens.put_nowait(None))
    header = _ChunkHeader(
        "chatcmpl-" + uuid.uuid4().hex, int(time.time()), request.model, f"policy-{runtime.step}"
    )
    n, params = prepared.params.n, prepared.params
    holdback = max((len(s) for s in params.stop), default=1) - 1
    end_of_turn = runtime.engine.stop_ids

    def releasable(state: _ChoiceText) -> str:
        ids = state.ids[:-1] if state.ids and state.ids[-1] in end_of_turn else state.ids
        text = runtime.decode(ids).rstrip("\ufffd")  # U+FFFD: a character still incomplete
        return text[: max(0, len(text) - holdback)]

    def content_delta(state: _ChoiceText, text: str) -> str:
        if len(text) <= len(state.sent) or not text.startswith(state.sent):
            return ""
        delta, state.sent = text[len(state.sent) :], text
        return delta

    async def events() -> AsyncIterator[str]:
        try:
            async for event in _events():
                yield event
        finally:
            if not call.done():  # the client went away: stop sampling an answer nobody will read
                call.cancel()

    async def _events() -> AsyncIterator[str]:
        choices = [_ChoiceText() for _ in range(n)]
        for index in range(n):
            yield header.event(ChunkChoice(index=index, delta=ChunkDelta(role="assistant", content="")))
        while (token := await tokens.get()) is not None:
            state = choices[token.choice]
            state.ids.append(token.id)
            state.ended = token.last
            # The last token's text (cut at a stop string, end of turn) comes with the record below.
            piece = "" if token.last else content_delta(state, releasable(state))
            logprobs = (
                ChoiceLogprobs(content=[runtime.token_logprob(token.id, token.logprob, token.top_logprobs)])
                if request.logprobs
                else None
            )
            if piece or logprobs is not None:
                delta = ChunkDelta(content=piece)
                yield header.event(ChunkChoice(index=token.choice, delta=delta, logprobs=logprobs))
        try:
            completion, _ = await call
        except Exception as exc:  # the response has begun: the error becomes an event (OpenAI's form)
            detail = (
                ErrorDetail(type=exc.error_type, message=str(exc))
                if isinstance(exc, SwarmError)
                else ErrorDetail(type="server_error", message=f"internal error: {type(exc).__name__}")
            )
            body = ErrorBody(error=detail)
            yield f"data: {body.model_dump_json(exclude_none=True)}\n\n"
            return
        for choice in completion.choices:
            rest = content_delta(choices[choice.index], choice.message.content or "")
            if rest:
                yield header.event(ChunkChoice(index=choice.index, delta=ChunkDelta(content=rest)))
            yield header.finish(choice.index, choice.finish_reason)
        for event in header.ending(completion.usage if include_usage else None):
            yield event

    return events()
