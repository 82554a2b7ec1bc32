"""What the server's training loop needs from a trainer backend (torch or verl).

The loop (`swarm.server.training.TrainingLoop`, docs/ARCHITECTURE.md §The training step) uses nothing
else: :class:`~swarm.train.TorchTrainer` (one process, one device) and
:class:`~swarm.train.verl_backend.VerlTrainer` (verl's FSDP actor in a Ray worker group) both implement it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from swarm.errors import SwarmError
from swarm.tracking.records import Sample
from swarm.train.config import TrainerConfig
from swarm.train.metrics import StepMetrics

__all__ = ["Advantage", "StepInterrupted", "TrainBatch", "TrainerBackend", "TrainerClosed", "TrainerError"]

Advantage = float | Sequence[float]
"""One sample's advantage: a float for every trained token (GRPO), or one per token, shape (T,) aligned
with ``Sample.input_ids`` and read where the loss mask is 1 (on-policy distillation,
`swarm.train.distill.token_advantages`)."""


class StepInterrupted(SwarmError):
    """A step gave up before its first update because the server is stopping (:meth:`TrainerBackend.interrupt`):
    nothing was applied (weights, optimizer state and step counter are as before the call), so its
    episodes stay pooled and train after a restart. Not a `TrainerError`: the batch is not at fault."""


class TrainerError(SwarmError, ValueError):
    """A trainer call got bad input (malformed samples, misaligned advantages, an impossible config change)."""

    status_code = 400
    error_type = "trainer_error"


@dataclass(frozen=True)
class TrainBatch:
    """A batch a backend trains on, checked by :meth:`checked` (the one home of the input rules)."""

    samples: Sequence[Sample]
    """Training sequences: ``input_ids``, ``loss_mask`` and ``behaviour_logprobs`` of one length T ≥ 2,
    first token unscored, ``weight`` finite and ≥ 0."""
    advantages: Sequence[Advantage]
    """One per sample, finite (a per-token one has T values)."""
    rewards: Sequence[float] | None
    """Episode rewards, for the reward metrics only (one per episode)."""
    scored_tokens: int
    """Σ over samples of the scored (loss-mask) tokens; > 0."""
    max_updates: int | None = None
    """At most this many optimizer updates (``None``: ``ppo_epochs · minibatches``); a journal replay of a
    step that stopped at a non-finite update (`swarm.server.checkpoints`)."""

    @classmethod
    def checked(
        cls,
        samples: Sequence[Sample],
        advantages: Sequence[Advantage],
        rewards: Sequence[float] | None = None,
        max_updates: int | None = None,
    ) -> TrainBatch:
        """The batch, after checking every rule above.

        Raises:
            TrainerError: Empty batch, misaligned advantages, a malformed sample, a non-finite advantage,
                or no scored token.
        """
        if not samples:
            raise TrainerError("cannot train on an empty batch")
        if len(advantages) != len(samples):
            raise TrainerError(f"got {len(advantages)} advantages for {len(samples)} samples")
        for i, s in enumerate(samples):
            _check_sample(i, s)
            _check_advantage(i, s, advantages[i])
        scored = sum(sum(s.loss_mask[1:]) for s in samples)
        if scored == 0:
            raise TrainerError("no sample has a scored token (all loss masks are 0)")
        if max_updates is not None and max_updates < 1:
            raise TrainerError(f"max_updates must be ≥ 1, got {max_updates}")
        return cls(samples, advantages, rewards, int(scored), max_updates)


def _check_sample(i: int, s: Sample) -> None:
    T = len(s.input_ids)
    if T < 2:
        raise TrainerError(f"sample {i} (episode {s.episode_id!r}) has {T} tokens; at least 2 are needed")
    if len(s.loss_mask) != T or len(s.behaviour_logprobs) != T:
        raise TrainerError(
            f"sample {i} (episode {s.episode_id!r}): input_ids, loss_mask and behaviour_logprobs must have "
            f"the same length, got {T}, {len(s.loss_mask)}, {len(s.behaviour_logprobs)}"
        )
    if s.loss_mask[0]:
        raise TrainerError(f"sample {i} (episode {s.episode_id!r}): the first token cannot be scored")
    if s.weight < 0 or not math.isfinite(s.weight):
        raise TrainerError(f"sample {i} (episode {s.episode_id!r}) has invalid weight {s.weight}")


def _check_advantage(i: int, s: Sample, advantage: Advantage) -> None:
    values = [advantage] if isinstance(advantage, float | int) else list(advantage)
    if not isinstance(advantage, float | int) and len(values) != len(s.input_ids):
        raise TrainerError(
            f"sample {i} (episode {s.episode_id!r}): {len(values)} per-token advantages for "
            f"{len(s.input_ids)} tokens"
        )
    if not all(math.isfinite(a) for a in values):
        raise TrainerError(f"sample {i} (episode {s.episode_id!r}): advantages must be finite")


@dataclass(frozen=True)
class TrainerClosed:
    """What a trainer's :meth:`TrainerBackend.close` freed: the server's ``trainer.closed`` event."""

    message: str
    """One line: what was freed, in how long."""
    complete: bool
    """Everything was freed within the bound (``False``: the event is a warning)."""
    data: Mapping[str, float | int | bool | str | None]
    """The event's fields (the backend's own)."""


class TrainerBackend(ABC):
    """A GRPO/PPO trainer the training loop drives: :meth:`step` checks the batch once
    (:meth:`TrainBatch.checked`) and hands it to the backend's :meth:`_train`."""

    config: TrainerConfig
    """The hyper-parameters the next step uses."""

    @property
    @abstractmethod
    def live_fields(self) -> frozenset[str]:
        """Fields of :class:`TrainerConfig` that :meth:`update_config` accepts between steps (a live
        ``PATCH`` of any other is refused with 422)."""
        ...

    @property
    @abstractmethod
    def model(self) -> nn.Module:
        """The Hugging Face model that checkpoints save and load (LoRA: the peft-wrapped model)."""
        ...

    @property
    @abstractmethod
    def sampling_model(self) -> nn.Module:
        """The module the engine serves after a step (``Engine.load_weights``)."""
        ...

    @property
    @abstractmethod
    def step_count(self) -> int:
        """Policy version: completed :meth:`step` calls (restored from checkpoints)."""
        ...

    @abstractmethod
    def sync_sampling_model(self) -> None:
        """Bring :attr:`sampling_model` up to date with :attr:`model` (after loading a checkpoint)."""
        ...

    def step(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[Advantage],
        rewards: Sequence[float] | None = None,
        *,
        max_updates: int | None = None,
    ) -> StepMetrics:
        """One policy update on a batch.

        Args:
            samples: Training sequences (see :class:`swarm.tracking.records.Sample`).
            advantages: One `Advantage` per sample, aligned with ``samples``: normally its episode's GRPO
                advantage (:func:`swarm.train.losses.episode_advantages`), or one per token, shape (T,),
                read where the loss mask is 1 (on-policy distillation, `swarm.train.distill`).
            rewards: Episode rewards of the batch, for the reward metrics only (one per episode).
            max_updates: Stop after this many optimizer updates (a journal replay of a step that stopped
                at a non-finite one); ``None``: all of them.

        Returns:
            The step's metrics; the policy version (:attr:`step_count`) is incremented. A non-finite
            update after others were applied still makes a step (``updates_nonfinite`` > 0).

        Raises:
            TrainerError: A batch :meth:`TrainBatch.checked` refuses, or one the backend cannot train on
                (see its :meth:`_train`; a step with no update applied, such as a first update with a
                non-finite gradient, leaves the trainer's state as it was).
        """
        return self._train(TrainBatch.checked(samples, advantages, rewards, max_updates))

    @abstractmethod
    def _train(self, batch: TrainBatch) -> StepMetrics:
        """One policy update on a checked batch (see :meth:`step`)."""

    @abstractmethod
    def update_config(self, **changes: Any) -> TrainerConfig:
        """Apply live changes (fields of :attr:`live_fields`), effective from the next step."""
        ...

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint besides the weights (step, live config, optimizer where it has one)."""
        ...

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        ...

    def interrupt(self) -> bool:
        """Ask every step from now on, including one under way, to give up before its first update
        (`StepInterrupted`): a stopping server's, so that SIGTERM does not wait for a whole step. Safe from
        any thread; for the rest of this trainer's life.

        Returns:
            Whether this backend can (the torch trainer: at its next micro-batch; verl: no, a step in its
            Ray workers runs to its end).
        """
        return False

    def close(self) -> TrainerClosed | None:
        """Free what the trainer holds outside this process, in bounded time, before the server's process
        exits (verl: its Ray actors, and a local Ray it started); idempotent, never raises.

        Returns:
            What was freed (``None``: nothing was held, as for the torch trainer, whose model and optimizer
            go with the process).
        """
        return None
