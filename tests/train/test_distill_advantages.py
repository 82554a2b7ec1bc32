"""On-policy distillation on the trainer's side: the reverse-KL advantage formulas
(`swarm.train.distill`) and per-token advantages in `TorchTrainer.step`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from swarm.tracking.records import Sample
from swarm.train import TorchTrainer, TrainerConfig, TrainerError
from swarm.train.distill import distill_statistics, reverse_kl_advantages, token_advantages

from .factories import ADVANTAGES, PAD

ModelFactory = Callable[[], LlamaForCausalLM]


def scored(sample: Sample, teacher: Callable[[int], float], agent: str = "default") -> Sample:
    """``sample`` with a teacher logprob on every trained token (``None`` elsewhere)."""
    values = [teacher(t) if m else None for t, m in enumerate(sample.loss_mask)]
    return sample.model_copy(update={"teacher_logprobs": values, "agent": agent})


def test_reverse_kl_advantage_is_teacher_minus_behaviour_logprob(samples: list[Sample]) -> None:
    s = scored(samples[0], lambda t: -1.0 - 0.1 * t)
    kl = reverse_kl_advantages(s)
    for t, m in enumerate(s.loss_mask):
        assert kl[t] == (pytest.approx(-1.0 - 0.1 * t - s.behaviour_logprobs[t]) if m else 0.0)
    assert token_advantages(s, 0.7, "pure", 3.0) == kl  # pure: the coefficient is not used
    mixed = token_advantages(s, 0.7, "mixed", 0.5)
    assert mixed == [pytest.approx(0.7 + 0.5 * a) if m else 0.0 for a, m in zip(kl, s.loss_mask, strict=True)]
    hole = s.model_copy(update={"teacher_logprobs": [None] * len(s.input_ids)})
    with pytest.raises(ValueError, match="no teacher logprob"):
        reverse_kl_advantages(hole)
    with pytest.raises(ValueError, match="no teacher logprob"):
        reverse_kl_advantages(samples[1])  # never scored


def test_teacher_kl_statistics_per_agent(samples: list[Sample]) -> None:
    a = scored(samples[0], lambda t: -4.0, agent="solver")  # behaviour -4.5: k1 = -0.5 per token
    b = scored(samples[1], lambda t: -5.5, agent="critic")  # k1 = +1.0 per token
    stats = distill_statistics([a, b, samples[2]])  # the unscored one is skipped
    n_a, n_b = sum(a.loss_mask), sum(b.loss_mask)
    assert stats["teacher_kl/solver"] == pytest.approx(-0.5) and stats["teacher_kl/critic"] == pytest.approx(
        1.0
    )
    assert stats["teacher_kl"] == pytest.approx((-0.5 * n_a + 1.0 * n_b) / (n_a + n_b))
    assert stats["tokens"] == n_a + n_b


def _params_after_step(
    make_model: ModelFactory, samples: list[Sample], advantages: list
) -> dict[str, torch.Tensor]:
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=1e-2, micro_batch_size=2), pad_token_id=PAD)
    metrics = trainer.step(samples, advantages)
    assert math.isfinite(metrics.loss)
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def test_per_token_advantages_broadcast_like_a_scalar_and_ignore_untrained_tokens(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    scalar = _params_after_step(make_model, samples, ADVANTAGES)
    # the same value on every token, and garbage where the loss mask is 0 (never read)
    per_token = [[a if m else 1e6 for m in s.loss_mask] for s, a in zip(samples, ADVANTAGES, strict=True)]
    tokens = _params_after_step(make_model, samples, per_token)
    for name in scalar:
        assert torch.allclose(scalar[name], tokens[name], atol=1e-6), name
    mixed: list[Any] = [*per_token[:3], *ADVANTAGES[3:]]
    both = _params_after_step(make_model, samples, mixed)
    for name in scalar:
        assert torch.allclose(scalar[name], both[name], atol=1e-6), name
    varied = [
        [a * (t % 3) for t in range(len(s.input_ids))] for s, a in zip(samples, ADVANTAGES, strict=True)
    ]
    moved = _params_after_step(make_model, samples, varied)
    assert any(not torch.allclose(scalar[n], moved[n], atol=1e-6) for n in scalar)


def test_per_token_advantages_are_checked(make_model: ModelFactory, samples: list[Sample]) -> None:
    trainer = TorchTrainer(make_model(), TrainerConfig(), pad_token_id=PAD)
    s = samples[0]
    with pytest.raises(TrainerError, match="per-token advantages"):
        trainer.step([s], [[0.1] * (len(s.input_ids) - 1)])
    with pytest.raises(TrainerError, match="finite"):
        trainer.step([s], [[float("inf")] * len(s.input_ids)])
    assert trainer.step_count == 0
    metrics = trainer.step([s], [[0.25 if m else 9.0 for m in s.loss_mask]])
    assert metrics.adv_mean == pytest.approx(0.25) and metrics.adv_max == pytest.approx(0.25)
