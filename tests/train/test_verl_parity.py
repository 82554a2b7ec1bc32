"""verl backend on CPU: our batch in verl's layout, and our loss and advantages against verl's own functions.

Everything here runs verl 0.9.1's real code (installed ``--no-deps`` with the ``verl`` extra; see the
README's test command): ``left_right_2_no_padding`` and ``ppo_loss`` exactly as an FSDP worker calls them
in ``update_actor``, ``compute_grpo_outcome_advantage``, the Hydra config verl composes for its actor.
Only the model forward is replaced by fixed logprobs, which is what makes the comparison exact.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from swarm.protocol import LossAggregation
from swarm.tracking.records import Sample
from swarm.train import TrainerConfig, TrainerError, VerlSettings
from swarm.train.losses import aggregate_loss, grpo_advantages, kl_k3, ppo_clip_loss

from .factories import PAD, make_sample

if os.environ.get("A3R_REQUIRE_VERL") != "1":  # CI sets it, so these tests can never be skipped there
    pytest.importorskip("verl", reason="verl is an optional extra (README: the verl parity tests)")

from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig
from verl.workers.utils.losses import ppo_loss

from swarm.train.verl_backend import (
    VerlBatch,
    load_full_state_dict,
    to_verl_batch,
    verl_actor_config,
    worker_input,
)

MODES = [
    (LossAggregation.TOKEN_MEAN, 1, "token-mean"),
    (LossAggregation.SEQ_MEAN_TOKEN_MEAN, 1, "seq-mean-token-mean"),
    (LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM, 1, "seq-mean-token-sum"),
    (LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM, 64, "seq-mean-token-sum-norm"),
]


def multi_turn(episode_id: str, seed: int, weight: float = 1.0) -> Sample:
    """A merged two-call sample: prompt, completion, tool output (unscored), completion."""
    s = make_sample(episode_id, 16, 3, seed=seed, weight=weight)
    mask = [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    return s.model_copy(update={"loss_mask": mask, "behaviour_logprobs": [-2.0 if m else 0.0 for m in mask]})


@pytest.fixture
def batch_samples() -> list[Sample]:
    return [
        make_sample("a0", 12, 5, seed=0),
        make_sample("a1", 9, 3, seed=1),
        multi_turn("a2", seed=2),
        make_sample("b0", 7, 2, seed=3),
        make_sample("b1", 14, 4, seed=4),
        make_sample("b2", 10, 7, seed=5),
    ]


ADV = [1.0, -1.0, 0.5, -0.5, 0.8, -0.3]


@functools.cache  # composing verl's Hydra config takes about a second
def actor_config(mode: LossAggregation, norm_tokens: int, *, kl_coef: float = 0.0) -> ActorConfig:
    """verl's ActorConfig as our backend composes it (no model needed for the loss)."""
    trainer = TrainerConfig(
        loss_agg=mode, norm_tokens=norm_tokens, kl_coef=kl_coef, clip_eps_low=0.2, clip_eps_high=0.28
    )
    node = verl_actor_config("/nonexistent-model", trainer, VerlSettings(), mini_batch_rows=8)
    return omega_conf_to_dataclass(node.actor)  # type: ignore[no-any-return]


def current_logprobs(batch: VerlBatch, seed: int = 7) -> torch.Tensor:
    """Fixed "current policy" logprobs (B, R): behaviour ± noise, so ratios leave the clip range."""
    g = torch.Generator().manual_seed(seed)
    behaviour = batch.data.batch["rollout_log_probs"]
    return behaviour + 0.4 * torch.randn(behaviour.shape, generator=g)


