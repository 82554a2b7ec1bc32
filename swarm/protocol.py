"""Pydantic models of every HTTP request and response (shared by server and client).

The OpenAI-compatible models follow the Chat Completions wire format
(https://platform.openai.com/docs/api-reference/chat); unknown request fields are ignored so any
OpenAI SDK or LangChain version can talk to the server. Swarm's own models (episodes, control) are
strict: unknown fields are rejected with 422 so typos never pass silently.

The training vocabulary on the wire (``LossAggregation``, ``StepMetrics``, ``StepTimings``) is owned by
``swarm.train`` (torch-free modules) and re-exported here.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    computed_field,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from swarm.tracking.merge import MergeStats
from swarm.tracking.messages import ChatMessage as ChatMessage
from swarm.tracking.messages import FunctionCall as FunctionCall
from swarm.tracking.messages import TextPart as TextPart
from swarm.tracking.messages import ToolCall as ToolCall
from swarm.tracking.records import CallRecord, Sample
from swarm.train.config import LossAggregation as LossAggregation
from swarm.train.metrics import StepMetrics as StepMetrics
from swarm.train.metrics import StepTimings as StepTimings

MIN_TOKEN_CHARS = 16
"""The shortest admin or client token a server takes, wherever it comes from (``swarm serve`` options,
a tokens file, the environment, or added live): 16 characters (≥ 96 bits as ``secrets.token_urlsafe``
writes them)."""

TOKEN_CHARS = re.compile(r"[!-~]+")
"""The characters an admin or client token may hold: visible ASCII (``!`` to ``~``). A header carries
ASCII only (httpx and the SDKs refuse anything else), and HTTP strips surrounding whitespace and cannot
carry a line break, so a token with any other character could never authenticate."""


def check_token_chars(secret: str) -> None:
    """Refuse a token that could never be sent in an ``Authorization`` header (`TOKEN_CHARS`).

    Raises:
        ValueError: naming the rule (never the token).
    """
    if not TOKEN_CHARS.fullmatch(secret):
        raise ValueError(
            "a token may hold only visible ASCII characters (! to ~): no spaces, tabs, line breaks or "
            "non-ASCII letters, which no HTTP header can carry"
        )


ADMIN_OWNER = "admin"
"""The owner recorded for an episode begun with the admin token; no client token may take this name."""


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
    code: str | None = None
    """A finer code where OpenAI's API sends one (``rate_limit_exceeded`` on a 429), else left out."""


class ErrorBody(BaseModel):
    """Every error answer: ``{"error": {"type", "message", "param"}}``."""

    error: ErrorDetail


