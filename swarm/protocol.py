"""Pydantic models of every HTTP request and response (shared by server and client).

The OpenAI-compatible models follow the Chat Completions wire format
(https://platform.openai.com/docs/api-reference/chat); unknown request fields are ignored so any
OpenAI SDK or LangChain version can talk to the server. Swarm's own models (episodes, control) are
strict: unknown fields are rejected with 422 so typos never pass silently.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, field_validator

from swarm.tracking.messages import ChatMessage as ChatMessage
from swarm.tracking.messages import FunctionCall as FunctionCall
from swarm.tracking.messages import TextPart as TextPart
from swarm.tracking.messages import ToolCall as ToolCall
from swarm.tracking.records import CallRecord, Sample


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- errors ---------------------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    type: str
    """Machine-readable kind, e.g. ``invalid_request_error``, ``authentication_error``, ``not_found``."""
    message: str
    """What is wrong, in one sentence a person can act on."""
    param: str | None = None
    """The request field at fault, when there is one."""


class ErrorBody(BaseModel):
    """Every error answer: ``{"error": {"type", "message", "param"}}``."""

    error: ErrorDetail


# --- OpenAI chat completions -----------------------------------------------------------------------------
# The request's messages (`ChatMessage`, `ToolCall`, `FunctionCall`, `TextPart`) are defined next to the
# prompt renderer that consumes them (swarm.tracking.messages) and re-exported here.
class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions`` body (OpenAI format; unknown fields ignored)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    presence_penalty: float | None = None
    """Accepted only as 0 (the sampler applies no penalty); refused otherwise rather than ignored."""
    frequency_penalty: float | None = None
    """Accepted only as 0, like ``presence_penalty``."""
    logit_bias: dict[str, float] | None = None
    """Accepted only empty."""
    response_format: dict[str, Any] | None = None
    """Accepted only as ``{"type": "text"}`` (no constrained decoding)."""

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float | None) -> float | None:
        if v:
            raise ValueError("not supported: the sampler applies no penalties (send 0 or leave it out)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("not supported: the sampler applies no logit bias (leave it out)")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type") != "text":
            raise ValueError(
                f"not supported: {v.get('type')!r} needs constrained decoding; ask for the format in the "
                "prompt and parse the text (or use tools)"
            )
        return v

    @field_validator("tool_choice")
    @classmethod
    def _auto_or_none(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in ("auto", "none", "required"):
            raise ValueError(f"{v!r} is not a tool choice: use 'auto' or 'none'")
        if v is not None and v not in ("auto", "none"):
            raise ValueError(
                "only 'auto' and 'none' are supported: the sampler cannot force a tool call "
                "(say in the prompt which tool to call)"
            )
        return v

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None
    """``policy-<step>``: the policy version that sampled this answer."""


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "swarm"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- episodes ---------------------------------------------------------------------------------------------
class EpisodeKind(StrEnum):
    TRAIN = "train"
    """Rolled out for training: pooled and trained on."""
    EVAL = "eval"
    """Evaluation only: recorded and reported, never trained."""


class EpisodeStatus(StrEnum):
    OPEN = "open"
    """Begun; calls are being recorded."""
    FINISHED = "finished"
    """Finished with a reward; committed to the pool."""
    ABORTED = "aborted"
    """Aborted by the client (the agent failed); counts in group statistics as a failed rollout."""
    INFRA_FAILURE = "infra_failure"
    """Aborted for infrastructure reasons (timeouts, outside services, reclaimed); excluded from groups."""


class EpisodeCreate(_Strict):
    """``POST /api/v1/episodes``."""

    task_id: str = Field(min_length=1, max_length=512)
    """Dataset task this episode attempts; episodes of one task form a GRPO group."""
    client_id: str = Field(default="anonymous", min_length=1, max_length=256)
    kind: EpisodeKind = EpisodeKind.TRAIN
    family: str | None = Field(default=None, max_length=128)
    """Task family for cocktail quotas (e.g. ``math``)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    trainable_agents: list[str] | None = None
    """Agent names whose calls are trained; ``None`` trains every agent."""