def verl_loss(
    batch: VerlBatch,
    config: ActorConfig,
    logprobs_BR: torch.Tensor,
    old_BR: torch.Tensor,
    ref_BR: torch.Tensor | None = None,
) -> torch.Tensor:
    """verl's ``ppo_loss`` on the worker's no-padding input, the model output given as logprobs."""
    data = batch.data
    data.batch["old_log_probs"] = old_BR
    if ref_BR is not None:
        data.batch["ref_log_prob"] = ref_BR
    td = worker_input(data, global_batch_size=batch.global_batch_size)
    mask = data.batch["response_mask"]
    # what FSDPEngine.forward_backward_batch assigns before calling the loss (one data-parallel rank)
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(mask.sum()))
    # the model's output in the no-padding layout: position t holds the logprob of token t+1
    attention = data.batch["attention_mask"]
    P = data.batch["prompts"].shape[1]
    rows = []
    for i in range(attention.shape[0]):
        p_len = int(attention[i, :P].sum())
        r_len = int(attention[i, P:].sum())
        values = torch.zeros(p_len + r_len)
        values[p_len - 1 : p_len - 1 + r_len] = logprobs_BR[i, :r_len]
        rows.append(values)
    nested = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    loss, _ = ppo_loss(config, {"log_probs": nested}, td)
    return loss