# --- OpenAI chat completions -----------------------------------------------------------------------------
# The request's messages (`ChatMessage`, `ToolCall`, `FunctionCall`, `TextPart`) are defined next to the
# prompt renderer that consumes them (swarm.tracking.messages) and re-exported here.
def check_unicode(value: Any, where: str = "body") -> None:
    """Raise unless every string in a JSON value is valid Unicode text.

    JSON's ``\\ud800`` escapes decode to lone UTF-16 surrogates, which Python strings hold but no UTF-8
    text can: the tokenizer and the pool would fail on them deep inside (a 500, and an episode that could
    not be stored). Checked at the edge instead.

    Raises:
        ValueError: ``<path>: contains a lone UTF-16 surrogate …``, naming the first bad string's path.
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"{where}: contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_unicode(key, where)
            check_unicode(item, f"{where}.{key}" if where != "body" else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_unicode(item, f"{where}.{i}")


_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


class UnicodeBody(BaseModel):
    """Base of a request body model: the raw body is checked with `check_unicode` before validation."""

    @model_validator(mode="before")
    @classmethod
    def _text_is_unicode(cls, data: Any) -> Any:
        check_unicode(data)
        return data


def only_type(value: dict[str, Any] | None, accepted: str, refusal: str) -> dict[str, Any] | None:
    """A request option that is only accepted absent or as ``{"type": accepted, ...}``, for a field
    validator: ``value`` itself, or ``ValueError("not supported: " + refusal)``."""
    if value is not None and value.get("type") != accepted:
        raise ValueError(f"not supported: {refusal}")
    return value


_NOT_APPLIED = {
    "presence_penalty": "penalties (send 0 or leave it out)",
    "frequency_penalty": "penalties (send 0 or leave it out)",
    "logit_bias": "logit bias (leave it out)",
}
"""Request options the sampler does not apply, accepted only falsy (0, empty, absent): what the refusal
says the sampler applies none of."""


class ChatCompletionRequest(UnicodeBody):
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
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1 - 16)
    """Choice ``i`` is sampled with ``seed + i``; the range keeps that a signed 64-bit integer (torch
    generators refuse more, which failed the whole batch with a 500)."""
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

    @field_validator(*_NOT_APPLIED)
    @classmethod
    def _not_applied(cls, v: Any, info: ValidationInfo) -> Any:
        """A penalty or logit bias the sampler does not apply: accepted only as 0 / empty / absent."""
        if v:
            raise ValueError(f"not supported: the sampler applies no {_NOT_APPLIED[info.field_name or '']}")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        sent = None if v is None else v.get("type")
        refusal = (
            f"{sent!r} needs constrained decoding; ask for the format in the prompt and parse the text "
            "(or use tools)"
        )
        return only_type(v, "text", refusal)

    @field_validator("tools")
    @classmethod
    def _function_tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        """Each tool is ``{"type": "function", "function": {"name", "description"?, "parameters"?}}``
        with a name as OpenAI allows it (``^[a-zA-Z0-9_-]{1,64}$``): a nameless tool could never be
        called, and the chat template would render it as an empty entry."""
        for i, tool in enumerate(v or ()):
            function = tool.get("function")
            if tool.get("type", "function") != "function" or not isinstance(function, dict):
                raise ValueError(
                    f"tools[{i}]: only function tools are supported: {{'type': 'function', 'function': {{...}}}}"
                )
            name = function.get("name")
            if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
                raise ValueError(
                    f"tools[{i}].function.name: {name!r} is not a tool name (1-64 letters, digits, '_' or '-')"
                )
            if "parameters" in function and not isinstance(function["parameters"], dict):
                raise ValueError(f"tools[{i}].function.parameters: must be a JSON Schema object")
        return v

    @field_validator("messages")
    @classmethod
    def _tool_messages_answer_calls(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        """A ``tool`` message answers a call an earlier assistant message of the request made (matched
        by ``tool_call_id``), as in OpenAI's API; an orphan result would be rendered as an answer to
        nothing and trained on as such."""
        called: set[str] = set()
        for i, message in enumerate(messages):
            if message.role == "assistant":
                called.update(call.id for call in message.tool_calls or ())
            elif message.role == "tool" and message.tool_call_id not in called:
                raise ValueError(
                    f"messages[{i}]: a tool message must answer a tool call of an earlier assistant message "
                    f"(its tool_call_id {message.tool_call_id!r} matches none)"
                )
        return messages

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


# --- scoring (a distilling server's teacher) ----------------------------------------------------------------
class ScoreRequest(_Strict):
    """``POST /v1/score``: token ids whose prompt logprobs the served policy should give."""

    token_ids: list[Annotated[StrictInt, Field(ge=0)]] = Field(min_length=2)
    """The sequence, shape (T,): e.g. a call's ``prompt_ids + completion_ids``."""
    start: StrictInt = Field(ge=1)
    """First position scored (``len(prompt_ids)`` to score a completion); position 0 has no context;
    at most ``len(token_ids)`` (nothing scored). Outside ``[1, len]`` is 422 like every other check of the
    body on its own; an id outside the vocabulary or a sequence over the context window is 400 (the
    served model's bounds)."""

    @model_validator(mode="after")
    def _start_within_the_ids(self) -> ScoreRequest:
        if self.start > len(self.token_ids):
            raise ValueError(
                f"start must be in [1, {len(self.token_ids)}] for {len(self.token_ids)} token ids, got {self.start}"
            )
        return self


class ScoreResponse(BaseModel):
    """Answer of ``POST /v1/score``."""

    logprobs: list[float]
    """``log π(token_ids[i] | token_ids[:i])`` for ``i`` in ``[start, T)`` (natural log, temperature 1,
    no top-p: `swarm.engine.base.Engine.score`), shape (T − start,)."""
    policy_version: int
    """The trainer step whose weights scored them."""
    model: str


class TokenizeRequest(BaseModel):
    """``POST /tokenize`` (vLLM's shape): text to tokenize with the served model's tokenizer."""

    prompt: str
    add_special_tokens: StrictBool = False
    model: str | None = None
    """Ignored (vLLM's clients send it)."""


class TokenizeResponse(BaseModel):
    """Answer of ``POST /tokenize``: vLLM's fields plus the tokenizer's fingerprint."""

    tokens: list[int]
    count: int
    max_model_len: int
    tokenizer_fingerprint: str
    """SHA-256 hex of the tokenizer's vocabulary (token → id, special tokens included): two servers with
    the same fingerprint map every text to the same ids (`swarm.server.teacher.tokenizer_fingerprint`)."""


# --- episodes ---------------------------------------------------------------------------------------------
TENANT_ID_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
"""A tenant id: lower-case letters, digits and ``-``, at most 32 characters (it names the tenant's LoRA
adapter and its folder, so no ``.``, ``/`` or ``_``)."""


class EpisodeKind(StrEnum):
    TRAIN = "train"
    """Rolled out for training: pooled and trained on."""
    EVAL = "eval"
    """Evaluation only: recorded and reported, never trained."""


