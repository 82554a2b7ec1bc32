"""The OpenAI Chat Completions wire format, built from recorded calls.

Pure: everything here is a function of a `ChatResult` (or sampled token ids) and a `Detokenizer`; no
runtime, engine or I/O. `swarm.server.streaming` sends the chunks built here as server-sent events.

A streamed answer is, per choice, a role chunk, content chunks and a finish chunk, then an optional
usage chunk (and ``data: [DONE]``, which streaming adds). Streamed text is released only once it is
certain to be part of the answer (`ChoiceText`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from swarm.engine.base import Completion
from swarm.errors import SwarmError
from swarm.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    ErrorBody,
    ErrorDetail,
    FunctionCall,
    TokenLogprob,
    ToolCall,
    TopLogprob,
    Usage,
)
from swarm.server.chat import ChatResult
from swarm.server.detokenizer import Detokenizer
from swarm.tracking.records import CallRecord

FinishReasonWire = Literal["stop", "length", "tool_calls"]


def policy_fingerprint(policy_version: int) -> str:
    """``system_fingerprint`` of an answer: ``policy-<step>``, the policy version that sampled it."""
    return f"policy-{policy_version}"


@dataclass(frozen=True)
class ResponseHeader:
    """The fields every object of one answer shares (a completion, or each chunk of a stream)."""

    id: str
    created: int
    """Unix time (s)."""
    model: str
    """The model name as the request gave it (``<served>:<agent>`` stays as sent)."""
    system_fingerprint: str | None

    @classmethod
    def new(cls, model: str, policy_version: int, created: float) -> ResponseHeader:
        """A header with a fresh ``chatcmpl-`` id."""
        return cls("chatcmpl-" + uuid.uuid4().hex, int(created), model, policy_fingerprint(policy_version))

    def chunk(self, choice: ChunkChoice | None, usage: Usage | None = None) -> ChatCompletionChunk:
        """One ``chat.completion.chunk`` with at most one choice (none for the usage chunk)."""
        return ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[choice] if choice is not None else [],
            usage=usage,
            system_fingerprint=self.system_fingerprint,
        )

    def role_chunk(self, index: int) -> ChatCompletionChunk:
        """The first chunk of choice ``index``: the assistant role and empty content."""
        return self.chunk(ChunkChoice(index=index, delta=ChunkDelta(role="assistant", content="")))

    def content_chunk(
        self, index: int, content: str, logprobs: ChoiceLogprobs | None = None
    ) -> ChatCompletionChunk:
        return self.chunk(ChunkChoice(index=index, delta=ChunkDelta(content=content), logprobs=logprobs))

    def tool_calls_chunk(self, index: int, tool_calls: Sequence[ToolCall]) -> ChatCompletionChunk:
        """All tool calls of choice ``index`` in one delta (each with its position as ``index``)."""
        calls = [{"index": i, **tc.model_dump()} for i, tc in enumerate(tool_calls)]
        return self.chunk(ChunkChoice(index=index, delta=ChunkDelta(tool_calls=calls)))

    def finish_chunk(self, index: int, reason: FinishReasonWire) -> ChatCompletionChunk:
        """The last chunk of choice ``index``: an empty delta with its finish reason."""
        return self.chunk(ChunkChoice(index=index, delta=ChunkDelta(), finish_reason=reason))

    def ending(self, usage: Usage | None) -> list[ChatCompletionChunk]:
        """What follows the last choice before ``[DONE]``: the usage chunk, when asked for."""
        return [self.chunk(None, usage=usage)] if usage is not None else []


# -- logprobs ----------------------------------------------------------------------------------------------
def token_logprob(
    detokenizer: Detokenizer, token_id: int, logprob: float, top: Sequence[tuple[int, float]]
) -> TokenLogprob:
    """OpenAI's view of one sampled token: its string, UTF-8 bytes, logprob and top alternatives."""
    text = detokenizer.token_text(token_id)
    alternatives = []
    for alt_id, alt_logprob in top:
        alt = detokenizer.token_text(alt_id)
        alternatives.append(TopLogprob(token=alt, logprob=alt_logprob, bytes=list(alt.encode())))
    return TokenLogprob(token=text, logprob=logprob, bytes=list(text.encode()), top_logprobs=alternatives)


def choice_logprobs(detokenizer: Detokenizer, completion: Completion) -> ChoiceLogprobs:
    """OpenAI ``logprobs.content`` of a completion, one entry per token (decoded one id at a time)."""
    tops = completion.top_logprobs
    return ChoiceLogprobs(
        content=[
            token_logprob(detokenizer, token_id, logprob, tops[t] if t < len(tops) else [])
            for t, (token_id, logprob) in enumerate(zip(completion.ids, completion.logprobs, strict=True))
        ]
    )


# -- completions -------------------------------------------------------------------------------------------
def tool_calls(record: CallRecord) -> list[ToolCall] | None:
    """The record's parsed tool calls as wire objects (``None`` when it made none)."""
    calls = [ToolCall(id=tc["id"], function=FunctionCall(**tc["function"])) for tc in record.tool_calls]
    return calls or None


def assistant_message(record: CallRecord) -> AssistantMessage:
    """The answer of one choice: its text (``None`` when it is only tool calls) and tool calls."""
    calls = tool_calls(record)
    return AssistantMessage(content=record.text if record.text or not calls else None, tool_calls=calls)


