"""GRPO / PPO loss pieces as small pure torch functions.

Notation (shapes in names): ``G`` episodes in a group, ``N`` scored tokens, ``B`` sequences, ``T`` positions,
``V`` vocabulary. ``logprobs`` are natural-log probabilities of the sampled tokens under the current policy
π_θ, ``old_logprobs`` under π_θ_old (the weights that start the step), ``ref_logprobs`` under the reference
policy π_ref. The token-level GRPO objective (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. 3) is

    J(θ) = E[ 1/G Σ_i 1/|o_i| Σ_t ( min(r_it Â_i, clip(r_it, 1-ε, 1+ε) Â_i) - β D_KL[π_θ || π_ref] ) ],
    r_it = π_θ(o_it | q, o_i,<t) / π_θ_old(o_it | q, o_i,<t),

which this module splits into :func:`grpo_advantages` (Â), :func:`ppo_clip_loss` (the min/clip term),
:func:`kl_k3` (the D_KL estimator), :func:`entropy_from_logits` (an optional bonus) and
:func:`aggregate_loss` (the 1/G Σ 1/|o_i| Σ_t reduction, or the DAPO and Dr. GRPO alternatives).
A batch's advantages come from :func:`episode_advantages` (one per episode) and
:func:`agent_advantages` (one per agent of a multi-agent episode that reported per-agent rewards);
:func:`batch_statistics` describes them in a step's metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from swarm.train.config import LossAggregation

__all__ = [
    "LossAggregation",
    "agent_advantages",
    "aggregate_loss",
    "batch_statistics",
    "entropy_from_logits",
    "episode_advantages",
    "grpo_advantages",
    "kl_k3",
    "loss_normalizer",
    "ppo_clip_loss",
    "selective_log_softmax",
    "truncated_importance_weights",
]


def grpo_advantages(
    rewards_G: torch.Tensor, *, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages of one group of episodes.

    ``Â_i = (R_i - mean(R)) / (std(R) + eps)`` (Shao et al. 2024, DeepSeekMath, §4.1.2 "outcome supervision"),
    or, with ``normalize_std=False``, ``Â_i = R_i - mean(R)`` as recommended by Dr. GRPO (Liu et al. 2025,
    "Understanding R1-Zero-Like Training", arXiv:2503.20783, §3.1: the std division up-weights groups that are
    nearly all right or all wrong). ``std`` is the population standard deviation (``unbiased=False``);
    verl 0.9's ``compute_grpo_outcome_advantage`` divides by the Bessel-corrected one, √(G/(G−1)) larger
    (checked in tests/train/test_verl_parity.py), and gives a group of one its raw reward.

    Edge cases: a group of one episode, or a group whose rewards are all equal (zero variance), has no
    learning signal and gets all-zero advantages (never NaN).

    Args:
        rewards_G: Rewards of the group's episodes, shape (G,), float.
        normalize_std: Divide by the group standard deviation.
        eps: Added to the std to avoid division by ~0.

    Returns:
        Advantages, shape (G,), same dtype as ``rewards_G``.

    Raises:
        ValueError: ``rewards_G`` is not 1-D, is empty or holds a non-finite reward.
    """
    if rewards_G.ndim != 1 or rewards_G.numel() == 0:
        raise ValueError(f"rewards_G must have shape (G,) with G >= 1, got {tuple(rewards_G.shape)}")
    if not torch.isfinite(rewards_G).all():
        raise ValueError(f"rewards must be finite, got {rewards_G.tolist()}")
    rewards_G = rewards_G.to(torch.promote_types(rewards_G.dtype, torch.float32))
    centered_G = rewards_G - rewards_G.mean()
    if bool((centered_G == 0).all()):
        return torch.zeros_like(rewards_G)
    if not normalize_std:
        return centered_G
    return centered_G / (rewards_G.std(unbiased=False) + eps)