class EpisodeStatus(StrEnum):
    """Where an episode stands: open, or how it ended (the one enum of the server, the pool, the batch
    policies and the client)."""

    OPEN = "open"
    """Begun; calls are being recorded."""
    FINISHED = "finished"
    """Finished with a reward (the client called ``finish``); committed to the pool."""
    ABORTED = "aborted"
    """Aborted by the client for a policy-side reason (the workflow gave up): counts in group statistics
    as a failed rollout, with ``BatchConfig.aborted_reward``."""
    INFRA_FAILURE = "infra_failure"
    """Aborted because infrastructure failed (server, network, sandbox, timeouts, reclaimed): never enters
    group statistics."""
    PREPARED = "prepared"
    """Member of a multi-server finish, stored with its reward but not yet committed: never trained until
    its transaction commits (then ``finished``) or ends up aborted (then ``infra_failure``)
    (docs/ARCHITECTURE.md §Multi-server finish)."""


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
    tenant: str | None = Field(default=None, pattern=TENANT_ID_PATTERN)
    """The LoRA tenant this episode samples and trains under (a server started with ``--tenants``; every
    call of the episode samples with that tenant's current adapter). ``None``: the server's one policy."""


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


Reward = Annotated[StrictFloat, Field(ge=-MAX_REWARD, le=MAX_REWARD, allow_inf_nan=False)]
"""A JSON number (not ``true`` or ``"1"``), finite, at most `MAX_REWARD` in magnitude (the bounds are in the
OpenAPI schema too)."""


class EpisodeFinish(_Strict):
    """``POST /api/v1/episodes/{id}/finish``."""

    reward: Reward
    agent_rewards: dict[str, Reward] = Field(default_factory=dict)
    """Per-agent rewards, each bounded as ``reward``."""
    metrics: dict[str, StrictFloat] = Field(default_factory=dict)
    """Numbers the client measured, by name (JSON numbers: ``true`` or ``"1"`` are refused)."""


_PRIMARY_NAMED_WHOLE: JsonDict = {
    "anyOf": [
        {
            "properties": {"primary_url": {"type": "string"}, "primary_episode_id": {"type": "string"}},
            "required": ["primary_url", "primary_episode_id"],
        },
        {"properties": {"primary_url": {"type": "null"}, "primary_episode_id": {"type": "null"}}},
    ]
}
"""`EpisodePrepare`'s rule that the primary is named whole, or not at all, in its JSON schema."""


class EpisodePrepare(EpisodeFinish):
    """``POST /api/v1/episodes/{id}/prepare``: phase one of a multi-server finish (docs/ARCHITECTURE.md
    §Multi-server finish). The episode is stored ``prepared`` with its reward, not yet trainable."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_PRIMARY_NAMED_WHOLE)

    txn_id: str = Field(min_length=1, max_length=128)
    """The transaction shared by every member of the multi-server episode."""
    primary_url: str | None = Field(default=None, max_length=2048)
    """Server root of the primary member, whose commit decides the transaction; ``None`` when this
    episode is the primary."""
    primary_episode_id: str | None = Field(default=None, max_length=128)
    """Episode id of the primary member (with ``primary_url``)."""

    @model_validator(mode="after")
    def _primary_named_whole(self) -> EpisodePrepare:
        if (self.primary_url is None) != (self.primary_episode_id is None):
            raise ValueError(
                "primary_url and primary_episode_id go together (both, or neither for the primary)"
            )
        return self


class EpisodeCommit(_Strict):
    """``POST /api/v1/episodes/{id}/commit``: phase two; ``txn_id`` must match the prepare."""

    txn_id: str = Field(min_length=1, max_length=128)


class EpisodeAbort(_Strict):
    """``POST /api/v1/episodes/{id}/abort``."""

    reason: str = Field(default="aborted by client", max_length=4000)
    infra_failure: StrictBool = False
    """True when the failure was not the agent's (timeouts, outside services): excluded from groups."""


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
    merge: MergeStats = Field(default_factory=MergeStats)
    """How the episode's calls merged into samples (:func:`swarm.tracking.build_samples`)."""


class Ack(BaseModel):
    ok: bool = True
    episode_id: str | None = None
    status: str | None = None


# --- training vocabulary (values of control fields) -------------------------------------------------------
class BatchPolicy(StrEnum):
    """When the server stops rolling and trains (see :mod:`swarm.batch` for the exact rules)."""

    EPISODES = "episodes"
    """≥ B·G eligible episodes, oldest first; groups may be partial."""
    TASKS = "tasks"
    """≥ B tasks with a full group of G episodes."""
    INFORMATIVE_TASKS = "informative_tasks"
    """≥ B full groups whose rewards are not all equal (zero-signal groups are dropped)."""
    ALL_CLIENTS_READY = "all_clients_ready"
    """Every active client voted ready."""
    ANY_CLIENT_READY = "any_client_ready"
    """At least one active client voted ready."""


