"""TorchTrainer on a tiny real Llama: parameters move, accumulation is exact, LoRA reference, metrics, errors."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from swarm.tracking.records import Sample
from swarm.train import (
    LoraSettings,
    LossAggregation,
    MetricsLog,
    StepInterrupted,
    TorchTrainer,
    TrainerConfig,
    TrainerError,
)

from .factories import ADVANTAGES, PAD, make_sample

ModelFactory = Callable[[], LlamaForCausalLM]


def _snapshot(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _true_logprobs(model: torch.nn.Module, sample: Sample) -> list[float]:
    """Naive reference: full forward, log_softmax, gather; aligned to ``input_ids`` (0 outside the mask)."""
    ids = torch.tensor([sample.input_ids])
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
    tok = logp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()
    return [0.0] + [lp if m else 0.0 for lp, m in zip(tok, sample.loss_mask[1:], strict=True)]


def test_full_finetune_moves_every_parameter(make_model: ModelFactory, samples: list[Sample]) -> None:
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=1e-2, micro_batch_size=2), pad_token_id=PAD)
    before = _snapshot(trainer)
    metrics = trainer.step(samples, ADVANTAGES, rewards=[1.0, 0.0, 1.0, 0.0, 1.0])
    after = _snapshot(trainer)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert unchanged == []
    assert metrics.step == trainer.step_count == 1
    assert metrics.samples == 6 and metrics.episodes == 5
    assert metrics.tokens == sum(sum(s.loss_mask) for s in samples)
    assert metrics.micro_batches == 3 and metrics.updates == 1
    assert metrics.reward_mean == pytest.approx(0.6)
    assert metrics.grad_norm > 0 and metrics.entropy > 0
    assert metrics.ratio_mean == pytest.approx(1.0)  # single update: π_θ_old == π_θ
    assert metrics.clip_frac == 0.0
    assert metrics.kl is None
    assert not trainer.model.training


def test_lora_moves_only_adapters(make_model: ModelFactory, samples: list[Sample]) -> None:
    trainer = TorchTrainer(
        make_model(), TrainerConfig(lr=1e-2, lora=LoraSettings(r=4, alpha=8)), pad_token_id=PAD
    )
    before = _snapshot(trainer)
    # lora_B starts at zero, so lora_A gets its first gradient on the second update.
    trainer.step(samples, ADVANTAGES)
    trainer.step(samples, ADVANTAGES)
    after = _snapshot(trainer)
    adapters = [n for n in before if "lora_" in n]
    assert adapters
    assert [n for n in adapters if torch.equal(before[n], after[n])] == []
    assert [n for n in before if "lora_" not in n and not torch.equal(before[n], after[n])] == []
    assert {id(p) for p in trainer.trainable_parameters} == {
        id(p) for n, p in trainer.model.named_parameters() if "lora_" in n
    }


def test_zero_learning_rate_leaves_parameters_unchanged(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=0.0), pad_token_id=PAD)
    before = _snapshot(trainer)
    metrics = trainer.step(samples, ADVANTAGES)
    after = _snapshot(trainer)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert metrics.grad_norm > 0


def _gradients(
    make_model: ModelFactory, samples: list[Sample], advantages: list[float] = ADVANTAGES, **config: Any
) -> dict[str, torch.Tensor]:
    trainer = TorchTrainer(
        make_model(), TrainerConfig(lr=0.0, max_grad_norm=None, **config), pad_token_id=PAD
    )
    captured: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in trainer.model.named_parameters()}

    def grab(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                captured[names[id(p)]] = p.grad.detach().clone()

    trainer.optimizer.register_step_pre_hook(grab)
    trainer.step(samples, advantages)
    return captured


@pytest.mark.parametrize("mode", list(LossAggregation))
def test_gradient_accumulation_matches_one_big_batch(
    make_model: ModelFactory, samples: list[Sample], mode: LossAggregation
) -> None:
    one = _gradients(make_model, samples, micro_batch_size=1, loss_agg=mode, norm_tokens=32)
    allin = _gradients(make_model, samples, micro_batch_size=len(samples), loss_agg=mode, norm_tokens=32)
    assert one.keys() == allin.keys()
    for name in one:
        assert torch.allclose(one[name], allin[name], atol=1e-5, rtol=0), name
    assert any(float(g.abs().max()) > 1e-4 for g in one.values())


def test_token_budget_micro_batches(make_model: ModelFactory, samples: list[Sample]) -> None:
    trainer = TorchTrainer(
        make_model(), TrainerConfig(micro_batch_size=8, micro_batch_tokens=24), pad_token_id=PAD
    )
    metrics = trainer.step(samples, ADVANTAGES)
    # Sorted lengths-1: 16, 13, 11, 9, 8, 6 -> greedy with b·L ≤ 24: [16], [13], [11, 9], [8, 6].
    assert metrics.micro_batches == 4


def test_recomputed_old_logprobs_equal_detached_forward(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    results = []
    for recompute in (False, True):
        trainer = TorchTrainer(
            make_model(), TrainerConfig(lr=1e-2, recompute_old_logprobs=recompute), pad_token_id=PAD
        )
        m = trainer.step(samples, ADVANTAGES)
        assert (m.time_s.old_logprobs_s > 0) is recompute
        results.append((_snapshot(trainer), m))
    (a, ma), (b, mb) = results
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)
    assert ma.logprob_drift_mean == pytest.approx(mb.logprob_drift_mean, abs=1e-5)


def test_drift_metric_compares_engine_and_trainer_logprobs(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    model = make_model()
    exact = [s.model_copy(update={"behaviour_logprobs": _true_logprobs(model, s)}) for s in samples]
    shifted = [
        s.model_copy(
            update={
                "behaviour_logprobs": [
                    lp - 0.5 if m else 0.0 for lp, m in zip(s.behaviour_logprobs, s.loss_mask, strict=True)
                ]
            }
        )
        for s in exact
    ]
    m0 = TorchTrainer(copy.deepcopy(model), TrainerConfig(lr=0.0), pad_token_id=PAD).step(exact, ADVANTAGES)
    assert m0.logprob_drift_max < 1e-4
    m1 = TorchTrainer(copy.deepcopy(model), TrainerConfig(lr=0.0, ppo_epochs=2), pad_token_id=PAD).step(
        shifted, ADVANTAGES
    )
    assert m1.logprob_drift_mean == pytest.approx(0.5, abs=1e-4)
    assert m1.logprob_drift_max == pytest.approx(0.5, abs=1e-4)


def test_several_updates_per_step_clip(make_model: ModelFactory, samples: list[Sample]) -> None:
    trainer = TorchTrainer(
        make_model(),
        TrainerConfig(lr=5e-2, ppo_epochs=3, minibatches=2, clip_eps_high=0.01, clip_eps_low=0.01),
        pad_token_id=PAD,
    )
    m = trainer.step(samples, ADVANTAGES)
    assert m.updates == 6 and m.micro_batches == 6 * 1  # micro_batch_size 4 >= 3 samples per minibatch
    assert m.time_s.old_logprobs_s > 0
    assert 0.0 < m.clip_frac < 1.0
    assert m.ratio_mean != pytest.approx(1.0)


def test_lora_reference_is_base_with_adapters_disabled(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    base = make_model()
    untouched = copy.deepcopy(base)
    trainer = TorchTrainer(
        base, TrainerConfig(lr=5e-2, kl_coef=0.5, lora=LoraSettings(r=4)), pad_token_id=PAD
    )
    first = trainer.step(samples, ADVANTAGES)
    assert first.kl == pytest.approx(0.0, abs=1e-7)  # adapters start as the identity (lora_B = 0)
    trainer.step(samples, ADVANTAGES)
    third = trainer.step(samples, ADVANTAGES)
    assert third.kl is not None and third.kl > 1e-6
    ref = trainer.reference_logprobs(samples[:2])
    for s, ref_lp in zip(samples[:2], ref, strict=True):
        naive = torch.tensor(
            [lp for lp, m in zip(_true_logprobs(untouched, s), s.loss_mask, strict=True) if m]
        )
        assert torch.allclose(ref_lp, naive, atol=1e-5)
    # the policy itself moved away from the base
    policy = trainer.model
    assert not torch.allclose(
        torch.tensor(_true_logprobs(policy, samples[0])),
        torch.tensor(_true_logprobs(untouched, samples[0])),
        atol=1e-4,
    )


def test_full_finetune_reference_is_frozen_copy(make_model: ModelFactory, samples: list[Sample]) -> None:
    base = make_model()
    untouched = copy.deepcopy(base)
    trainer = TorchTrainer(base, TrainerConfig(lr=1e-2, kl_coef=0.1), pad_token_id=PAD)
    assert trainer.step(samples, ADVANTAGES).kl == pytest.approx(0.0, abs=1e-7)
    assert (trainer.step(samples, ADVANTAGES).kl or 0.0) > 0
    (ref_lp,) = trainer.reference_logprobs(samples[:1])
    naive = [
        lp for lp, m in zip(_true_logprobs(untouched, samples[0]), samples[0].loss_mask, strict=True) if m
    ]
    assert torch.allclose(ref_lp, torch.tensor(naive), atol=1e-5)


def test_update_config_live_and_rejections(make_model: ModelFactory, samples: list[Sample]) -> None:
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=1e-3), pad_token_id=PAD)
    trainer.update_config(lr=3e-4, clip_eps_high=0.28)
    assert trainer.optimizer.param_groups[0]["lr"] == 3e-4
    assert trainer.step(samples, ADVANTAGES).lr == 3e-4
    with pytest.raises(TrainerError, match="lora"):
        trainer.update_config(lora=LoraSettings())
    with pytest.raises(TrainerError, match="reference"):
        trainer.update_config(kl_coef=0.1)
    with pytest.raises(TrainerError, match="invalid"):
        trainer.update_config(lr=-1.0)
    assert trainer.config.lr == 3e-4


def test_state_dict_roundtrip(make_model: ModelFactory, samples: list[Sample]) -> None:
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=1e-2), pad_token_id=PAD)
    trainer.step(samples, ADVANTAGES)
    state = copy.deepcopy(trainer.state_dict())  # the live optimizer tensors are not copied
    other = TorchTrainer(copy.deepcopy(trainer.model), TrainerConfig(lr=0.5), pad_token_id=PAD)
    other.load_state_dict(state)
    assert other.step_count == 1 and other.config.lr == 1e-2
    trainer.step(samples, ADVANTAGES)
    other.step(samples, ADVANTAGES)
    a, b = _snapshot(trainer), _snapshot(other)
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)


def test_bad_batches_raise_trainer_error(make_model: ModelFactory, samples: list[Sample]) -> None:
    trainer = TorchTrainer(make_model(), TrainerConfig(), pad_token_id=PAD)
    with pytest.raises(TrainerError, match="empty"):
        trainer.step([], [])
    with pytest.raises(TrainerError, match="advantages"):
        trainer.step(samples, ADVANTAGES[:-1])
    with pytest.raises(TrainerError, match="finite"):
        trainer.step(samples, [float("nan")] * len(samples))
    first_scored = samples[0].model_copy(update={"loss_mask": [1, *samples[0].loss_mask[1:]]})
    with pytest.raises(TrainerError, match="first token"):
        trainer.step([first_scored], [1.0])
    unscored = samples[0].model_copy(update={"loss_mask": [0] * len(samples[0].input_ids)})
    with pytest.raises(TrainerError, match="no sample has a scored token"):
        trainer.step([unscored], [1.0])
    ragged = samples[0].model_copy(update={"loss_mask": samples[0].loss_mask[:-1]})
    with pytest.raises(TrainerError, match="same length"):
        trainer.step([ragged], [1.0])
    assert trainer.step_count == 0


def test_metrics_jsonl_log(make_model: ModelFactory, samples: list[Sample], tmp_path: object) -> None:
    from pathlib import Path

    log = MetricsLog(Path(str(tmp_path)) / "run" / "metrics.jsonl")
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=1e-3), pad_token_id=PAD)
    written = [trainer.step(samples, ADVANTAGES) for _ in range(2)]
    for m in written:
        log.append(m)
    with log.path.open("a") as f:
        f.write('{"step": 3, "tor')  # a torn line from a crash mid-write
    assert log.read() == written


def test_variable_padding_does_not_change_logprobs(make_model: ModelFactory) -> None:
    # A short sample batched with a long one (right padding) gets the same drift as alone.
    model = make_model()
    short = make_sample("a", 6, 2, seed=10)
    long = make_sample("b", 30, 5, seed=11)
    short = short.model_copy(update={"behaviour_logprobs": _true_logprobs(model, short)})
    long = long.model_copy(update={"behaviour_logprobs": _true_logprobs(model, long)})
    m = TorchTrainer(model, TrainerConfig(lr=0.0, micro_batch_size=2), pad_token_id=PAD).step(
        [short, long], [1.0, -1.0]
    )
    assert m.micro_batches == 1
    assert m.logprob_drift_max < 1e-4


def test_sample_without_scored_tokens_in_its_own_micro_batch(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    # A context-only sample (e.g. a non-trainable agent's chain) trains nothing but must not break the step.
    context_only = samples[0].model_copy(
        update={"loss_mask": [0] * len(samples[0].input_ids), "episode_id": "ctx"}
    )
    with_ctx = _gradients(make_model, [*samples, context_only], [*ADVANTAGES, 1.0], micro_batch_size=1)
    without = _gradients(make_model, samples, micro_batch_size=1)
    for name in without:
        assert torch.allclose(with_ctx[name], without[name], atol=1e-6), name


def test_non_finite_gradient_skips_the_update(make_model: ModelFactory, samples: list[Sample]) -> None:
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=1e-2), pad_token_id=PAD)
    before = _snapshot(trainer)
    with pytest.raises(TrainerError, match="non-finite gradient"):
        trainer.step(samples, [1e38] * len(samples))
    after = _snapshot(trainer)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert trainer.step_count == 0 and not trainer.model.training
    assert all(p.grad is None for p in trainer.trainable_parameters)


def test_an_interrupted_step_gives_up_at_a_micro_batch_with_nothing_applied(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    """A stopping server's interrupt (from another thread, here from inside the second micro-batch's
    forward): the step raises StepInterrupted at the next micro-batch boundary, before its update;
    weights, AdamW state, step counter and gradients are as before."""
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=1e-2, micro_batch_size=2), pad_token_id=PAD)
    trainer.step(samples, ADVANTAGES)  # AdamW has state to keep
    before, moments = _snapshot(trainer), copy.deepcopy(trainer.optimizer.state_dict())
    forwards = [0]

    def count(*_: Any) -> None:
        forwards[0] += 1
        if forwards[0] == 2:
            assert trainer.interrupt() is True

    hook = trainer.model.get_decoder().register_forward_hook(count)  # once per micro-batch
    with pytest.raises(StepInterrupted, match="step 2 given up before its first update"):
        trainer.step(samples, ADVANTAGES)
    hook.remove()
    assert forwards[0] == 2  # the third micro-batch never ran
    after = _snapshot(trainer)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert trainer.step_count == 1 and all(p.grad is None for p in trainer.trainable_parameters)
    state = trainer.optimizer.state_dict()["state"]
    assert all(torch.equal(state[k]["exp_avg"], moments["state"][k]["exp_avg"]) for k in state)
    with pytest.raises(StepInterrupted):  # for the rest of the trainer's life (the server is stopping)
        trainer.step(samples, ADVANTAGES)


def test_an_interrupt_after_the_first_update_lets_the_step_finish(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    """With two minibatches, an interrupt that comes after the first update has been applied does not
    stop the step half-way: it makes both updates and counts."""
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=1e-2, minibatches=2), pad_token_id=PAD)
    update = trainer.optimizer.step

    def step_then_interrupt(*args: Any, **kwargs: Any) -> Any:
        done = update(*args, **kwargs)
        trainer.interrupt()
        return done

    trainer.optimizer.step = step_then_interrupt  # type: ignore[method-assign]
    metrics = trainer.step(samples, ADVANTAGES)
    assert metrics.updates == 2 and trainer.step_count == 1


def test_split_episode_with_episode_weights_gives_the_merged_gradient(make_model: ModelFactory) -> None:
    # One episode as one merged sample vs the same trained tokens split over two samples (a branch that
    # repeats the context), weighted n_s / N_e (LossWeighting.EPISODE): the default aggregation
    # (seq_mean_token_mean) must give the same gradient, i.e. the episode counts once.
    merged = make_sample("ep", 20, 4, seed=7)
    first = merged.model_copy(
        update={
            "input_ids": merged.input_ids[:12],
            "loss_mask": merged.loss_mask[:12],
            "behaviour_logprobs": merged.behaviour_logprobs[:12],
            "call_ids": merged.call_ids[:12],
            "weight": 8 / 16,
        }
    )
    second = merged.model_copy(
        update={"loss_mask": [0] * 12 + merged.loss_mask[12:], "weight": 8 / 16, "index": 1}
    )
    other = make_sample("other", 10, 3, seed=8)
    g_merged = _gradients(make_model, [merged, other], [1.0, -1.0])
    g_split = _gradients(make_model, [first, second, other], [1.0, 1.0, -1.0])
    for name in g_merged:
        assert torch.allclose(g_merged[name], g_split[name], atol=1e-6), name


@pytest.mark.parametrize("merge", [True, False])
def test_lora_sampling_model_matches_the_trained_adapters(
    make_model: ModelFactory, samples: list[Sample], merge: bool
) -> None:
    lora = LoraSettings(r=4, alpha=8, merge_for_sampling=merge)
    trainer = TorchTrainer(make_model(), TrainerConfig(lr=5e-2, lora=lora), pad_token_id=PAD)
    sampler = trainer.sampling_model
    assert (sampler is trainer.model) is not merge
    ids = torch.tensor([samples[0].input_ids])
    with torch.no_grad():
        before = sampler(input_ids=ids).logits
    for _ in range(3):  # lora_B starts at zero: the adapters change the outputs from the second update on
        trainer.step(samples, ADVANTAGES)
    with torch.no_grad():
        trained = trainer.model(input_ids=ids).logits
        served = trainer.sampling_model(input_ids=ids).logits
    assert not torch.allclose(before, served, atol=1e-4)
    torch.testing.assert_close(served, trained, atol=2e-5, rtol=1e-5)
    if merge:  # the copy is never optimised: its weights are written only by sync_sampling_model
        sampler_params = {id(p) for p in sampler.parameters()}
        assert not sampler_params & {id(p) for p in trainer.trainable_parameters}


def test_truncated_importance_sampling_reweights_the_policy_loss(
    make_model: ModelFactory, samples: list[Sample]
) -> None:
    # The factory's behaviour logprobs (-4.5) are far from the tiny model's own: weights differ from 1.
    plain = TorchTrainer(make_model(), TrainerConfig(lr=0.0), pad_token_id=PAD)
    tis = TorchTrainer(make_model(), TrainerConfig(lr=0.0, tis_cap=2.0), pad_token_id=PAD)
    m_plain = plain.step(samples, ADVANTAGES)
    m_tis = tis.step(samples, ADVANTAGES)
    assert m_plain.tis_weight_mean is None
    assert m_tis.tis_weight_mean is not None and 0.0 < m_tis.tis_weight_mean <= 2.0
    assert m_tis.tis_weight_mean != pytest.approx(1.0)
    assert m_tis.policy_loss != pytest.approx(m_plain.policy_loss)
    # With behaviour logprobs equal to the trainer's own, every weight is 1 and the loss is unchanged.
    exact = [s.model_copy(update={"behaviour_logprobs": _true_logprobs(plain.model, s)}) for s in samples]
    again = TorchTrainer(make_model(), TrainerConfig(lr=0.0, tis_cap=2.0), pad_token_id=PAD)
    m_exact = again.step(exact, ADVANTAGES)
    assert m_exact.tis_weight_mean == pytest.approx(1.0, abs=1e-4)
    assert m_exact.policy_loss == pytest.approx(m_plain.policy_loss, abs=1e-5)