def episode_advantages(
    groups: Mapping[str, Sequence[str]],
    rewards: Mapping[str, float],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> dict[str, float]:
    """GRPO advantage of every episode of a batch, group by group (:func:`grpo_advantages` per group).

    Args:
        groups: task_id → episode ids of the group (e.g. ``swarm.batch.Batch.groups``).
        rewards: episode_id → reward (e.g. ``swarm.batch.Batch.rewards``).
        normalize_std: See :func:`grpo_advantages`.
        eps: See :func:`grpo_advantages`.

    Returns:
        episode_id → advantage.

    Raises:
        ValueError: An episode of a group has no reward, or appears in two groups.
    """
    out: dict[str, float] = {}
    for task_id, episode_ids in groups.items():
        missing = [e for e in episode_ids if e not in rewards]
        if missing:
            raise ValueError(f"group {task_id!r}: no reward for episodes {missing}")
        twice = [e for e in episode_ids if e in out]
        if twice:
            raise ValueError(f"group {task_id!r}: episodes {twice} already belong to another group")
        if not episode_ids:
            continue
        rewards_G = torch.tensor([rewards[e] for e in episode_ids], dtype=torch.float64)
        adv_G = grpo_advantages(rewards_G, normalize_std=normalize_std, eps=eps)
        out.update(zip(episode_ids, adv_G.tolist(), strict=True))
    return out


def agent_advantages(
    groups: Mapping[str, Sequence[str]],
    rewards: Mapping[str, float],
    agent_rewards: Mapping[str, Mapping[str, float]],
    *,
    normalize_std: bool = True,
) -> dict[tuple[str, str], float]:
    """GRPO advantages per agent for multi-agent episodes that report per-agent rewards.

    For each group (task) and each agent named in any of its episodes' ``agent_rewards``, the agent's
    rewards across the G episodes form its own group: ``A_{i,a} = (r_{i,a} − mean_j r_{j,a}) / std_j r_{j,a}``
    (Shao et al. 2024, eq. of §4.1.2, applied per agent), where an episode that did not report agent
    ``a`` falls back to its scalar reward. Agents without per-agent rewards use the episode advantage.

    Args:
        groups: task_id → episode ids (``Batch.groups``).
        rewards: episode_id → scalar reward (``Batch.rewards``).
        agent_rewards: episode_id → {agent: reward} for episodes that reported them.
        normalize_std: divide by the group std (GRPO) or not (Dr. GRPO).

    Returns:
        (episode_id, agent) → advantage, for every agent named in ``agent_rewards`` of the group.
    """
    out: dict[tuple[str, str], float] = {}
    for episode_ids in groups.values():
        agents = sorted({a for e in episode_ids for a in agent_rewards.get(e, {})})
        for agent in agents:
            rewards_G = torch.tensor(
                [agent_rewards.get(e, {}).get(agent, rewards[e]) for e in episode_ids], dtype=torch.float64
            )
            adv_G = grpo_advantages(rewards_G, normalize_std=normalize_std)
            out.update({(e, agent): float(a) for e, a in zip(episode_ids, adv_G.tolist(), strict=True)})
    return out


def batch_statistics(advantages: Sequence[float], rewards: Sequence[float] | None) -> dict[str, Any]:
    """The :class:`~swarm.train.metrics.StepMetrics` fields that describe a batch rather than the update: reward mean and
    population std (``None`` without rewards) and advantage mean, population std, min and max.

    Args:
        advantages: One per sample (non-empty).
        rewards: One per episode, or ``None``.
    """
    adv_t = torch.tensor(list(advantages), dtype=torch.float64)
    rew_t = torch.tensor(list(rewards), dtype=torch.float64) if rewards else None
    return {
        "reward_mean": None if rew_t is None else float(rew_t.mean()),
        "reward_std": None if rew_t is None else float(rew_t.std(unbiased=False)),
        "adv_mean": float(adv_t.mean()),
        "adv_std": float(adv_t.std(unbiased=False)),
        "adv_min": float(adv_t.min()),
        "adv_max": float(adv_t.max()),
    }


def selective_log_softmax(
    logits_NV: torch.Tensor, ids_N: torch.Tensor, chunk_size: int = 1024
) -> torch.Tensor:
    """Log-probability of the chosen ids: ``log_softmax(logits)[..., ids]`` without a second (…, V) tensor.

    Naive equivalent: ``torch.gather(logits.log_softmax(-1), -1, ids.unsqueeze(-1)).squeeze(-1)``, which
    materialises a full log-softmax copy of the logits. Here ``logit[id] - logsumexp(logits)`` is computed in
    chunks of rows, so the extra memory is one ``(chunk_size, V)`` buffer (the same idea as TRL's
    ``trl.trainer.utils.selective_log_softmax``). Differentiable.

    Args:
        logits_NV: Logits, shape (..., V), float32/float64 (bf16 loses precision in ``logsumexp``; upcast first).
        ids_N: Token ids, shape (...), int64, values in [0, V).
        chunk_size: Rows per ``logsumexp`` chunk.

    Returns:
        Log-probabilities, shape (...), dtype of ``logits_NV``.

    Raises:
        ValueError: Shapes disagree.
    """
    if logits_NV.shape[:-1] != ids_N.shape:
        raise ValueError(f"logits {tuple(logits_NV.shape)} and ids {tuple(ids_N.shape)} disagree")
    flat_logits = logits_NV.reshape(-1, logits_NV.shape[-1])
    flat_ids = ids_N.reshape(-1, 1)
    chosen = flat_logits.gather(-1, flat_ids).squeeze(-1)
    lse = (
        torch.cat([torch.logsumexp(c, dim=-1) for c in flat_logits.split(chunk_size)])
        if len(flat_logits)
        else chosen
    )
    return (chosen - lse).reshape(ids_N.shape)


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss of PPO (Schulman et al. 2017, arXiv:1707.06347, eq. 7), negated.

    ``loss_t = -min(r_t Â_t, clip(r_t, 1-ε_low, 1+ε_high) Â_t)`` with ``r_t = exp(logprobs - old_logprobs)``.
    Separate ``ε_low``/``ε_high`` is DAPO's "clip-higher" (Yu et al. 2025, arXiv:2503.14476, eq. 10; they use
    ε_low=0.2, ε_high=0.28). A token is *clipped* when the clipped branch is the minimum and therefore carries
    no gradient: ``r > 1+ε_high`` with ``Â > 0`` or ``r < 1-ε_low`` with ``Â < 0``. Exactly at a boundary the
    token is not clipped (its gradient is still ``Â``).

    Args:
        logprobs: Current-policy log-probs, any shape S, with gradient.
        old_logprobs: Old-policy log-probs, shape S, no gradient needed (detached here).
        advantages: Advantages broadcastable to S (e.g. one per token, or (B, 1) per sequence).
        eps_low: Lower clip range ε_low ≥ 0.
        eps_high: Upper clip range ε_high ≥ 0.

    Returns:
        ``(loss_tok, clipped_mask)``: per-token loss (shape S) and a bool tensor of clipped tokens (shape S).
    """
    ratio = torch.exp(logprobs - old_logprobs.detach())
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    loss_tok = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        clipped_mask = ((ratio > 1.0 + eps_high) & (advantages > 0)) | (
            (ratio < 1.0 - eps_low) & (advantages < 0)
        )
    return loss_tok, clipped_mask


def truncated_importance_weights(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token truncated importance weights ``min(π_θ_old / μ, C)`` (no gradient).

    ``μ`` is the policy that actually sampled the tokens (the engine's recorded logprobs), ``π_θ_old`` the
    trainer's policy at step start. They differ when the sampler computes differently from the trainer
    (bf16 kernels, another engine) or when episodes are stale; weighting each token's PPO loss by the
    ratio, truncated at ``C``, corrects that mismatch with bounded variance — truncated importance sampling
    as in IMPALA (Espeholt et al. 2018, arXiv:1802.01561, eq. 1, ``ρ̄``) and TIS for RL of LLMs (Yao et al.
    2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training").

    Args:
        old_logprobs: π_θ_old log-probs, any shape S.
        behaviour_logprobs: μ log-probs, shape S.
        cap: ``C > 0``.

    Returns:
        Weights, shape S, in ``(0, C]``, detached.
    """
    return torch.exp(old_logprobs.detach() - behaviour_logprobs.detach()).clamp(max=cap)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ || π_ref) (Schulman 2020, "Approximating KL Divergence", as in GRPO eq. 4).

    ``k3 = exp(ref - lp) - (ref - lp) - 1`` with ``lp = logprobs``. Unbiased for tokens sampled from π_θ, always
    ≥ 0 (since ``e^x ≥ 1 + x``), and exactly 0 where the two log-probs are equal.

    Args:
        logprobs: Current-policy log-probs, any shape S.
        ref_logprobs: Reference log-probs, shape S (no gradient).

    Returns:
        Per-token KL estimate, shape S.
    """
    log_ratio = ref_logprobs.detach() - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy of the categorical distribution given by ``logits`` over the last axis.

    ``H = logsumexp(z) - Σ_v softmax(z)_v z_v`` (equal to ``-Σ p log p``), computed in row chunks so only a
    ``(chunk_size, V)`` temporary is alive at once. Differentiable.

    Args:
        logits: Logits, shape (..., V), float32/float64.
        chunk_size: Rows per chunk.

    Returns:
        Entropies in nats, shape (...).
    """
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [
        torch.logsumexp(c, dim=-1) - (torch.softmax(c, dim=-1) * c).sum(-1) for c in flat.split(chunk_size)
    ]
    out = torch.cat(parts) if parts else flat.new_zeros(0)
    return out.reshape(logits.shape[:-1])