TENANT_BATCH_POLICIES = (BatchPolicy.EPISODES, BatchPolicy.TASKS, BatchPolicy.INFORMATIVE_TASKS)
"""The batch policies a LoRA tenant takes: the sized ones. The voting ones (``all_clients_ready``,
``any_client_ready``) need readiness votes, and a client's vote (``POST /api/v1/clients/{id}/ready``) names
no tenant, so a tenant of a voting policy would never train (`swarm.batch.tenant_policy_refusal`)."""


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
    """Two partitions of the episodes this server (its run dir) has begun, which overlap by design. By
    status: ``open + finished + aborted + infra_failure + prepared`` is every episode, train and eval. By
    training: ``pending + trained`` is the finished and aborted *train* episodes (eval episodes and
    infra failures are in neither). So ``trained`` may exceed ``finished``: an aborted train episode (by
    its client, or at a drain timeout) trains too, as a failed rollout."""

    open: int = Field(default=0, description="Episodes begun and not yet ended (in the server's memory).")
    finished: int = Field(default=0, description="Ended with a reward (train and eval).")
    aborted: int = Field(
        default=0, description="Aborted for a policy-side reason (train and eval); a train one is trained."
    )
    infra_failure: int = Field(
        default=0, description="Ended by an infrastructure failure or reclaimed; never trained."
    )
    prepared: int = Field(
        default=0,
        description="Members of multi-server finishes stored but not committed yet (never trained as they are).",
    )
    pending: int = Field(
        default=0,
        description="Finished or aborted train episodes not yet consumed by a step (the pool's backlog).",
    )
    trained: int = Field(
        default=0,
        description="Finished or aborted train episodes consumed by a step (zero-signal groups included); "
        "with pending, a partition of the finished and aborted train episodes, not of all episodes.",
    )
    pending_retired: int = Field(
        default=0,
        description="Of pending: train episodes of retired LoRA tenants, which no step will ever train.",
    )


class DistillStatus(BaseModel):
    """Teacher scoring on a distilling server (``swarm serve --teacher``): what an outage holds back."""

    unscored_episodes: int
    """Ended train episodes the teacher has not scored after trying (an outage, a refused or impossible
    answer): pooled, kept out of training, scored again later (docs/ARCHITECTURE.md §On-policy distillation)."""
    scoring_episodes: int
    """Episodes being scored now."""
    teacher_ok: bool
    """``False`` when the latest scoring failure is newer than the teacher's latest answer."""
    last_failure_at: float | None = None
    """Unix time (s) of the latest scoring failure (absent: none yet)."""
    last_answer_at: float | None = None
    """Unix time (s) of the teacher's latest answer (absent: none yet)."""


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
    active_clients: list[str] = Field(default_factory=list)
    """Clients seen within the client timeout (those the voting policies wait for), sorted."""
    ready_clients: list[str] = Field(default_factory=list)
    """Active clients whose readiness vote stands, sorted."""
    distill: DistillStatus | None = None
    """Teacher scoring, on a server with ``--teacher`` only (absent from the answer otherwise)."""
    tenants: TenantsStatus | None = None
    """The LoRA tenants in brief, on a server with ``--tenants N`` only (absent from the answer otherwise;
    on such a server ``training_enabled`` is false and ``step`` stays 0: the base is never trained, each
    tenant has its own step)."""
    training_per_tenant: bool | None = None
    """``True`` on a server with ``--tenants N``: training is per tenant (each its adapter, settings and
    step, in `tenants`), while ``training_enabled`` and ``step`` are the frozen base's. Absent otherwise."""


