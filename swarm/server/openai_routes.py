"""OpenAI-compatible routes: ``POST /v1/chat/completions`` and ``GET /v1/models``."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi.sse import EventSourceResponse

from swarm.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    ModelCard,
    ModelList,
)
from swarm.server.deps import EpisodeDep, RuntimeDep

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

    With ``stream=true`` the answer is sent as server-sent ``chat.completion.chunk`` events, one per
    generated token, ending with ``data: [DONE]``. Tokens are sent once the completion is sampled (the
    ``hf`` engine batches whole completions); the record is the same either way.
    """
    completion, records = await runtime.chat(episode, body)
    if not body.stream:
        return completion
    include_usage = bool(body.stream_options and body.stream_options.get("include_usage"))
    pieces = [
        runtime.text_pieces(r.completion_ids, c.message.content or "")
        for r, c in zip(records, completion.choices, strict=True)
    ]
    return EventSourceResponse(_stream(completion, pieces, include_usage))


async def _stream(
    completion: ChatCompletion, pieces: list[list[str]], include_usage: bool
) -> AsyncIterator[str]:
    def chunk(choice: ChunkChoice | None, usage: bool = False) -> str:
        msg = ChatCompletionChunk(
            id=completion.id,
            created=completion.created,
            model=completion.model,
            choices=[choice] if choice is not None else [],
            usage=completion.usage if usage else None,
            system_fingerprint=completion.system_fingerprint,
        )
        return f"data: {msg.model_dump_json(exclude_none=True)}\n\n"

    for choice, choice_pieces in zip(completion.choices, pieces, strict=True):
        yield chunk(ChunkChoice(index=choice.index, delta=ChunkDelta(role="assistant", content="")))
        tokens = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
        for t, piece in enumerate(choice_pieces):
            logprobs = ChoiceLogprobs(content=[tokens[t]]) if t < len(tokens) else None
            if piece or logprobs is not None:
                yield chunk(
                    ChunkChoice(index=choice.index, delta=ChunkDelta(content=piece), logprobs=logprobs)
                )
        if choice.message.tool_calls:
            calls = [{"index": i, **tc.model_dump()} for i, tc in enumerate(choice.message.tool_calls)]
            yield chunk(ChunkChoice(index=choice.index, delta=ChunkDelta(tool_calls=calls)))
        yield chunk(ChunkChoice(index=choice.index, delta=ChunkDelta(), finish_reason=choice.finish_reason))
    if include_usage:
        yield chunk(None, usage=True)
    yield "data: [DONE]\n\n"
