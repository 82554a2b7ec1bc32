"""Anthropic-compatible routes: ``POST /v1/messages`` (the Messages API, streaming included) and
``POST /v1/messages/count_tokens``.

A Messages request is mapped onto the internal chat request (`anthropic_format.to_chat_request`) and
sampled and recorded by `ChatService.answer`, exactly like a chat completion: same renderer, same
splicing, same call records, same merged samples. Errors on this route have Anthropic's shape
(``{"type": "error", "error": {...}}``, set in `swarm.server.app`). The episode key is accepted as
``x-api-key`` (the SDK's ``api_key``) or as a bearer token (its ``auth_token``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

import swarm.server.anthropic_format as fmt
from swarm.engine.base import SampledToken, TokenCallback
from swarm.errors import SwarmError
from swarm.server.auth import EpisodeDep
from swarm.server.chat import ChatResult
from swarm.server.deps import (
    ALLOW_HEADER,
    HEAD_TOO_LARGE,
    METHOD_NOT_ALLOWED,
    REQUEST_TIMEOUT,
    ChatDep,
    StoppingDep,
    json_errors,
)
from swarm.server.disconnect import client_gone, gone_answer
from swarm.server.openai_format import ChoiceText
from swarm.server.streaming import encode_events, event_stream_answer, live_call

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": fmt.ErrorResponse, "description": description}
    for status, description in (
        (
            400,
            "Invalid request (a bad body is 400 here, as in Anthropic's API); the message names the field.",
        ),
        (401, "Missing episode key (x-api-key or bearer)."),
        (403, "A key of no open episode (wrong, or its episode has ended), or a client or admin token."),
        (404, "Unknown model or episode."),
        (409, "The episode ended while the call ran."),
        METHOD_NOT_ALLOWED,
        (413, "The request body is larger than the server's limit."),
        (415, "A body sent with a Content-Type that is not JSON, or without one."),
        (429, "A limit of the client's token was reached (Retry-After)."),
    )
}
"""Error answers of the Anthropic routes, declared in Anthropic's shape (what the server sends there), but
for the 408 and 431 the HTTP layer sends before the app (in the server's own shape)."""
ERRORS[405]["headers"] = ALLOW_HEADER
ERRORS.update(json_errors(REQUEST_TIMEOUT, HEAD_TOO_LARGE))

router = APIRouter(prefix="/v1", tags=["anthropic"], responses=ERRORS)

MessagesEpisodeDep = EpisodeDep
"""The episode key as ``x-api-key`` (the Anthropic SDK's ``api_key``) or a bearer token (`swarm.server.auth`)."""


def _sse(event: fmt.Event) -> ServerSentEvent:
    name, payload = event
    return ServerSentEvent(event=name, raw_data=json.dumps(payload, ensure_ascii=False))


def _error_event(exc: BaseException) -> ServerSentEvent:
    if isinstance(exc, SwarmError):
        return _sse(("error", fmt.error_body(exc.status_code, str(exc))))
    return _sse(("error", fmt.error_body(500, f"internal error: {type(exc).__name__}")))


async def _replayed(events: Iterable[fmt.Event]) -> AsyncGenerator[ServerSentEvent, None]:
    for event in events:
        yield _sse(event)


@router.post(
    "/messages",
    response_model=fmt.Message,
    responses={
        200: event_stream_answer("A `Message`, or with `stream: true` Anthropic's server-sent events.")
    },
)
async def create_message(
    body: fmt.MessagesRequest,
    chat: ChatDep,
    episode: MessagesEpisodeDep,
    request: Request,
    response: Response,
    stopping: StoppingDep,
) -> fmt.Message | EventSourceResponse | Response:
    """Sample a message inside the episode that owns the key, recording it token-exactly.

    With ``stream: true`` the answer is sent as Anthropic's server-sent events as the tokens are
    sampled. A request with ``tools`` is streamed once it is complete (only then is it known whether
    the text is a tool call). The record is the same either way. A non-streamed answer carries a
    ``Server-Timing`` header (`ChatResult.server_timing`). A call whose client goes away before its answer
    is complete is aborted and not recorded (``call.abandoned``).
    """
    chat_request = fmt.to_chat_request(body)
    message_id = fmt.new_message_id()
    stop = tuple(body.stop_sequences or ())
    stop_ids = chat.engine.stop_ids
    detokenizer = chat.detokenizer
    if body.stream and (not chat_request.tools or chat_request.tool_choice == "none"):
        prepared = chat.prepare(episode, chat_request)  # bad requests fail before the first byte

        def start(on_token: TokenCallback) -> asyncio.Future[ChatResult]:
            return chat.spawn(chat.answer(episode, chat_request, prepared=prepared, on_token=on_token))

        async def consume(
            tokens: asyncio.Queue[SampledToken | None], call: asyncio.Future[ChatResult]
        ) -> AsyncIterator[ServerSentEvent]:
            yield _sse(fmt.message_start(message_id, body.model, len(prepared.rendered.prompt_ids)))
            yield _sse(fmt.block_start(0, fmt.TextBlock(text="")))
            yield _sse(fmt.PING)
            text = ChoiceText(detokenizer, stop_ids, stop)
            while (token := await tokens.get()) is not None:
                piece = text.push(token.id, last=token.last)
                if piece:
                    yield _sse(fmt.text_delta(0, piece))
            try:
                result = await call
            except Exception as exc:  # the response has begun: the error becomes an event
                yield _error_event(exc)
                return
            (record,) = result.records
            rest = text.finish(record.text)
            if rest:
                yield _sse(fmt.text_delta(0, rest))
            yield _sse(fmt.block_stop(0))
            reason, sequence = fmt.stop_reason(record, detokenizer, stop, stop_ids)
            for event in fmt.message_end(reason, sequence, len(record.completion_ids)):
                yield _sse(event)

        return EventSourceResponse(encode_events(live_call(start, consume, stopping)))
    result = await chat.answer_while_connected(episode, chat_request, client_gone(request), stopping)
    if result is None:
        return gone_answer()
    answer = fmt.message(
        result, message_id=message_id, model=body.model, detokenizer=detokenizer, stop=stop, stop_ids=stop_ids
    )
    if not body.stream:
        response.headers["Server-Timing"] = result.server_timing(time.time())
        return answer
    events = fmt.replay_events(answer, result.records[0], detokenizer)
    return EventSourceResponse(encode_events(_replayed(events)))


@router.post("/messages/count_tokens", response_model=fmt.TokenCount)
async def count_tokens(
    body: fmt.CountTokensRequest, chat: ChatDep, episode: MessagesEpisodeDep
) -> fmt.TokenCount:
    """The prompt length a Messages request would have in this episode (rendered and spliced exactly as
    `create_message` would, under the same caps and request rate; nothing is sampled or recorded)."""
    return fmt.TokenCount(input_tokens=chat.count_prompt_tokens(episode, fmt.to_chat_request(body)))