class SamplingDefaults(BaseModel):
    """Sampling used when a request leaves a parameter out."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=256, ge=1)
    """Completion cap when the request gives none."""


class _JsonIntegers(BaseModel):
    """A live-config patch whose integer fields take integers as JSON Schema counts them: ``4`` or
    ``4.0`` (the OpenAPI ``type: integer`` lets a client send either), not ``4.5``, ``true`` or ``"4"``."""

    @model_validator(mode="before")
    @classmethod
    def _whole_floats(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {
            name: int(value)
            if isinstance(value, float) and value.is_integer() and name in _integer_fields(cls)
            else value
            for name, value in data.items()
        }


def _integer_fields(model: type[BaseModel]) -> frozenset[str]:
    """Fields of ``model`` typed ``StrictInt`` (or ``StrictInt | None``)."""
    return frozenset(
        name for name, field in model.model_fields.items() if StrictInt in (get_args(field.annotation) or ())
    )


class Limits(BaseModel):
    """What one client may take from a server (docs/ARCHITECTURE.md §Credentials and limits).

    Per client token (the name of the token that began the episode; episodes begun without a token are
    not limited per token): open episodes and requests per second (429 + Retry-After beyond). Per request:
    the body size (413) and the ``max_tokens``, ``n`` and message-count caps of a chat request (422). Per
    server: live ``GET /api/v1/events?follow=true`` subscribers (503 + Retry-After beyond).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    open_episodes_per_token: int | None = Field(default=None, ge=1)
    """Most episodes one client token may hold open at once (``None``: no limit)."""
    requests_per_s_per_token: float | None = Field(default=None, gt=0.0)
    """Sustained begins + chat completions per second per client token, with bursts of up to one second's
    worth (a token bucket; ``None``: no limit)."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest request body, in bytes."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Largest ``max_tokens`` / ``max_completion_tokens`` a chat request may ask for (``None``: the
    context window is the only cap)."""
    max_n: int = Field(default=16, ge=1, le=16)
    """Largest ``n`` (choices per chat request)."""
    max_messages: int = Field(default=2048, ge=1)
    """Most messages in one chat request."""
    max_event_subscribers: int = Field(default=64, ge=1)
    """Most clients following ``GET /api/v1/events`` at once."""


class LimitsPatch(_JsonIntegers):
    """The ``limits`` of a ``PATCH /api/v1/config``: a field left out keeps its value; ``null`` lifts a
    limit that can be off (``open_episodes_per_token``, ``requests_per_s_per_token``, ``max_tokens``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    open_episodes_per_token: StrictInt | None = Field(default=None, ge=1)
    requests_per_s_per_token: StrictFloat | None = Field(default=None, gt=0.0)  # a JSON integer is a float
    max_body_bytes: StrictInt | None = Field(default=None, ge=1024)
    max_tokens: StrictInt | None = Field(
        default=None,
        ge=1,
        description="A chat request's largest max_tokens, at least 1; null lifts the cap (the context window "
        "stays the only one, as `swarm serve --max-request-tokens 0`); 0 is refused (422 saying so).",
    )
    max_n: StrictInt | None = Field(default=None, ge=1, le=16)
    max_messages: StrictInt | None = Field(default=None, ge=1)
    max_event_subscribers: StrictInt | None = Field(default=None, ge=1)

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _zero_is_not_a_cap(cls, value: Any) -> Any:
        if type(value) is int and value == 0:  # the command line's 0 (no cap) is null here
            raise ValueError(
                "0 is not a cap: a cap is at least 1, and null lifts it (as swarm serve --max-request-tokens 0)"
            )
        return value

    def applied_to(self, limits: Limits) -> Limits:
        """``limits`` with this patch's fields set.

        Raises:
            ValueError: a limit that cannot be off is set to ``null`` (the message names it).
        """
        changes = self.model_dump(exclude_unset=True)
        for name, value in changes.items():
            if value is None and Limits.model_fields[name].default is not None:
                raise ValueError(f"limits.{name}: null is not a value (this limit cannot be lifted)")
        return Limits.model_validate({**limits.model_dump(), **changes})


class ClientTokenCreate(_Strict):
    """``POST /api/v1/client-tokens``: add a client token live (admin)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """A label for the token (the pool and the events name episodes' owners by it; never the token)."""
    token: str | None = Field(
        default=None,
        min_length=MIN_TOKEN_CHARS,
        max_length=512,
        json_schema_extra={"pattern": f"^[!-~]{{{MIN_TOKEN_CHARS},512}}$"},  # checked by ``_sendable``
    )
    """The secret itself (at least `MIN_TOKEN_CHARS`, `TOKEN_CHARS` only); ``None`` lets the server mint a
    random one."""
    tenants: (
        Annotated[
            list[Annotated[str, Field(pattern=TENANT_ID_PATTERN)]],
            Field(min_length=1, json_schema_extra={"uniqueItems": True}),
        ]
        | None
    ) = None
    """The LoRA tenants this token may begin episodes under (403 for any other, and for an episode
    without a tenant); ``None``: no restriction. Not empty (422: such a token could begin nothing), each
    id once (422 for a repeat), and only on a server started with ``--tenants`` (409 elsewhere, for the
    same reason). An id need not name a tenant that exists now: a token may be made before its tenant is
    created (and outlives a retired one); its begins under an absent tenant get that tenant's 404."""

    @field_validator("tenants", mode="before")
    @classmethod
    def _some_tenant(cls, tenants: Any) -> Any:
        if isinstance(tenants, list) and not tenants:
            raise ValueError(
                "an empty list limits the token to no tenant, so it could begin nothing: name its tenants, "
                "or leave tenants out for no limit"
            )
        if isinstance(tenants, list):
            repeated = sorted({t for t in tenants if isinstance(t, str) and tenants.count(t) > 1})
            if repeated:
                raise ValueError(
                    f"tenant {', '.join(map(repr, repeated))} named more than once: name each once"
                )
        return tenants

    @field_validator("token")
    @classmethod
    def _sendable(cls, token: str | None) -> str | None:
        if token is not None:
            check_token_chars(token)
        return token


