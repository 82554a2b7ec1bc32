"""The engine interface: token ids in, token ids and logprobs out.

An engine never sees chat messages or text prompts; the tracker renders prompts to ids and the engine
samples completions for them. Stop strings are the one place an engine decodes text.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from swarm.tracking.records import FinishReason

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase


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
    adapter: str | None = None
    """The LoRA adapter to sample with (a tenant's, `Engine.serve_adapter`); ``None``: the served policy
    (on a server with tenants, the frozen base)."""


@dataclass
class Completion:
    """One sampled completion."""

    ids: list[int]
    """Completion token ids, shape (C,), including a generated stop token."""
    logprobs: list[float]
    """log π(ids[t] | prefix) from fp32 raw logits (temperature 1, before top-p), shape (C,); see
    `Engine` for the convention every engine follows."""
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
    """Everything the server and the trainer use from an inference engine (``hf``, ``vllm``).

    The server renders prompts with :attr:`tokenizer`, checks them with :meth:`check_prompt` and samples
    them with :meth:`generate`; the colocated trainer updates :meth:`trainable_module` and hands the new
    weights back with :meth:`load_weights`. One training step, as `swarm.server.training` runs it::

        with engine.pause():                 # generation waits for the new weights
            engine.release_memory()
            try:
                trainer.step(...)           # updates trainable_module() (or the trainer's copy of it)
            finally:
                engine.restore_memory()
            engine.load_weights(trainer.sampling_model, step)

    Logprob convention (every engine and the trainer): ``Completion.logprobs[t]`` is
    ``log_softmax(logits)[id]`` of the sampled id, from float32 logits at temperature 1, before top-p
    (whatever temperature and top-p the token was *sampled* with); the trainer recomputes it the same way.
    Why raw and not tempered: docs/ARCHITECTURE.md §Recorded-logprob convention.
    """

    @property
    def model_name(self) -> str:
        """Served model name (the OpenAI ``model`` field)."""
        ...

    @property
    def max_context(self) -> int:
        """Context window in tokens (prompt + completion)."""
        ...

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer: the tracker renders prompts with it (engines never see messages)."""
        ...

    @property
    def stop_ids(self) -> frozenset[int]:
        """End-of-turn token ids (a completion ends after sampling one)."""
        ...

    @property
    def policy_version(self) -> int:
        """Trainer step of the weights being sampled; only :meth:`load_weights` changes it."""
        ...

    def check_prompt(self, prompt_ids: list[int]) -> None:
        """Check that a prompt leaves room for at least one completion token.

        Raises:
            RequestError: the prompt is empty or does not fit the context window (400, a
                `swarm.errors.ContextLengthError`).
        """
        ...

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_token: TokenCallback | None = None
    ) -> list[Completion]:
        """Sample ``params.n`` completions for one prompt (concurrent calls are batched).

        ``on_token`` sees each token as soon as it is sampled (a streaming response forwards them).
        Cancelling the task that awaits this call aborts the request: the engine stops its rows.
        """
        ...

    async def score(self, token_ids: list[int], start: int) -> list[float]:
        """Prompt logprobs under the served weights: ``log π(token_ids[i] | token_ids[:i])`` for ``i`` in
        ``[start, len(token_ids))``, natural log, float32 ``log_softmax`` of the raw logits (the recording
        convention above: temperature 1, no top-p); ``POST /v1/score`` answers with it (a distilling
        server's teacher).

        Raises:
            RequestError: ``start < 1``, ``start > len(token_ids)``, a token id outside the vocabulary or a
                sequence longer than the context window (400).
        """
        ...

    # -- training hooks (colocated trainer) ---------------------------------------------------------------
    def trainable_module(self) -> nn.Module:
        """The transformers module the trainer updates; call it once, before the first step.

        ``hf``: the served module itself (the trainer and the sampler share its weights).
        """
        ...

    def pause(self) -> AbstractContextManager[None]:
        """Hold generation while the context is entered (a request waits; none is lost). Re-entrant."""
        ...

    def release_memory(self) -> None:
        """Before a step, under :meth:`pause`: free what sampling holds that the step needs (``hf``:
        nothing)."""
        ...

    def restore_memory(self) -> None:
        """After a step (also a failed one), under :meth:`pause`: undo :meth:`release_memory`."""
        ...

    def load_weights(self, module: nn.Module, policy_version: int) -> None:
        """Serve ``module``'s weights from now on, as policy version ``policy_version``.

        Args:
            module: the trainer's sampling module (`TorchTrainer.sampling_model`): a plain transformers
                module, or a peft model when LoRA adapters are not merged for sampling.
            policy_version: the trainer step those weights come from (0: the initial weights).

        ``hf``: the weights are shared, so this swaps in ``module`` and sets the version (under
        :meth:`pause`). Completions sampled afterwards carry the new version.
        """
        ...

    # -- LoRA tenants (`swarm.server.tenants`) -----------------------------------------------------------
    @property
    def samples_while_training(self) -> bool:
        """Whether requests of other tenants may be sampled while a tenant's step trains (``hf``: no, the
        trainer updates the served module; ``vllm`` with tenants: yes, the trainer has its own copy)."""
        ...

    def serve_adapter(self, name: str, module: nn.Module, policy_version: int) -> None:
        """Sample requests naming adapter ``name`` (`SamplingParams.adapter`) with adapter ``name`` of the
        peft model ``module`` as ``policy_version`` (after a tenant's step). ``hf``: shared weights, the
        version is recorded; ``vllm``: the adapter is written and hot-loaded."""
        ...

    def training_alongside(self) -> AbstractContextManager[None]:
        """Entered by the thread of a tenant's step while the engine keeps sampling
        (:attr:`samples_while_training`): ``hf`` on a CPU gives its sampler half the torch threads for
        the step's duration (the step keeps all of them); ``vllm``: nothing."""
        ...

    def drop_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` (a retired tenant)."""
        ...

    def close(self) -> None:
        """Stop background workers and child processes; a second call does nothing."""
        ...
