"""Loss pieces against hand-computed values and their naive forms."""

from __future__ import annotations

import math

import pytest
import torch

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


def test_grpo_advantages_std_normalised() -> None:
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), normalize_std=True, eps=0.0)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]))


def test_grpo_advantages_without_std_is_centered_reward() -> None:
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 2.0]), normalize_std=False)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0]))
    assert abs(float(adv.sum())) < 1e-7


@pytest.mark.parametrize("rewards", [[0.7, 0.7, 0.7], [0.0], [1.0, 1.0]])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_advantages_zero_variance_group_gives_zeros(rewards: list[float], normalize_std: bool) -> None:
    adv = grpo_advantages(torch.tensor(rewards), normalize_std=normalize_std)
    assert torch.equal(adv, torch.zeros(len(rewards)))


def test_grpo_advantages_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="finite"):
        grpo_advantages(torch.tensor([1.0, math.nan]))
    with pytest.raises(ValueError, match="shape"):
        grpo_advantages(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="shape"):
        grpo_advantages(torch.zeros(0))


def test_episode_advantages_per_group() -> None:
    adv = episode_advantages(
        {"t1": ["a", "b"], "t2": ["c", "d", "e"]},
        {"a": 1.0, "b": 0.0, "c": 0.5, "d": 0.5, "e": 0.5},
        normalize_std=False,
    )
    assert adv == pytest.approx({"a": 0.5, "b": -0.5, "c": 0.0, "d": 0.0, "e": 0.0})
    with pytest.raises(ValueError, match="no reward"):
        episode_advantages({"t": ["a", "z"]}, {"a": 1.0})


@pytest.mark.parametrize("shape", [(7, 50), (3, 5, 50)])
def test_selective_log_softmax_matches_naive(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(shape, generator=g) * 4).requires_grad_(True)
    ids = torch.randint(0, shape[-1], shape[:-1], generator=g)
    ours = selective_log_softmax(logits, ids, chunk_size=2)
    (grad_ours,) = torch.autograd.grad(ours.sum(), logits)
    naive = torch.gather(logits.log_softmax(-1), -1, ids.unsqueeze(-1)).squeeze(-1)
    (grad_naive,) = torch.autograd.grad(naive.sum(), logits)
    assert torch.allclose(ours, naive, atol=1e-6)
    assert torch.allclose(grad_ours, grad_naive, atol=1e-6)


def test_entropy_matches_naive() -> None:
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(1)) * 3
    p = logits.softmax(-1)
    naive = -(p * p.log()).sum(-1)
    assert torch.allclose(entropy_from_logits(logits, chunk_size=4), naive, atol=1e-5)
    assert torch.allclose(entropy_from_logits(torch.zeros(2, 8)), torch.full((2,), math.log(8)))


def _grad_wrt_logprob(
    ratio: float, adv: float, eps_low: float = 0.2, eps_high: float = 0.28
) -> tuple[float, bool]:
    lp = torch.tensor(math.log(ratio), dtype=torch.float64, requires_grad=True)
    loss, clipped = ppo_clip_loss(
        lp, torch.tensor(0.0, dtype=torch.float64), torch.tensor(adv), eps_low, eps_high
    )
    (grad,) = torch.autograd.grad(loss, lp)
    return float(grad), bool(clipped)


def test_ppo_clip_value_is_negated_surrogate() -> None:
    lp = torch.log(torch.tensor([0.5, 1.0, 1.5, 0.5, 1.5]))
    adv = torch.tensor([1.0, 2.0, 1.0, -1.0, -1.0])
    loss, clipped = ppo_clip_loss(lp, torch.zeros(5), adv, 0.2, 0.2)
    # -min(r A, clip(r) A): r=0.5,A=1 -> 0.5; r=1 -> 2; r=1.5,A=1 -> clip 1.2; r=0.5,A=-1 -> clip -0.8 vs -0.5 -> -0.8;
    # r=1.5,A=-1 -> -1.5
    assert torch.allclose(loss, torch.tensor([-0.5, -2.0, -1.2, 0.8, 1.5]), atol=1e-6)
    assert clipped.tolist() == [False, False, True, True, False]


@pytest.mark.parametrize(
    ("ratio", "adv", "clipped"),
    [
        (1.28 + 1e-6, 1.0, True),  # above 1+ε_high with A>0: no gradient
        (1.28 - 1e-6, 1.0, False),
        (0.8 - 1e-6, -1.0, True),  # below 1-ε_low with A<0: no gradient
        (0.8 + 1e-6, -1.0, False),
        (0.5, 1.0, False),  # low ratio, positive advantage: still pushed up
        (2.0, -1.0, False),  # high ratio, negative advantage: still pushed down (unbounded side)
    ],
)
def test_ppo_clip_gradient_at_boundaries(ratio: float, adv: float, clipped: bool) -> None:
    grad, is_clipped = _grad_wrt_logprob(ratio, adv)
    assert is_clipped is clipped
    if clipped:
        assert grad == 0.0
    else:
        # d/dlp of -(r A) = -r A
        assert grad == pytest.approx(-ratio * adv, rel=1e-6)