def usage(result: ChatResult) -> Usage:
    """Token counts of an answer (the prompt is counted once for all ``n`` choices)."""
    completion_tokens = sum(len(r.completion_ids) for r in result.records)
    return Usage(
        prompt_tokens=result.prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=result.prompt_tokens + completion_tokens,
    )


def chat_completion(
    result: ChatResult, header: ResponseHeader, *, logprobs: bool, detokenizer: Detokenizer
) -> ChatCompletion:
    """The ``chat.completion`` object of an answered request.

    Args:
        result: the recorded answer.
        header: id, creation time, model name and fingerprint of the answer.
        logprobs: whether the request asked for ``logprobs`` (with ``top_logprobs`` as sampled).
        detokenizer: decodes the tokens of ``logprobs``.
    """
    choices = [
        Choice(
            index=i,
            message=assistant_message(record),
            finish_reason=record.finish_reason.value,
            logprobs=choice_logprobs(detokenizer, completion) if logprobs else None,
        )
        for i, (record, completion) in enumerate(zip(result.records, result.completions, strict=True))
    ]
    return ChatCompletion(
        id=header.id,
        created=header.created,
        model=header.model,
        choices=choices,
        usage=usage(result),
        system_fingerprint=header.system_fingerprint,
    )


def error_body(exc: BaseException) -> ErrorBody:
    """The ``{"error": ...}`` body of a failure (a swarm error's type and message; others hidden)."""
    detail = (
        ErrorDetail(type=exc.error_type, message=str(exc), code=exc.error_code)
        if isinstance(exc, SwarmError)
        else ErrorDetail(type="server_error", message=f"internal error: {type(exc).__name__}")
    )
    return ErrorBody(error=detail)


# -- streaming ---------------------------------------------------------------------------------------------
def text_pieces(detokenizer: Detokenizer, ids: Sequence[int], content: str) -> list[str]:
    """Split ``content`` into one piece per token of ``ids``, shape (len(ids),).

    Pieces come from incremental decoding, so they concatenate to exactly ``content`` (a token that
    ends inside a multi-byte character yields ``""`` and the next token carries the character;
    tokens past the visible text, such as a stop string or end-of-turn token, yield ``""``).
    """
    pieces: list[str] = []
    emitted = 0
    for t in range(len(ids)):
        decoded = detokenizer.decode(ids[: t + 1])
        if decoded.endswith("\ufffd"):  # incomplete UTF-8 sequence: wait for the next token
            pieces.append("")
            continue
        upto = min(len(decoded), len(content))
        pieces.append(content[emitted:upto] if upto > emitted else "")
        emitted = max(emitted, upto)
    if emitted < len(content) and pieces:
        pieces[-1] += content[emitted:]
    return pieces


def replay_chunks(
    completion: ChatCompletion,
    records: Sequence[CallRecord],
    detokenizer: Detokenizer,
    *,
    include_usage: bool,
) -> Iterator[ChatCompletionChunk]:
    """A finished completion as chunks, one content chunk per token, tool calls once complete.

    Args:
        completion: the answer (`chat_completion`).
        records: its call records, one per choice (their token ids split the text into pieces).
        detokenizer: decodes those ids.
        include_usage: end with the usage chunk (``stream_options.include_usage``).
    """
    header = ResponseHeader(
        completion.id, completion.created, completion.model, completion.system_fingerprint
    )
    for choice, record in zip(completion.choices, records, strict=True):
        yield header.role_chunk(choice.index)
        pieces = text_pieces(detokenizer, record.completion_ids, choice.message.content or "")
        tokens = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
        for t, piece in enumerate(pieces):
            logprobs = ChoiceLogprobs(content=[tokens[t]]) if t < len(tokens) else None
            if piece or logprobs is not None:
                yield header.content_chunk(choice.index, piece, logprobs)
        if choice.message.tool_calls:
            yield header.tool_calls_chunk(choice.index, choice.message.tool_calls)
        yield header.finish_chunk(choice.index, choice.finish_reason)
    yield from header.ending(completion.usage if include_usage else None)


@dataclass
class ChoiceText:
    """The text of one choice streamed as it is sampled: what is certain so far and what was sent.

    Text is released only once it is certain to be part of the answer: an incomplete UTF-8 character,
    the end-of-turn token and the last ``len(stop) - 1`` characters (which could begin a stop string)
    are held back until the next token or the end.

    Args:
        detokenizer: decodes the sampled ids.
        stop_ids: the engine's end-of-turn token ids.
        stop: the request's stop strings.
    """

    detokenizer: Detokenizer
    stop_ids: frozenset[int]
    stop: Sequence[str] = ()
    ids: list[int] = field(default_factory=list)
    """Token ids sampled so far."""
    sent: str = ""
    """Text released so far."""

    def push(self, token_id: int, *, last: bool = False) -> str:
        """Add a sampled token; returns the text it releases (``""`` for the last token, whose text, cut
        at a stop string or end of turn, comes with the record: `finish`)."""
        self.ids.append(token_id)
        return "" if last else self._advance(self._certain())

    def finish(self, content: str) -> str:
        """The rest of the answer once its record's ``content`` is known."""
        return self._advance(content)

    def _certain(self) -> str:
        ids = self.ids[:-1] if self.ids and self.ids[-1] in self.stop_ids else self.ids
        text = self.detokenizer.decode(ids).rstrip("\ufffd")  # U+FFFD: a character still incomplete
        holdback = max((len(s) for s in self.stop), default=1) - 1
        return text[: max(0, len(text) - holdback)]

    def _advance(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta
