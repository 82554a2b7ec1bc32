"""Typed, token-exact records of what the engine saw and produced.

A :class:`CallRecord` is one chat-completion choice made inside an episode: the exact prompt ids the
engine consumed, the completion ids it sampled and the sampler's logprobs for them. Records are the
source of truth for training; nothing used for training is re-tokenized from text
(docs/ARCHITECTURE.md §Call record).

A :class:`Sample` is what the trainer consumes: one maximal prefix chain of calls merged into a single
token sequence with a loss mask (built by :mod:`swarm.tracking.merge`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class FinishReason(StrEnum):
    """Why the engine stopped sampling a completion."""

    STOP = "stop"
    """An end-of-turn token or a stop string ended the completion (the model finished)."""
    LENGTH = "length"
    """``max_tokens`` or the context window cut the completion (the chain may still continue)."""
    TOOL_CALLS = "tool_calls"
    """The model finished and its output parsed into one or more OpenAI ``tool_calls``."""


class CallRecord(BaseModel):
    """One sampled completion of an episode, exactly as the engine saw and produced it.

    Attributes are token-level and aligned: ``len(logprobs) == len(completion_ids)``.
    """

    index: int = Field(ge=0)
    """Position of this call in the episode (0-based, call order; each of ``n`` choices is its own call)."""
    agent: str = "default"
    """Agent name for multi-agent episodes (from the request's ``user`` field or ``model`` alias)."""
    trainable: bool = True
    """Whether this agent's completions are trained (others are context only, loss mask 0)."""
    prompt_ids: list[int]
    """Prompt token ids the engine consumed, shape (P,), after token splicing."""
    completion_ids: list[int]
    """Sampled completion token ids, shape (C,), including a generated end-of-turn token if any."""
    logprobs: list[float]
    """Sampler log-probabilities (natural log, temperature 1, before top-p) of ``completion_ids``, shape (C,)."""
    finish_reason: FinishReason
    text: str = ""
    """Decoded completion text as returned to the client (stop strings removed)."""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    """OpenAI-format tool calls parsed from the completion (empty if none)."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Sampling parameters actually used (temperature, top_p, max_tokens, stop, seed, …)."""
    splices: int = 0
    """Assistant spans of the prompt whose ids were reused from earlier completions (drift repairs)."""
    splice_mismatches: int = 0
    """Assistant messages that repeated an earlier completion but rendered to different text (not spliced)."""
    policy_version: int = 0
    """Trainer step whose weights sampled this completion."""
    created_at: float = 0.0
    """Unix time (s) when the request arrived."""
    queue_s: float = 0.0
    """Seconds spent waiting for the engine."""
    generate_s: float = 0.0
    """Seconds the engine spent on the batch that produced this completion."""
    teacher_logprobs: list[float] | None = None
    """On-policy distillation (``swarm serve --teacher``): the teacher's log p(completion_ids[t] |
    prompt_ids + completion_ids[:t]) in nats, shape (C,) like :attr:`logprobs`; ``None`` until the
    teacher scored this call (written into the pooled record by `swarm.pool.Pool.set_teacher_logprobs`)."""


class Sample(BaseModel):
    """One training sequence: a maximal chain of calls merged by exact token prefix.

    All per-token lists have the same length T. ``loss_mask[t] == 1`` means token ``input_ids[t]`` is a
    target whose log-probability given ``input_ids[:t]`` is trained; ``behaviour_logprobs[t]`` is the
    engine's logprob of that token (0.0 where the mask is 0).
    """

    episode_id: str
    index: int = Field(ge=0)
    """Sample number within the episode (chain order: by the first call index on the chain)."""
    input_ids: list[int]
    """Token ids, shape (T,)."""
    loss_mask: list[int]
    """1 on completion tokens of trainable calls trained by this sample, else 0; shape (T,)."""
    behaviour_logprobs: list[float]
    """Engine logprobs aligned to ``input_ids``, 0.0 outside the loss mask; shape (T,)."""
    call_ids: list[int]
    """Call index that introduced each token (prompt delta or completion); shape (T,)."""
    calls: list[int]
    """Call indices on this chain, in order."""
    agent: str = "default"
    """Agent of the chain's last call."""
    weight: float = 1.0
    """Loss weight of this sample (see :class:`LossWeighting`); an episode's weights sum to 1 by default."""
    teacher_logprobs: list[float | None] | None = None
    """On-policy distillation: the teacher's logprob of each token, aligned to ``input_ids`` (shape (T,)),
    from its calls' :attr:`CallRecord.teacher_logprobs` on the tokens this sample trains, ``None``
    elsewhere (prompts, context, calls not scored); ``None`` when no call of the chain was scored."""