def our_loss(
    samples: list[Sample],
    advantages: list[float],
    batch: VerlBatch,
    mode: LossAggregation,
    norm_tokens: int,
    logprobs_BR: torch.Tensor,
    old_BR: torch.Tensor,
    *,
    eps: tuple[float, float] = (0.2, 0.28),
    ref_BR: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """The torch trainer's per-token loss and aggregation (swarm.train.losses) on the sample rows."""
    n = batch.rows
    mask = batch.data.batch["response_mask"][:n].bool()
    adv = torch.tensor(advantages, dtype=torch.float32)[:, None].expand_as(mask)
    loss, _ = ppo_clip_loss(logprobs_BR[:n], old_BR[:n], adv, eps[0], eps[1])
    if ref_BR is not None:
        loss = loss + kl_coef * kl_k3(logprobs_BR[:n], ref_BR[:n])
    weights = torch.tensor([s.weight for s in samples], dtype=torch.float32)
    return aggregate_loss(loss * mask, mask, weights, mode, norm_tokens=norm_tokens)


# -- the batch ------------------------------------------------------------------------------------------


def test_batch_layout_keeps_every_token_and_pads_to_the_multiple(batch_samples: list[Sample]) -> None:
    batch = to_verl_batch(
        batch_samples, ADV, pad_token_id=PAD, loss_agg=LossAggregation.SEQ_MEAN_TOKEN_MEAN, multiple=4
    )
    t = batch.data.batch
    B, _ = t["prompts"].shape
    assert B == 8 and batch.rows == 6  # padded to a multiple of 4, nothing dropped
    for i, s in enumerate(batch_samples):
        attn = t["attention_mask"][i].bool()
        assert t["input_ids"][i][attn].tolist() == s.input_ids  # prompt + response = the sample
        first = s.loss_mask.index(1)
        R_i = len(s.input_ids) - first
        assert t["response_mask"][i, :R_i].tolist() == s.loss_mask[first:]
        assert t["response_mask"][i, R_i:].sum() == 0
        assert t["rollout_log_probs"][i, :R_i].tolist() == pytest.approx(s.behaviour_logprobs[first:])
        assert torch.equal(t["advantages"][i] != 0, t["response_mask"][i].bool())
        positions = t["position_ids"][i][attn]
        assert positions.tolist() == list(range(len(s.input_ids)))
    assert t["response_mask"][6:].sum() == 0 and t["advantages"][6:].abs().sum() == 0
    assert t["attention_mask"][6:].sum(-1).tolist() == [2, 2]  # one prompt and one response token each
    assert batch.global_batch_size == 6
    # verl's own conversion to its worker layout accepts it (nested tensors, no empty row)
    td = worker_input(batch.data, global_batch_size=6)
    assert td["input_ids"].offsets().diff().tolist() == [len(s.input_ids) for s in batch_samples] + [2, 2]


def test_bad_batches_are_refused(batch_samples: list[Sample]) -> None:
    mode = LossAggregation.TOKEN_MEAN
    with pytest.raises(TrainerError, match="empty"):
        to_verl_batch([], [], pad_token_id=PAD, loss_agg=mode)
    with pytest.raises(TrainerError, match="advantages"):
        to_verl_batch(batch_samples, ADV[:2], pad_token_id=PAD, loss_agg=mode)
    unscored = make_sample("z", 6, 6, seed=9)
    with pytest.raises(TrainerError, match="no sample has a scored token"):
        to_verl_batch([unscored], [1.0], pad_token_id=PAD, loss_agg=mode)


# -- the loss -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "norm_tokens", "verl_mode"), MODES)
def test_policy_loss_matches_verl(
    batch_samples: list[Sample], mode: LossAggregation, norm_tokens: int, verl_mode: str
) -> None:
    config = actor_config(mode, norm_tokens)
    assert config.loss_agg_mode == verl_mode
    batch = to_verl_batch(batch_samples, ADV, pad_token_id=PAD, loss_agg=mode, norm_tokens=norm_tokens)
    lp = current_logprobs(batch)
    old = batch.data.batch["rollout_log_probs"].clone()
    ours = our_loss(batch_samples, ADV, batch, mode, norm_tokens, lp, old)
    theirs = verl_loss(batch, config, lp, old)
    assert float((ours - theirs).abs()) <= 1e-6 * max(1.0, float(ours.abs()))
    assert float(ours.abs()) > 1e-3  # a loss that is not trivially zero


@pytest.mark.parametrize(("mode", "norm_tokens", "verl_mode"), MODES)
def test_sample_weights_are_folded_into_the_advantages(
    batch_samples: list[Sample], mode: LossAggregation, norm_tokens: int, verl_mode: str
) -> None:
    """Episode weighting (an episode split in two samples of weight 0.5 each) survives verl's unweighted
    aggregation: c_s = w_s · D_verl / D_ours scales each sample's advantage."""
    weighted = [
        s.model_copy(update={"weight": w}) for s, w in zip(batch_samples, [1, 1, 0.5, 0.5, 1, 2], strict=True)
    ]
    batch = to_verl_batch(weighted, ADV, pad_token_id=PAD, loss_agg=mode, norm_tokens=norm_tokens)
    lp = current_logprobs(batch, seed=3)
    old = batch.data.batch["rollout_log_probs"].clone()
    ours = our_loss(weighted, ADV, batch, mode, norm_tokens, lp, old)
    theirs = verl_loss(batch, actor_config(mode, norm_tokens), lp, old)
    assert float((ours - theirs).abs()) <= 1e-6 * max(1.0, float(ours.abs()))


@pytest.mark.parametrize(("mode", "norm_tokens", "verl_mode"), MODES)
def test_low_variance_kl_matches_our_k3(
    batch_samples: list[Sample], mode: LossAggregation, norm_tokens: int, verl_mode: str
) -> None:
    beta = 0.05
    batch = to_verl_batch(batch_samples, ADV, pad_token_id=PAD, loss_agg=mode, norm_tokens=norm_tokens)
    lp = current_logprobs(batch, seed=11)
    old = batch.data.batch["rollout_log_probs"].clone()
    g = torch.Generator().manual_seed(5)
    ref = old + 0.3 * torch.randn(old.shape, generator=g)
    ours = our_loss(batch_samples, ADV, batch, mode, norm_tokens, lp, old, ref_BR=ref, kl_coef=beta)
    without_kl = our_loss(batch_samples, ADV, batch, mode, norm_tokens, lp, old)
    theirs = verl_loss(batch, actor_config(mode, norm_tokens, kl_coef=beta), lp, old, ref)
    assert float((ours - theirs).abs()) <= 1e-6 * max(1.0, float(ours.abs()))
    assert float((ours - without_kl).abs()) > 1e-4  # the KL term is really in both


@pytest.mark.parametrize(("mode", "norm_tokens", "verl_mode"), MODES)
def test_padding_rows_change_nothing(
    batch_samples: list[Sample], mode: LossAggregation, norm_tokens: int, verl_mode: str
) -> None:
    config = actor_config(mode, norm_tokens)
    unpadded = to_verl_batch(batch_samples, ADV, pad_token_id=PAD, loss_agg=mode, norm_tokens=norm_tokens)
    lp_rows = current_logprobs(unpadded)  # (6, R): the model's logprobs on the sample rows
    losses = []
    for multiple in (1, 4, 16):
        batch = to_verl_batch(
            batch_samples, ADV, pad_token_id=PAD, loss_agg=mode, norm_tokens=norm_tokens, multiple=multiple
        )
        assert batch.data.batch["input_ids"].shape[0] == {1: 6, 4: 8, 16: 16}[multiple]
        B, R = batch.data.batch["responses"].shape
        lp = torch.zeros(B, R)
        lp[:6] = lp_rows
        lp[6:] = -3.0  # whatever the model says on a padding row
        old = batch.data.batch["rollout_log_probs"].clone()
        losses.append(float(verl_loss(batch, config, lp, old)))
    # identical up to float32 summation order (verl sums over the padded rows too)
    assert losses[1] == pytest.approx(losses[0], rel=1e-6, abs=0)
    assert losses[2] == pytest.approx(losses[0], rel=1e-6, abs=0)


# -- advantages -----------------------------------------------------------------------------------------


def verl_grpo(rewards: list[float], index: list[str], normalize_std: bool) -> torch.Tensor:
    scores = torch.tensor(rewards, dtype=torch.float32)[:, None] * torch.tensor([[0.0, 0.0, 1.0]])
    mask = torch.ones(len(rewards), 3)
    adv, _ = compute_grpo_outcome_advantage(
        scores, mask, np.array(index, dtype=object), norm_adv_by_std_in_grpo=normalize_std
    )
    return adv[:, 0]


GROUPS = {"t0": [1.0, 0.0, 0.0, 1.0, 1.0], "t1": [0.2, 0.7, 0.4], "t2": [1.0, 1.0, 1.0]}


def _flat(groups: dict[str, list[float]]) -> tuple[list[float], list[str]]:
    rewards = [r for rs in groups.values() for r in rs]
    index = [t for t, rs in groups.items() for _ in rs]
    return rewards, index


def test_dr_grpo_advantages_match_verl_exactly() -> None:
    rewards, index = _flat(GROUPS)
    ours = torch.cat([grpo_advantages(torch.tensor(rs), normalize_std=False) for rs in GROUPS.values()])
    assert torch.equal(ours, verl_grpo(rewards, index, normalize_std=False))


def test_grpo_advantages_differ_from_verl_only_by_the_std_convention() -> None:
    """verl (and TRL) divide by the Bessel-corrected group std; ours by the population std (`grpo_advantages`).
    Rescaled by (σ_pop + ε)/(σ_bessel + ε) they agree; the batch always carries ours."""
    rewards, index = _flat(GROUPS)
    theirs = verl_grpo(rewards, index, normalize_std=True)
    at = 0
    for rs in GROUPS.values():
        r = torch.tensor(rs)
        ours = grpo_advantages(r, normalize_std=True)
        scale = (r.std(unbiased=False) + 1e-6) / (r.std(unbiased=True) + 1e-6)
        assert torch.allclose(ours * scale, theirs[at : at + len(rs)], atol=1e-6, rtol=0)
        at += len(rs)


def test_singleton_groups_get_zero_advantage_in_our_batch_not_verls_raw_reward() -> None:
    """verl's GRPO gives a group of one its raw reward (mean 0, std 1); ours has no signal there and
    writes 0, so a singleton group is never trained by the verl backend."""
    theirs = verl_grpo([1.0, 0.0, 1.0], ["solo", "pair", "pair"], normalize_std=True)
    assert float(theirs[0]) == pytest.approx(1.0)
    ours = float(grpo_advantages(torch.tensor([1.0]))[0])
    assert ours == 0.0
    s = make_sample("solo", 8, 3, seed=1)
    batch = to_verl_batch([s], [ours], pad_token_id=PAD, loss_agg=LossAggregation.TOKEN_MEAN)
    assert batch.data.batch["advantages"].abs().sum() == 0


# -- configuration and the weight gather -----------------------------------------------------------------


def test_actor_config_carries_our_hyper_parameters() -> None:
    trainer = TrainerConfig(
        lr=3e-6,
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        kl_coef=0.01,
        entropy_coef=0.001,
        loss_agg=LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM,
        norm_tokens=512,
        micro_batch_size=2,
        ppo_epochs=2,
    )
    settings = VerlSettings(n_gpus_per_node=4, nnodes=2)
    node = verl_actor_config("/models/m", trainer, settings, mini_batch_rows=16)
    assert node.model.path == "/models/m"
    actor: Any = omega_conf_to_dataclass(node.actor)
    assert actor.optim.lr == 3e-6
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert actor.use_kl_loss and actor.kl_loss_coef == 0.01 and actor.kl_loss_type == "low_var_kl"
    assert actor.entropy_coeff == 0.001
    assert actor.loss_agg_mode == "seq-mean-token-sum-norm" and actor.loss_scale_factor == 512
    assert actor.ppo_micro_batch_size_per_gpu == 2 and actor.ppo_epochs == 2
    assert node.rollout.log_prob_micro_batch_size_per_gpu == 2
    assert node.actor.strategy == "fsdp2"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_actor_and_reference_compute_in_the_dtype_we_ask_for(dtype: str) -> None:
    """verl's FSDP engine takes its compute dtype from ``fsdp_config.mixed_precision.param_dtype``
    (bf16 when the dict is absent, whatever ``fsdp_config.dtype`` says): resolved here exactly as
    ``FSDPEngine._build_fsdp_module`` resolves it. On the H200 the missing dict made a float32 actor
    compute in bf16 (logprob drift 0.04/token against the float32 sampler, 5.6e-6 for the torch trainer)."""
    from verl.utils.torch_dtypes import PrecisionType

    node = verl_actor_config(
        "/models/m", TrainerConfig(kl_coef=0.01), VerlSettings(), mini_batch_rows=4, compute_dtype=dtype
    )
    actor: Any = omega_conf_to_dataclass(node.actor)
    for engine in (actor.fsdp_config, node.ref.fsdp_config):
        mp = engine.mixed_precision
        assert PrecisionType.to_dtype(mp["param_dtype"]) == getattr(torch, dtype)
        assert PrecisionType.to_dtype(mp["reduce_dtype"]) == torch.float32
        assert PrecisionType.to_dtype(mp["buffer_dtype"]) == torch.float32


def test_gathered_weights_load_into_the_served_model(make_model: Callable[[], Any]) -> None:
    """The actor's gathered state dict (Hugging Face names, as verl's FSDP engine yields them) replaces
    the served module's weights in place; a name or shape the model lacks is refused."""
    served, actor = make_model(), make_model()
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.01)
    state = {k: v.clone() for k, v in actor.state_dict().items()}
    assert load_full_state_dict(served, state) == len(state)
    for (name, a), b in zip(actor.state_dict().items(), served.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(TrainerError, match="not in the served model"):
        load_full_state_dict(served, {**state, "model.extra.weight": torch.zeros(1)})
    with pytest.raises(TrainerError, match="lack"):
        load_full_state_dict(served, {k: v for k, v in state.items() if "layers.1." not in k})
    name = "model.norm.weight"
    with pytest.raises(TrainerError, match="shape"):
        load_full_state_dict(served, {**state, name: torch.zeros(3)})


def test_sdpa_actor_pads_instead_of_packing() -> None:
    """verl packs sequences only with flash-attention (transformers' SDPA would attend across them)."""
    trainer = TrainerConfig()
    sdpa = verl_actor_config("/m", trainer, VerlSettings(), mini_batch_rows=8)
    assert sdpa.model.override_config.attn_implementation == "sdpa" and not sdpa.model.use_remove_padding
    fa2 = verl_actor_config(
        "/m", trainer, VerlSettings(attn_implementation="flash_attention_2"), mini_batch_rows=8
    )
    assert fa2.model.use_remove_padding


def test_update_metrics_are_read_from_verls_metric_objects_and_lists() -> None:
    """update_actor returns, per key, a list over mini-batches of floats (or verl ``Metric`` objects)."""
    from verl.utils.metric import AggregationType, Metric

    from swarm.train.verl_backend import _max, _mean

    kl = Metric(AggregationType.SUM, 0.1)  # summed over micro-batches
    kl.append(0.2)
    metrics = {
        "actor/pg_loss": [0.5, -0.25],
        "grad_norm": [Metric(AggregationType.MEAN, 2.0), Metric(AggregationType.MEAN, 4.0)],
        "kl_loss": kl,
        "lr": 1e-5,
    }
    assert _mean(metrics, "actor/pg_loss") == 0.125
    assert _mean(metrics, "grad_norm") == 3.0 and _max(metrics, "grad_norm") == 4.0
    assert _mean(metrics, "kl_loss") == pytest.approx(0.3)
    assert _mean(metrics, "lr") == 1e-5
    assert _mean(metrics, "missing", "actor/pg_loss") == 0.125 and _mean(metrics, "missing") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_workers_without_a_gpu_fail_in_one_line_instead_of_waiting_for_one(
    make_model: Callable[[], Any], tmp_path: Any
) -> None:
    """Without CUDA and without a Ray address the worker group is refused before Ray starts: Ray itself
    would wait forever for a GPU placement group (the CPU smoke run of bench/verl_step.py did)."""
    from swarm.train.verl_backend import VerlTrainer

    with pytest.raises(TrainerError, match="needs CUDA GPUs and this machine has none"):
        VerlTrainer(make_model(), tmp_path, TrainerConfig(), PAD, start=True)


@pytest.mark.parametrize(
    ("rows", "ranks", "minibatches", "micro_batch_size", "layout"),
    [
        (2, 1, 1, 4, (2, 2)),  # B 1 × G 2 under the default micro-batch of 4: one pass of 2, no padding
        (3, 1, 1, 4, (3, 3)),
        (9, 1, 1, 4, (3, 3)),  # three passes of 3 rather than 4 + 4 + 1
        (10, 1, 1, 4, (4, 4)),  # three passes of 4: 2 padding rows
        (32, 1, 1, 8, (8, 8)),  # bench/multi_gpu.py's batch on one GPU
        (32, 8, 1, 8, (32, 4)),  # … on eight: 4 rows a rank, no padding to 64
        (12, 2, 2, 4, (12, 3)),
    ],
)
def test_micro_batches_split_evenly_and_pad_only_the_remainder(
    rows: int, ranks: int, minibatches: int, micro_batch_size: int, layout: tuple[int, int]
) -> None:
    from swarm.train.verl_backend import micro_batch_layout

    multiple, micro = micro_batch_layout(rows, ranks, minibatches, micro_batch_size)
    assert (multiple, micro) == layout and micro <= micro_batch_size
    padded = -(-rows // multiple) * multiple
    per_pass = padded // (ranks * minibatches)
    assert per_pass % micro == 0  # verl's micro-batching divides every rank's mini-batch
    assert padded - rows < ranks * minibatches * (per_pass // micro)  # less than a row per pass padded


def test_vectorized_logprobs_equal_verls_per_token_loop() -> None:
    """The worker's replacement for verl's ``logprobs_from_logits`` without flash-attn (one ``logsumexp``
    per token) gives its values and its gradient."""
    from verl.utils.torch_functional import logprobs_from_logits_v2

    from swarm.train.verl_backend import vectorized_logprobs

    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(1500, 97, generator=g)).requires_grad_()
    labels = torch.randint(0, 97, (1500,), generator=g)
    ours = vectorized_logprobs(logits, labels)
    (grad_ours,) = torch.autograd.grad(ours.sum(), logits)
    verls = logprobs_from_logits_v2(logits, labels)
    (grad_verls,) = torch.autograd.grad(verls.sum(), logits)
    assert torch.allclose(ours, verls, atol=1e-6) and torch.allclose(grad_ours, grad_verls, atol=1e-6)


@pytest.mark.parametrize(("gpus", "reshard"), [(1, False), (2, True)])
def test_one_rank_keeps_its_gathered_parameters_between_forward_and_backward(
    gpus: int, reshard: bool
) -> None:
    """``reshard_after_forward`` is off for one rank (nothing to reshard), verl's default (on) for more."""
    node = verl_actor_config(
        "/nonexistent-model", TrainerConfig(), VerlSettings(n_gpus_per_node=gpus), mini_batch_rows=8
    )
    assert node.actor.fsdp_config.reshard_after_forward is reshard
    assert (
        node.actor.fsdp_config.use_no_sync_for_gradient_accumulation is not reshard
    )  # one reduce a mini-batch
