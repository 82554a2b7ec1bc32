"""A non-finite gradient inside a multi-update step (issue 35): the step keeps the updates applied before
it and counts; a first update that is non-finite applies nothing. On the tiny real Llama, CPU, with the
non-finite gradient made honestly through the public API: advantages of 1e38 (finite, so the batch is
accepted) overflow the loss's gradient."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import LlamaForCausalLM

from swarm.tracking.records import Sample
from swarm.train import TorchTrainer, TrainerConfig, TrainerError

from .factories import ADVANTAGES, PAD

ModelFactory = Callable[[], LlamaForCausalLM]
HUGE = 1e38
"""A finite advantage whose loss gradient is not (the trainer accepts the batch; the update overflows)."""


def _trainer(make_model: ModelFactory, **config: int) -> TorchTrainer:
    cfg = TrainerConfig(lr=1e-2, recompute_old_logprobs=True, **config)
    return TorchTrainer(make_model(), cfg, pad_token_id=PAD)


def _weights(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in trainer.model.state_dict().items()}


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert [n for n in a if not torch.equal(a[n], b[n])] == []  # bit for bit


def test_a_later_non_finite_update_keeps_the_first_and_counts_as_a_step(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    # minibatches=2 splits rows 0,2,4 | 1,3,5: the second minibatch (the second update) overflows
    advantages = [a if i % 2 == 0 else HUGE for i, a in enumerate(ADVANTAGES)]
    trainer = _trainer(make_model, minibatches=2)
    metrics = trainer.step(samples, advantages, rewards=[1.0, 0.0, 1.0, 0.0, 1.0])
    assert trainer.step_count == metrics.step == 1
    assert metrics.updates == 1 and metrics.updates_nonfinite == 1
    assert metrics.grad_norm > 0 and metrics.grad_norm == metrics.grad_norm_max  # the applied update's
    assert all(p.grad is None for p in trainer.trainable_parameters) and not trainer.model.training

    # the same weights as a step made of the first minibatch alone
    first = [0, 2, 4]
    alone = _trainer(make_model, minibatches=1)
    alone.step([samples[i] for i in first], [ADVANTAGES[i] for i in first])
    _assert_equal(_weights(trainer), _weights(alone))
    # ... and the optimizer state too: the next (finite) step moves both alike
    trainer.step(samples, ADVANTAGES)
    alone.config = trainer.config
    alone.step(samples, ADVANTAGES)
    _assert_equal(_weights(trainer), _weights(alone))


def test_ppo_epochs_stop_at_the_non_finite_update_and_a_replay_caps_there(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    # ppo_epochs=2, one minibatch of one micro-batch: a hook on the real module makes the second
    # backward (the second update's) non-finite
    trainer = _trainer(make_model, ppo_epochs=2, micro_batch_size=8)
    param = trainer.trainable_parameters[0]
    calls = [0]

    def poison(grad: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return grad * float("nan") if calls[0] == 2 else grad

    handle = param.register_hook(poison)
    metrics = trainer.step(samples, ADVANTAGES)
    handle.remove()
    assert (metrics.step, metrics.updates, metrics.updates_nonfinite) == (1, 1, 1)

    # a replay of the journaled step (max_updates=1, no hook) reaches the same weights
    replay = _trainer(make_model, ppo_epochs=2, micro_batch_size=8)
    again = replay.step(samples, ADVANTAGES, max_updates=1)
    assert (again.step, again.updates, again.updates_nonfinite) == (1, 1, 0)
    _assert_equal(_weights(trainer), _weights(replay))


def test_a_first_update_non_finite_is_rejected_with_nothing_applied(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    advantages = [HUGE if i % 2 == 0 else a for i, a in enumerate(ADVANTAGES)]  # the first minibatch
    trainer = _trainer(make_model, minibatches=2)
    before = _weights(trainer)
    with pytest.raises(TrainerError, match="first update of step 1; nothing was applied"):
        trainer.step(samples, advantages)
    _assert_equal(_weights(trainer), before)
    assert trainer.step_count == 0 and trainer.optimizer.state_dict()["state"] == {}
    assert all(p.grad is None for p in trainer.trainable_parameters) and not trainer.model.training


def test_max_updates_must_be_positive(make_model: ModelFactory, samples: list[Sample]) -> None:
    with pytest.raises(TrainerError, match="max_updates must be ≥ 1"):
        _trainer(make_model).step(samples, ADVANTAGES, max_updates=0)
