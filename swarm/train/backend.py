"""What the server's training loop needs from a trainer backend (torch or verl).

The loop (`swarm.server.training.TrainingLoop`, docs/ARCHITECTURE.md §The training step) uses nothing
else: :class:`~swarm.train.TorchTrainer` (one process, one device) and
:class:`~swarm.train.verl_backend.VerlTrainer` (verl's FSDP actor in a Ray worker group) both implement it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from torch import nn

from swarm.tracking.records import Sample
from swarm.train.config import TrainerConfig
from swarm.train.metrics import StepMetrics

__all__ = ["Advantage", "TrainerBackend"]

Advantage = float | Sequence[float]
"""One sample's advantage: a float for every trained token (GRPO), or one per token, shape (T,) aligned
with ``Sample.input_ids`` and read where the loss mask is 1 (on-policy distillation,
`swarm.train.distill.token_advantages`)."""


class TrainerBackend(Protocol):
    """A GRPO/PPO trainer the training loop drives."""

    config: TrainerConfig
    """The hyper-parameters the next step uses."""

    @property
    def live_fields(self) -> frozenset[str]:
        """Fields of :class:`TrainerConfig` that :meth:`update_config` accepts between steps (a live
        ``PATCH`` of any other is refused with 422)."""
        ...

    @property
    def model(self) -> nn.Module:
        """The Hugging Face model that checkpoints save and load (LoRA: the peft-wrapped model)."""
        ...

    @property
    def sampling_model(self) -> nn.Module:
        """The module the engine serves after a step (``Engine.load_weights``)."""
        ...

    @property
    def step_count(self) -> int:
        """Policy version: completed :meth:`step` calls (restored from checkpoints)."""
        ...

    def sync_sampling_model(self) -> None:
        """Bring :attr:`sampling_model` up to date with :attr:`model` (after loading a checkpoint)."""
        ...

    def step(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[Advantage],
        rewards: Sequence[float] | None = None,
    ) -> StepMetrics:
        """One policy update on a batch (an `Advantage` per sample); raises ``TrainerError`` for a batch it
        cannot train on."""
        ...

    def update_config(self, **changes: Any) -> TrainerConfig:
        """Apply live changes (fields of :attr:`live_fields`), effective from the next step."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint besides the weights (step, live config, optimizer where it has one)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        ...