class ClientTokenCreated(BaseModel):
    """Answer of ``POST /api/v1/client-tokens``: the only answer that ever shows the token."""

    name: str
    token: str


class ClientTokenView(BaseModel):
    """One configured client token, by name (``GET /api/v1/client-tokens``; the secret is never shown)."""

    name: str
    open_episodes: int = 0
    """Episodes this token has open now."""
    tenants: list[str] | None = None
    """The LoRA tenants it may begin episodes under, sorted (``ClientTokenCreate.tenants``); ``None``: any."""


class ClientTokenRevoked(BaseModel):
    """Answer of ``DELETE /api/v1/client-tokens/{name}``: the token no longer begins, finishes or reads
    anything; its open episodes keep running under their episode keys until they end."""

    name: str
    open_episodes: int
    """Episodes it had open (their episode keys still finish them)."""


class ConfigView(BaseModel):
    """``GET /api/v1/config``: the configuration the next step will use (staged changes included)."""

    training: dict[str, Any]
    """:class:`swarm.config.TrainingConfig` as JSON, with the trainer changes staged for the next step
    (empty on a server in inference mode)."""
    sampling: SamplingDefaults
    limits: Limits = Field(default_factory=Limits)
    """What one client may take (:class:`Limits`)."""


class PolicySettings(_JsonIntegers):
    """The training settings each policy has: changed live for the server's policy (:class:`ConfigPatch`)
    or chosen when a LoRA tenant is created (:class:`TenantCreate`). A field left out keeps the server's
    value; values of the wrong JSON type (``true`` or ``"4"`` for a number) and non-finite numbers are
    refused (422)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    lr: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    kl_coef: StrictFloat | None = Field(default=None, ge=0.0)
    ppo_epochs: StrictInt | None = Field(default=None, ge=1)
    minibatches: StrictInt | None = Field(default=None, ge=1)
    batch_policy: BatchPolicy | None = None
    batch_size: StrictInt | None = Field(default=None, ge=1)
    """B: tasks (or episodes, by policy) per step."""
    group_size: StrictInt | None = Field(default=None, ge=1)
    """G: episodes per task."""
    max_steps: StrictInt | None = Field(default=None, ge=1)


class ConfigPatch(PolicySettings):
    """``PATCH /api/v1/config``: live changes, validated at once, effective from the next step.

    A field left out keeps its value; an explicit ``null`` is refused (422) rather than ignored.
    """

    weight_decay: StrictFloat | None = Field(default=None, ge=0.0)
    max_grad_norm: StrictFloat | None = Field(default=None, gt=0.0)
    clip_eps_low: StrictFloat | None = Field(default=None, ge=0.0, lt=1.0)
    clip_eps_high: StrictFloat | None = Field(default=None, ge=0.0)
    entropy_coef: StrictFloat | None = Field(default=None, ge=0.0)
    loss_agg: LossAggregation | None = None
    normalize_std: StrictBool | None = None
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=2.0)
    """Default sampling temperature (requests that set one keep theirs)."""
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    quotas: dict[str, StrictFloat] | None = None
    """Family shares, e.g. ``{"math": 0.4, "code": 0.6}``; ``{}`` removes quotas."""
    training_enabled: StrictBool | None = None
    drain_timeout_s: StrictFloat | None = Field(default=None, ge=0.0)
    max_staleness: StrictInt | None = Field(default=None, ge=0)
    """Change K of asynchronous mode (a synchronous server stays synchronous; ``null`` is refused)."""
    checkpoint_every: StrictInt | None = Field(default=None, ge=1)
    distill_coef: StrictFloat | None = Field(default=None, ge=0.0)
    """Weight of the reverse-KL advantage in ``mixed`` distillation (a server started with ``--teacher``)."""
    limits: LimitsPatch | None = None
    """Live changes to the server's :class:`Limits` (take effect at once, not at the next step)."""


class ConfigChanged(BaseModel):
    """Answer of ``PATCH /api/v1/config``: the fields changed and the configuration now staged."""

    changed: dict[str, Any]
    """The patch's fields with their new values (fields left out are not listed)."""
    config: ConfigView


class CheckpointSaved(BaseModel):
    """Answer of ``POST /api/v1/checkpoint``."""

    step: int
    """Policy version saved."""
    path: str
    """Checkpoint folder on the server (``<run dir>/checkpoints/step-NNNNNN``)."""


class Vote(BaseModel):
    """``POST /api/v1/clients/{client_id}/ready``: a client's readiness vote."""

    model_config = ConfigDict(extra="forbid")

    ready: bool = True