def test_ppo_clip_exactly_at_boundary_is_not_clipped() -> None:
    grad, is_clipped = _grad_wrt_logprob(1.28, 1.0)
    assert not is_clipped
    assert grad != 0.0


def test_kl_k3_nonnegative_zero_at_equality_and_unbiased() -> None:
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(1000, generator=g)
    ref = torch.randn(1000, generator=g)
    assert (kl_k3(lp, ref) >= 0).all()
    assert torch.equal(kl_k3(lp, lp), torch.zeros(1000))
    # Monte Carlo: E_{x~p}[k3] = KL(p||q)
    p_logits = torch.randn(20, generator=g)
    q_logits = torch.randn(20, generator=g)
    logp, logq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    exact = float((logp.exp() * (logp - logq)).sum())
    x = torch.multinomial(logp.exp(), 200_000, replacement=True, generator=g)
    estimate = float(kl_k3(logp[x], logq[x]).mean())
    assert estimate == pytest.approx(exact, rel=0.03)


def test_aggregate_loss_modes_by_hand() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert float(aggregate_loss(loss, mask, None, LossAggregation.TOKEN_MEAN)) == pytest.approx(10 / 4)
    assert float(aggregate_loss(loss, mask, None, LossAggregation.SEQ_MEAN_TOKEN_MEAN)) == pytest.approx(
        (2 + 4) / 2
    )
    dr = aggregate_loss(loss, mask, None, LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM, norm_tokens=5)
    assert float(dr) == pytest.approx((6 + 4) / (2 * 5))
    with pytest.raises(ValueError, match="norm_tokens"):
        aggregate_loss(loss, mask, None, LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM)


def test_split_episode_counts_once_with_weights() -> None:
    # Episode A has one sample with mean loss 2; episode B was split into two samples (weights 1/2 each)
    # with mean losses 1 and 5: B counts as one sequence with loss 3.
    loss = torch.tensor([[2.0, 2.0], [1.0, 1.0], [5.0, 5.0]])
    mask = torch.ones(3, 2)
    w = torch.tensor([1.0, 0.5, 0.5])
    assert float(aggregate_loss(loss, mask, w, LossAggregation.SEQ_MEAN_TOKEN_MEAN)) == pytest.approx(
        (2 + 3) / 2
    )
    assert float(aggregate_loss(loss, mask, w, LossAggregation.TOKEN_MEAN)) == pytest.approx((4 + 1 + 5) / 4)


@pytest.mark.parametrize("mode", list(LossAggregation))
def test_aggregate_loss_splits_exactly_with_global_normalizer(mode: LossAggregation) -> None:
    g = torch.Generator().manual_seed(3)
    loss = torch.randn(6, 9, generator=g)
    mask = torch.rand(6, 9, generator=g) > 0.4
    w = torch.rand(6, generator=g)
    full = aggregate_loss(loss, mask, w, mode, norm_tokens=16)
    norm = loss_normalizer(mask, w, mode, norm_tokens=16)
    parts = sum(
        aggregate_loss(loss[i : i + 2], mask[i : i + 2], w[i : i + 2], mode, norm_tokens=16, normalizer=norm)
        for i in range(0, 6, 2)
    )
    assert float(parts) == pytest.approx(float(full), abs=1e-6)


def test_aggregate_loss_empty_mask_is_zero_and_differentiable() -> None:
    loss = torch.ones(2, 3, requires_grad=True)
    out = aggregate_loss(loss, torch.zeros(2, 3), None, LossAggregation.TOKEN_MEAN)
    (grad,) = torch.autograd.grad(out, loss)
    assert float(out.detach()) == 0.0
    assert torch.equal(grad, torch.zeros(2, 3))


def test_truncated_importance_weights_are_the_capped_ratio() -> None:
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    behaviour = torch.tensor([-1.0, -1.0, -2.0, -3.5])
    w = truncated_importance_weights(old, behaviour, cap=2.0)
    expected = torch.tensor([1.0, math.exp(-1.0), 2.0, math.exp(0.5)])  # exp(1.5) ≈ 4.48 is capped at 2
    torch.testing.assert_close(w, expected)
    assert not w.requires_grad
