"""The public fronts of swarm.train and swarm.batch (changing them is an interface change)."""

import swarm.batch
import swarm.train
import swarm.train.losses


def test_train_exports() -> None:
    assert sorted(swarm.train.__all__) == [
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
    assert all(hasattr(swarm.train, name) for name in swarm.train.__all__)


def test_losses_exports() -> None:
    """The GRPO/PPO formulas have one front, swarm.train.losses (no longer re-exported by swarm.train)."""
    assert {
        "agent_advantages",
        "aggregate_loss",
        "entropy_from_logits",
        "episode_advantages",
        "grpo_advantages",
        "kl_k3",
        "loss_normalizer",
        "ppo_clip_loss",
        "selective_log_softmax",
        "truncated_importance_weights",
    } <= set(swarm.train.losses.__all__)
    assert all(hasattr(swarm.train.losses, name) for name in swarm.train.losses.__all__)


def test_batch_exports() -> None:
    assert all(hasattr(swarm.batch, name) for name in swarm.batch.__all__)
    assert {"select_batch", "admit", "BatchPolicy", "ClientVotes", "FamilyQuotas"} <= set(swarm.batch.__all__)