class VoteCast(BaseModel):
    """Answer of ``POST /api/v1/clients/{client_id}/ready``."""

    client_id: str
    ready: bool


class ClientState(BaseModel):
    """Answer of ``POST /api/v1/clients/{client_id}/heartbeat`` and ``DELETE /api/v1/clients/{client_id}``."""

    client_id: str
    active: bool
    """Whether the client counts as active for the voting policies now (``False`` after it left)."""
    ready: bool
    """Whether its readiness vote stands."""


_WIRE_MERGE_FIELDS = (
    "calls",
    "merge_ratio",
    "prefix_breaks",
    "token_breaks",
    "text_merges",
    "splices",
    "tokens_saved",
)
"""The fields of a batch's `MergeStats` that a metrics row carries (at its top level, by these names)."""


def _merge_field(name: str, doc: str) -> Any:
    """A read-only computed field of `ServerStepMetrics` that serves ``self.merge.<name>`` (a `MergeStats`
    field of `_WIRE_MERGE_FIELDS`) at the row's top level, typed as that field and documented by ``doc``."""

    def get(self: ServerStepMetrics) -> Any:
        return getattr(self.merge, name)

    get.__name__ = name
    get.__doc__ = doc
    return computed_field(return_type=MergeStats.model_fields[name].annotation)(property(get))


class ServerStepMetrics(StepMetrics):
    """A trainer step's metrics plus what the server knows about the batch: one row of
    ``GET /api/v1/metrics`` and one line of ``metrics.jsonl``.

    The batch's merge statistics are one `MergeStats` (:attr:`merge`); a row carries seven of its fields
    at its top level (``calls``, ``merge_ratio``, ``prefix_breaks``, ``token_breaks``, ``text_merges``,
    ``splices``, ``tokens_saved``: read-only properties here), and a row read back nests them again
    (the other fields of :attr:`merge` are then at their defaults)."""

    batch_policy: str = ""
    groups: int = 0
    """GRPO groups (tasks) in the batch."""
    episodes_dropped: int = 0
    """Episodes consumed without training (zero-signal groups, infra failures)."""
    merge: MergeStats = Field(default_factory=lambda: MergeStats(episodes=0), exclude=True)
    """Merge statistics of the batch's episodes (`swarm.tracking.merge.aggregate_stats`)."""
    drain_s: float = 0.0
    """Seconds spent draining open episodes before the step."""
    drain_aborted: int = 0
    """Open episodes aborted at the drain timeout (synchronous)."""
    stale_aborted: int = 0
    """Open episodes aborted as too stale when the step started (asynchronous)."""
    staleness_mean: float = 0.0
    """Mean over trained episodes of (policy version updated − version of the episode's oldest call)."""
    staleness_max: int = 0
    checkpoint_s: float = 0.0
    rewound_steps: list[int] = Field(default_factory=list)
    """On the first row after a restart: the steps whose update was lost with the previous process (the
    run resumed from the last checkpoint, so this row's step number was used before). Empty otherwise."""
    distill: dict[str, float] = Field(default_factory=dict)
    """On-policy distillation (``--teacher``), metric ``distill/<key>`` under ``<key>``: ``teacher_kl``,
    ``teacher_kl/<agent>``, ``scored_frac``, ``teacher_latency_s``, ``unscored_episodes`` (docs/METRICS.md);
    empty without a teacher."""

    @model_validator(mode="before")
    @classmethod
    def _nest_merge(cls, data: Any) -> Any:
        """A row as served or logged (merge fields at the top level) → ``merge`` nested."""
        if isinstance(data, dict) and "merge" not in data:
            merge = {name: data[name] for name in _WIRE_MERGE_FIELDS if name in data}
            return {**data, "merge": MergeStats(episodes=0, **merge)}
        return data

    # The seven `_WIRE_MERGE_FIELDS`, in that order: read-only passes through to :attr:`merge`.
    calls = _merge_field("calls", "Call records merged into the batch's samples.")
    merge_ratio = _merge_field("merge_ratio", "Calls per training sample.")
    prefix_breaks = _merge_field(
        "prefix_breaks", "Calls that extend no call of their agent token-exactly, by `PrefixBreak` cause."
    )
    token_breaks = _merge_field(
        "token_breaks", "Calls that extend no call of their agent token-exactly (Σ ``prefix_breaks``)."
    )
    text_merges = _merge_field("text_merges", "Calls joined to a chain by text only (``--merge text``).")
    splices = _merge_field("splices", "Assistant spans reused token-exactly (drift repairs).")
    tokens_saved = _merge_field("tokens_saved", "Prompt tokens not recomputed thanks to prefix merging.")


EventLevel = Literal["debug", "info", "warning", "error"]


