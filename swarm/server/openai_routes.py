"""OpenAI-compatible routes: ``POST /v1/chat/completions`` and ``GET /v1/models``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.sse import EventSourceResponse

from swarm.engine.base import TokenCallback
from swarm.protocol import ChatCompletion, ChatCompletionRequest, ModelCard, ModelList
from swarm.server.auth import EpisodeDep
from swarm.server.chat import ChatResult
from swarm.server.deps import ChatDep, StoppingDep, error_models
from swarm.server.disconnect import client_gone, gone_answer
from swarm.server.lean_route import LeanRoute
from swarm.server.openai_format import ResponseHeader, chat_completion
from swarm.server.streaming import LiveStream, encode_events, event_stream_answer, live_events, replay_events

router = APIRouter(prefix="/v1", tags=["openai"], route_class=LeanRoute)


@router.get("/models")
def list_models(chat: ChatDep) -> ModelList:
    """The served model (agents are addressed as ``<model>:<agent>`` or with the ``user`` field)."""
    return ModelList(data=[ModelCard(id=chat.model_name)])


_CHAT_ERRORS: dict[int | str, dict[str, Any]] = {
    200: event_stream_answer(
        "A `ChatCompletion`, or with `stream=true` server-sent `chat.completion.chunk` events ending with "
        "`data: [DONE]`."
    ),
    **error_models(
        (400, "A body that is not JSON, messages the chat template cannot render, or a prompt too long."),
        (401, "No episode key."),
        (403, "A key of no open episode (wrong, or its episode has ended), or a client or admin token."),
        (404, "A model this server does not serve."),
        (409, "The episode ended while the call was sampled."),
        (429, "The client token's request rate is spent; see Retry-After."),
    ),
}


@router.post("/chat/completions", response_model=ChatCompletion, responses=_CHAT_ERRORS)
async def chat_completions(
    body: ChatCompletionRequest,
    chat: ChatDep,
    episode: EpisodeDep,
    request: Request,
    response: Response,
    stopping: StoppingDep,
) -> ChatCompletion | EventSourceResponse | Response:
    """Sample a chat completion inside the episode that owns the bearer key, recording it token-exactly.

    With ``stream=true`` the answer is sent as server-sent ``chat.completion.chunk`` events as the tokens
    are sampled, ending with ``data: [DONE]`` (`swarm.server.streaming`). A request with ``tools`` is
    streamed once it is complete (only then is it known whether the text is a tool call). The record is
    the same either way. A non-streamed answer carries a ``Server-Timing`` header (`ChatResult.server_timing`).
    A call whose client goes away before its answer is complete is aborted and not recorded
    (``call.abandoned``; docs/ARCHITECTURE.md §One request's path).
    """
    include_usage = bool(body.stream_options and body.stream_options.get("include_usage"))
    if body.stream and (not body.tools or body.tool_choice == "none"):
        prepared = chat.prepare(episode, body)  # bad requests fail before the first byte

        def start(on_token: TokenCallback) -> asyncio.Future[ChatResult]:
            return chat.spawn(chat.answer(episode, body, prepared=prepared, on_token=on_token))

        stream = LiveStream(
            header=ResponseHeader.new(body.model, chat.policy_version(), time.time()),
            n=prepared.params.n,
            stop=prepared.params.stop,
            stop_ids=chat.engine.stop_ids,
            detokenizer=chat.detokenizer,
            logprobs=body.logprobs,
            include_usage=include_usage,
        )
        return EventSourceResponse(encode_events(live_events(start, stream, stopping)))
    result = await chat.answer_while_connected(episode, body, client_gone(request), stopping)
    if result is None:
        return gone_answer()
    header = ResponseHeader.new(body.model, result.policy_version, result.created_at)
    completion = chat_completion(result, header, logprobs=body.logprobs, detokenizer=chat.detokenizer)
    if not body.stream:
        response.headers["Server-Timing"] = result.server_timing(time.time())
        return completion
    events = replay_events(completion, result.records, chat.detokenizer, include_usage=include_usage)
    return EventSourceResponse(encode_events(events))
