"""Training: the trainer backends (embedded torch, verl), their config and step metrics.

The GRPO/PPO formulas (advantages, clipped loss, KL) live in :mod:`swarm.train.losses` and are
imported from there. Where a step sits in the server: docs/ARCHITECTURE.md §The training step.

Typical use by the server, after :func:`swarm.batch.select_batch` returned a batch::

    from swarm.train.losses import episode_advantages

    adv = episode_advantages(batch.groups, batch.rewards, normalize_std=True)
    metrics = trainer.step(samples, [adv[s.episode_id] for s in samples], rewards=list(batch.rewards.values()))
    MetricsLog(run_dir / "metrics.jsonl").append(metrics)

The torch-free vocabulary (:mod:`swarm.train.config`, :mod:`swarm.train.metrics`) is imported at once;
the torch-backed names load on first use, so the wire protocol, which re-exports ``LossAggregation``
and ``StepMetrics``, does not pull torch into the client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from swarm.train.config import LIVE_FIELDS, LoraSettings, LossAggregation, TrainerConfig, VerlSettings
from swarm.train.metrics import MetricsLog, StepMetrics, StepTimings

if TYPE_CHECKING:
    from swarm.train.backend import StepInterrupted, TrainerBackend
    from swarm.train.trainer import TorchTrainer, TrainerError

__all__ = [
    "LIVE_FIELDS",
    "LoraSettings",
    "LossAggregation",
    "MetricsLog",
    "StepInterrupted",
    "StepMetrics",
    "StepTimings",
    "TorchTrainer",
    "TrainerBackend",
    "TrainerConfig",
    "TrainerError",
    "VerlSettings",
]


_TORCH_MODULES = ("swarm.train.backend", "swarm.train.trainer")
"""Where the names of ``__all__`` that need torch are defined."""


def __getattr__(name: str) -> Any:
    """Import a torch-backed name of ``__all__`` on first use (then it is an ordinary attribute)."""
    if name in __all__:
        for module in map(importlib.import_module, _TORCH_MODULES):
            if hasattr(module, name):
                value = getattr(module, name)
                globals()[name] = value
                return value
    raise AttributeError(f"module 'swarm.train' has no attribute {name!r}")