class Event(BaseModel):
    """One server log event (``GET /api/v1/events`` streams these as server-sent events)."""

    seq: int
    """Monotonic number within the run dir: a restarted server numbers on from the last event of
    ``events.jsonl`` (SSE ``id``)."""
    time: float
    """Unix time in seconds."""
    level: EventLevel = "info"
    kind: str
    """Short machine-readable kind, e.g. ``episode.finished``, ``train.step``, ``config.changed``."""
    message: str
    data: dict[str, Any] = Field(default_factory=dict)
    tenant: str | None = None
    """The LoRA tenant the event concerns (``swarm serve --tenants``: its steps, checkpoints, episodes and
    lifecycle; also in ``data`` as ``tenant``); ``None``: the server's own. ``GET /api/v1/events?tenant=``
    keeps one tenant's events."""


# -- LoRA tenants (``swarm serve --tenants N``) ---------------------------------------------------------


class TenantState(StrEnum):
    """A tenant's life: ``active`` samples and trains; ``paused`` (by the admin) and ``failed`` (its step
    crashed or its trainer rejected a batch, e.g. a non-finite gradient) admit no episode and do not
    train until resumed; ``retired`` is gone (its adapter saved as a LoRA checkpoint); ``creating``: its
    ``POST`` is still injecting its adapter (it holds its id and a place under the cap; its other routes
    answer 409 until it is active)."""

    CREATING = "creating"
    ACTIVE = "active"
    PAUSED = "paused"
    FAILED = "failed"
    RETIRED = "retired"


class NoOptions(_Strict):
    """The body of a route that takes no options (``POST /api/v1/pause``, ``/resume``, ``/checkpoint``,
    ``/api/v1/episodes/{id}/heartbeat``, ``/api/v1/clients/{id}/heartbeat``, and a tenant's ``/pause``,
    ``/resume`` and ``/retire``): none, or ``{}``. Any field is refused (422 naming it), and a body that is
    not JSON is a 400 (415 without a JSON content type), as on every route, rather than ignored."""


class TenantBrief(BaseModel):
    """One resident tenant in ``GET /api/v1/status`` (all of it: ``GET /api/v1/tenants/{id}``)."""

    id: str
    state: TenantState
    step: int
    """Its policy version: completed steps of its adapter."""


class TenantsStatus(BaseModel):
    """The LoRA tenants of a server started with ``--tenants N`` (`StatusView.tenants`)."""

    cap: int
    """Most tenants resident at once (``--tenants N``)."""
    resident: int
    """Tenants holding a place under the cap: active, paused, failed or being created."""
    retired: int
    tenants: list[TenantBrief] = Field(default_factory=list)
    """The resident tenants, by id."""


class TenantCreate(PolicySettings):
    """``POST /api/v1/tenants`` (admin): a new LoRA policy over the server's frozen base model.

    Fields left out take the server's value (its ``swarm serve`` options); the adapter's rank and target
    modules are the server's (``--lora-rank``)."""

    id: str = Field(pattern=TENANT_ID_PATTERN)
    lr: StrictFloat | None = Field(default=None, gt=0.0, le=1.0)
    """Its AdamW learning rate, above 0 (a tenant at lr 0 would never change: its LoRA B stays zero)."""
    clip_eps: StrictFloat | None = Field(default=None, gt=0.0)
    """Both PPO clip bounds (``clip_eps_low`` = ``clip_eps_high``)."""
    seed: StrictInt | None = None
    """Seeds the adapter's initial weights (peft's LoRA init: A random, B zero); ``None``: torch's state."""

    @field_validator("batch_policy", mode="wrap")
    @classmethod
    def _tenant_policy(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """An unknown policy is refused naming only the policies a tenant takes (fresh-s6 #6), not the
        voting ones the server then refuses (`swarm.batch.tenant_policy_refusal`)."""
        try:
            return handler(value)
        except ValidationError:
            names = ", ".join(p.value for p in TENANT_BATCH_POLICIES)
            raise ValueError(f"tenants take the batch policies {names}, not {value!r}") from None


class TenantView(BaseModel):
    """One tenant (``GET /api/v1/tenants``, and the answer of every tenant route)."""

    id: str
    state: TenantState
    reason: str | None = None
    """Why it is paused, failed or retired."""
    step: int
    """Its policy version: completed steps of its adapter."""
    open_episodes: int = 0
    pending: int = 0
    """Its ended, untrained train episodes."""
    trained: int = 0
    """Its train episodes consumed by a step."""
    settings: dict[str, Any] = Field(default_factory=dict)
    """Its training settings (lr, B, G, KL, clip, epochs, minibatches, batch policy, max_steps)."""
    checkpoint: str | None = None
    """A retired tenant's adapter: a LoRA checkpoint folder (``PeftModel.from_pretrained``)."""
