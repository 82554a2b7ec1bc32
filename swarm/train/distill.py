"""On-policy distillation: the teacher's logprobs on the student's own sampled tokens as per-token
advantages (pure functions; the server scores with `swarm.server.teacher_scoring`).

The student π_θ samples ``y ~ π_θ(· | x)`` (the engine records ``log π_θ(y_t | x, y_<t)``, the
behaviour logprob μ_t); a teacher π_T scores the same tokens. The per-token reverse KL, estimated on the
sampled token with the k1 estimator (Schulman 2020, "Approximating KL divergence"; unbiased for
KL(π_θ ‖ π_T) = E_{y~π_θ}[log π_θ(y) − log π_T(y)]), is::

    k1_t = log μ_t − log π_T(y_t | x, y_<t)

Minimising the reverse KL with the policy gradient uses its negative as a per-token reward
(Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes",
GKD with on-policy data and reverse KL; Thinking Machines Lab 2025, "On-Policy Distillation", and
tinker-cookbook's ``incorporate_kl_penalty``: advantage −coef · reverse KL per token, no discounting)::

    A^KL_t = log π_T(y_t | ·) − log μ_t                       (nats; > 0 where the teacher likes y_t more)

    pure:   A_t = A^KL_t
    mixed:  A_t = Â_task + coef · A^KL_t                       (Â_task: the sample's GRPO advantage)

``A_t`` then enters the same PPO-clip loss as any advantage (`swarm.train.losses.ppo_clip_loss`), token by
token. Pure mode ignores ``coef`` (the learning rate scales it); mixed mode's ``coef`` is live-patchable
(``PATCH /api/v1/config {"distill_coef": …}``). μ is the recorded sampling logprob (temperature 1, no
top-p), so the advantage is fixed for the step, like GRPO's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from swarm.tracking.records import Sample

__all__ = ["DistillMode", "distill_statistics", "reverse_kl_advantages", "token_advantages"]

DistillMode = Literal["pure", "mixed"]


def reverse_kl_advantages(sample: Sample) -> list[float]:
    """``A^KL_t = teacher_logprob_t − behaviour_logprob_t`` on the sample's trained tokens, 0.0 elsewhere;
    shape (T,), nats.

    Raises:
        ValueError: the sample has a trained token without a teacher logprob (it was not scored: such a
            sample must be kept out of the batch, never trained with a made-up value).
    """
    teacher = sample.teacher_logprobs
    out = [0.0] * len(sample.input_ids)
    for t, trained in enumerate(sample.loss_mask):
        if not trained:
            continue
        if teacher is None or teacher[t] is None:
            raise ValueError(
                f"episode {sample.episode_id!r} sample {sample.index}: trained token {t} has no teacher logprob"
            )
        out[t] = float(teacher[t]) - sample.behaviour_logprobs[t]  # type: ignore[arg-type]
    return out


def token_advantages(sample: Sample, task_advantage: float, mode: DistillMode, coef: float) -> list[float]:
    """The per-token advantages of ``sample`` (shape (T,), 0.0 outside the loss mask): pure
    ``A^KL_t``, or mixed ``task_advantage + coef · A^KL_t`` (module docstring).

    Raises:
        ValueError: see :func:`reverse_kl_advantages`.
    """
    kl = reverse_kl_advantages(sample)
    if mode == "pure":
        return kl
    return [task_advantage + coef * a if m else 0.0 for a, m in zip(kl, sample.loss_mask, strict=True)]


def distill_statistics(samples: Sequence[Sample]) -> dict[str, float]:
    """Teacher KL of a batch's trained tokens: ``teacher_kl`` (mean k1 = behaviour − teacher logprob
    over every trained token, nats) and ``teacher_kl/<agent>`` per agent; ``tokens``: how many.

    Samples without teacher logprobs are skipped (callers pass scored samples)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for s in samples:
        if s.teacher_logprobs is None:
            continue
        for t, trained in enumerate(s.loss_mask):
            teacher = s.teacher_logprobs[t]
            if trained and teacher is not None:
                k1 = s.behaviour_logprobs[t] - teacher
                for key in ("teacher_kl", f"teacher_kl/{s.agent}"):
                    sums[key] = sums.get(key, 0.0) + k1
                    counts[key] = counts.get(key, 0) + 1
    out = {key: sums[key] / counts[key] for key in sums}
    out["tokens"] = float(counts.get("teacher_kl", 0))
    return out