class EpisodeCreated(BaseModel):
    episode_id: str
    base_url: str
    """OpenAI base URL for this episode's agent (``…/v1``)."""
    api_key: str
    """Secret key of this episode; calls made with it are recorded into it. Stops working when it ends."""
    model: str


MAX_REWARD = 1e9
"""Largest reward magnitude accepted: group statistics square rewards, and 1e300 overflowed the standard
deviation to inf, which zeroed every advantage of the group without a word."""


class EpisodeFinish(_Strict):
    """``POST /api/v1/episodes/{id}/finish``."""

    reward: StrictFloat = Field(ge=-MAX_REWARD, le=MAX_REWARD)
    """A JSON number (not ``true`` or ``"1"``), finite, at most `MAX_REWARD` in magnitude."""
    agent_rewards: dict[str, StrictFloat] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("reward must be a finite number")
        return v

    @field_validator("agent_rewards")
    @classmethod
    def _finite_agents(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {agent: r for agent, r in v.items() if not math.isfinite(r) or abs(r) > MAX_REWARD}
        if bad:
            raise ValueError(f"agent rewards must be finite numbers within ±{MAX_REWARD:g}, got {bad}")
        return v


class EpisodeAbort(_Strict):
    """``POST /api/v1/episodes/{id}/abort``."""

    reason: str = Field(default="aborted by client", max_length=4000)
    infra_failure: bool = False
    """True when the failure was not the agent's (timeouts, outside services): excluded from groups."""


class MergeSummary(BaseModel):
    calls: int = 0
    samples: int = 0
    merge_ratio: float = 0.0
    prefix_breaks: dict[str, int] = Field(default_factory=dict)
    splices: int = 0
    splice_mismatches: int = 0
    tokens_saved: int = 0


class EpisodeView(BaseModel):
    """``GET /api/v1/episodes/{id}``: the token-level record."""

    episode_id: str
    task_id: str
    client_id: str
    kind: EpisodeKind
    family: str | None = None
    status: EpisodeStatus
    reward: float | None = None
    agent_rewards: dict[str, float] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    reason: str | None = None
    created_at: float
    finished_at: float | None = None
    trained_step: int | None = None
    calls: list[CallRecord]
    samples: list[Sample] = Field(default_factory=list)
    merge: MergeSummary = Field(default_factory=MergeSummary)


class Ack(BaseModel):
    ok: bool = True
    episode_id: str | None = None
    status: str | None = None


# --- control --------------------------------------------------------------------------------------------
class EngineState(StrEnum):
    IDLE = "idle"
    """No episode open or pooled yet."""
    ROLLING = "rolling"
    """Admitting episodes and serving completions."""
    DRAINING = "draining"
    """A batch is ready: no new episodes; open ones may finish until the drain timeout."""
    TRAINING = "training"
    """A policy update is running; completions wait, new episodes get 503 + Retry-After."""
    PAUSED = "paused"
    """Paused by an operator: no new episodes, no training."""


class EpisodeCounts(BaseModel):
    open: int = 0
    finished: int = 0
    aborted: int = 0
    infra_failure: int = 0
    pending: int = 0
    """Ended train episodes (finished or aborted, not infra failures) waiting for a step."""
    trained: int = 0
    """Ended train episodes (finished or aborted) consumed by a step (zero-signal groups included)."""


class StatusView(BaseModel):
    """``GET /api/v1/status``."""

    state: EngineState
    step: int
    """Policy version: number of completed trainer steps."""
    model: str
    episodes: EpisodeCounts
    clients: dict[str, int] = Field(default_factory=dict)
    """Open episodes per client id."""
    uptime_s: float
    run_dir: str
    training_enabled: bool
