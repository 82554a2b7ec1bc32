"""Training: GRPO/PPO losses and the embedded torch trainer backend.

Where a step sits in the server: docs/ARCHITECTURE.md §The training step.

Typical use by the server, after :func:`swarm.batch.select_batch` returned a batch::

    adv = episode_advantages(batch.groups, batch.rewards, normalize_std=True)
    metrics = trainer.step(samples, [adv[s.episode_id] for s in samples], rewards=list(batch.rewards.values()))
    MetricsLog(run_dir / "metrics.jsonl").append(metrics)
"""

from swarm.train.backend import TrainerBackend
from swarm.train.config import LIVE_FIELDS, LoraSettings, TrainerConfig, VerlSettings
from swarm.train.losses import (
    LossAggregation,
    aggregate_loss,
    entropy_from_logits,
    episode_advantages,
    grpo_advantages,
    kl_k3,
    loss_normalizer,
    ppo_clip_loss,
    selective_log_softmax,
    truncated_importance_weights,
)
from swarm.train.metrics import MetricsLog, StepMetrics, StepTimings
from swarm.train.trainer import TorchTrainer, TrainerError

__all__ = [
    "LIVE_FIELDS",
    "LoraSettings",
    "LossAggregation",
    "MetricsLog",
    "StepMetrics",
    "StepTimings",
    "TorchTrainer",
    "TrainerBackend",
    "TrainerConfig",
    "TrainerError",
    "VerlSettings",
    "aggregate_loss",
    "entropy_from_logits",
    "episode_advantages",
    "grpo_advantages",
    "kl_k3",
    "loss_normalizer",
    "ppo_clip_loss",
    "selective_log_softmax",
    "truncated_importance_weights",
]
