"""The engine interface: token ids in, token ids and logprobs out.

An engine never sees chat messages or text prompts; the tracker renders prompts to ids and the engine
samples completions for them. Stop strings are the one place an engine decodes text.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from swarm.tracking.records import FinishReason


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's completions (OpenAI semantics)."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    max_tokens: int = 256
    """Upper bound on completion tokens (clipped to the remaining context window)."""
    stop: tuple[str, ...] = ()
    """Stop strings; the returned text ends before the first one (the ids keep the tokens that made it)."""
    seed: int | None = None
    """Seed of a per-row torch.Generator (choice i uses ``seed + i``); None draws from the OS."""
    n: int = 1
    """Number of completions (choices) for the prompt."""
    top_logprobs: int = 0
    """How many most-likely alternatives to return per token (0 to 20)."""


@dataclass
class Completion:
    """One sampled completion."""

    ids: list[int]
    """Completion token ids, shape (C,), including a generated stop token."""
    logprobs: list[float]
    """log π(ids[t] | prefix) from fp32 raw logits (temperature 1, before top-p), shape (C,)."""
    finish_reason: FinishReason
    text: str = ""
    """Decoded text, ending before any stop string and without the end-of-turn token."""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per token, the ``top_logprobs`` most likely (id, logprob) pairs, shape (C, k)."""
    generate_s: float = 0.0
    """Wall seconds of the engine batch that produced this completion."""
    batch_size: int = 1
    """Rows in that batch."""
    policy_version: int = 0
    """The engine's `Engine.policy_version` when this completion was sampled (the weights' step)."""


@dataclass(frozen=True)
class SampledToken:
    """One token as it is sampled (for streaming); the `Completion` stays the record."""

    choice: int
    """Which of the request's ``n`` completions it belongs to."""
    id: int
    logprob: float
    """log π(id | prefix), as in `Completion.logprobs`."""
    top_logprobs: tuple[tuple[int, float], ...] = ()
    """The ``top_logprobs`` most likely (id, logprob) pairs at this position."""
    last: bool = False
    """The completion ends with this token (end of turn, stop string or length)."""


TokenCallback = Callable[[SampledToken], None]
"""Called from the engine's worker thread for every sampled token; must be quick and not block."""


class Engine(Protocol):
    """What the server needs from an inference engine."""

    model_name: str
    max_context: int
    lock: threading.RLock
    """Held while generating; the trainer holds it to update weights (generation pauses)."""
    policy_version: int
    """Trainer step of the weights being sampled; whoever changes the weights sets it under `lock`."""

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_token: TokenCallback | None = None
    ) -> list[Completion]:
        """Sample ``params.n`` completions for one prompt (concurrent calls are batched).

        ``on_token`` sees each token as soon as it is sampled (a streaming response forwards them).
        """
        ...

    def close(self) -> None:
        """Stop background workers."""
        ...