def aggregate_loss(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    weights_B: torch.Tensor | None,
    mode: LossAggregation,
    *,
    norm_tokens: int | None = None,
    normalizer: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to a scalar (see :class:`LossAggregation` for the formulas).

    For gradient accumulation, pass the normaliser of the *whole* optimizer batch (from
    :func:`loss_normalizer`) so that the per-micro-batch losses sum exactly to the full-batch loss; without it
    the normaliser of this batch is used.

    Args:
        loss_BT: Per-token losses, shape (B, T).
        mask_BT: Loss mask, shape (B, T), 1/True on scored tokens.
        weights_B: Per-sequence weights w_i ≥ 0, shape (B,), or ``None`` for all ones.
        mode: Aggregation mode.
        norm_tokens: L, required by ``seq_mean_token_sum_norm``.
        normalizer: Precomputed denominator (overrides the per-batch one).

    Returns:
        Scalar loss. A batch with no scored tokens (or zero total weight) gives a differentiable 0.

    Raises:
        ValueError: ``norm_tokens`` missing for ``seq_mean_token_sum_norm`` or shapes disagree.
    """
    if loss_BT.shape != mask_BT.shape or loss_BT.ndim != 2:
        raise ValueError(f"loss {tuple(loss_BT.shape)} and mask {tuple(mask_BT.shape)} must both be (B, T)")
    mask = mask_BT.to(loss_BT.dtype)
    w_B = (
        torch.ones(loss_BT.shape[0], dtype=loss_BT.dtype, device=loss_BT.device)
        if weights_B is None
        else weights_B
    )
    w_B = w_B.to(loss_BT.dtype)
    per_seq_sum_B = (loss_BT * mask).sum(-1)
    if mode is LossAggregation.SEQ_MEAN_TOKEN_MEAN:
        per_seq_B = per_seq_sum_B / mask.sum(-1).clamp(min=1.0)
    else:
        per_seq_B = per_seq_sum_B
    numerator = (w_B * per_seq_B).sum()
    if normalizer is None:
        normalizer = loss_normalizer(mask, w_B, mode, norm_tokens=norm_tokens)
    denom = torch.as_tensor(normalizer, dtype=loss_BT.dtype, device=loss_BT.device)
    if float(denom) <= 0.0:
        return numerator * 0.0
    return numerator / denom


def loss_normalizer(
    mask_BT: torch.Tensor,
    weights_B: torch.Tensor | None,
    mode: LossAggregation,
    *,
    norm_tokens: int | None = None,
) -> float:
    """Denominator of :func:`aggregate_loss` for a batch: weighted tokens, weighted sequences, or L·weighted seqs.

    Sequences without scored tokens do not count in the sequence modes.

    Args:
        mask_BT: Loss mask, shape (B, T).
        weights_B: Per-sequence weights, shape (B,), or ``None``.
        mode: Aggregation mode.
        norm_tokens: L for ``seq_mean_token_sum_norm``.

    Returns:
        The denominator (0.0 for an empty batch).
    """
    mask = mask_BT.to(torch.float64)
    w_B = (
        torch.ones(mask.shape[0], dtype=torch.float64)
        if weights_B is None
        else weights_B.to(torch.float64).cpu()
    )
    tokens_B = mask.sum(-1).cpu()
    if mode is LossAggregation.TOKEN_MEAN:
        return float((w_B * tokens_B).sum())
    seqs = float((w_B * (tokens_B > 0)).sum())
    if mode is LossAggregation.SEQ_MEAN_TOKEN_MEAN:
        return seqs
    if norm_tokens is None or norm_tokens <= 0:
        raise ValueError("seq_mean_token_sum_norm needs norm_tokens (the generation budget L) > 0")
    return seqs * norm_tokens
