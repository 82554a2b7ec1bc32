"""OpenAI-compatible routes: ``POST /v1/chat/completions`` and ``GET /v1/models``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.sse import EventSourceResponse

from swarm.protocol import ChatCompletion, ChatCompletionRequest, ModelCard, ModelList
from swarm.server.deps import EpisodeDep, RuntimeDep
from swarm.server.streaming import live_chunks, replay_chunks

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models")
def list_models(runtime: RuntimeDep) -> ModelList:
    """The served model (agents are addressed as ``<model>:<agent>`` or with the ``user`` field)."""
    return ModelList(data=[ModelCard(id=runtime.model_name)])


@router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(
    body: ChatCompletionRequest, runtime: RuntimeDep, episode: EpisodeDep
) -> ChatCompletion | EventSourceResponse:
    """Sample a chat completion inside the episode that owns the bearer key, recording it token-exactly.

    With ``stream=true`` the answer is sent as server-sent ``chat.completion.chunk`` events as the tokens
    are sampled, ending with ``data: [DONE]`` (`swarm.server.streaming`). A request with ``tools`` is
    streamed once it is complete (only then is it known whether the text is a tool call). The record is
    the same either way.
    """
    include_usage = bool(body.stream_options and body.stream_options.get("include_usage"))
    if body.stream and (not body.tools or body.tool_choice == "none"):
        prepared = runtime.prepare_chat(episode, body)  # bad requests fail before the first byte
        return EventSourceResponse(live_chunks(runtime, episode, body, prepared, include_usage))
    completion, records = await runtime.chat(episode, body)
    if not body.stream:
        return completion
    pieces = [
        runtime.text_pieces(r.completion_ids, c.message.content or "")
        for r, c in zip(records, completion.choices, strict=True)
    ]
    return EventSourceResponse(replay_chunks(completion, pieces, include_usage))
