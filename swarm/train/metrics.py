"""A trainer step's metrics (:class:`StepMetrics`, :class:`StepTimings`) and their JSONL log.

Defined here, with the trainers that fill them; the wire protocol re-exports them (`swarm.protocol`: the
server's rows of ``GET /api/v1/metrics`` extend :class:`StepMetrics`). Torch-free, so the client can
import the protocol without torch. A run dir keeps the rows in ``metrics.jsonl`` (one JSON object per
line, appended after each step).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

__all__ = ["MetricsLog", "StepMetrics", "StepTimings"]


class StepTimings(BaseModel):
    """Wall-clock seconds spent in each phase of a step."""

    old_logprobs_s: float = 0.0
    """No-grad forward recomputing π_θ_old (0 when reused from the training forward)."""
    ref_logprobs_s: float = 0.0
    """No-grad forward of the reference policy (0 without KL)."""
    fwd_bwd_s: float = 0.0
    """Training forwards and backwards over all micro-batches."""
    optim_s: float = 0.0
    """Gradient clipping and optimizer steps (the verl trainer counts them in ``fwd_bwd_s``: its
    ``update_actor`` call does both)."""
    weight_sync_s: float = 0.0
    """Bringing the trained weights to the served model: the verl trainer's FSDP gather to rank 0 and
    copy into the server's module (0 for the torch trainer, which trains that module itself)."""
    total_s: float = 0.0
    """Whole step, including batching."""


class StepMetrics(BaseModel):
    """Metrics of one trainer step (all means are over scored tokens unless stated)."""

    step: int
    """Policy version after this step (1 after the first update)."""
    samples: int
    """Training sequences in the batch."""
    episodes: int
    """Distinct episodes in the batch."""
    tokens: int
    """Scored (loss-mask) tokens trained, per pass."""
    reward_mean: float | None = None
    """Mean episode reward (``None`` when rewards were not passed)."""
    reward_std: float | None = None
    """Population std of episode rewards."""
    adv_mean: float
    """Mean advantage over samples."""
    adv_std: float
    adv_min: float
    adv_max: float
    loss: float
    """Aggregated loss (policy + β·KL − entropy bonus), mean over optimizer updates."""
    policy_loss: float
    """Clipped surrogate alone (same aggregation), mean over updates."""
    kl: float | None = None
    """Mean k3 KL to the reference on scored tokens (``None`` when ``kl_coef == 0``)."""
    clip_frac: float
    """Fraction of scored tokens whose ratio was clipped (no gradient)."""
    entropy: float
    """Mean policy entropy (nats) on scored tokens."""
    grad_norm: float
    """Global gradient L2 norm before clipping (mean over updates)."""
    grad_norm_max: float
    """Largest pre-clip gradient norm of the step's updates."""
    ratio_mean: float
    """Mean π_θ/π_θ_old on scored tokens (1.0 on the first pass)."""
    logprob_drift_mean: float
    """Mean |engine logprob − trainer π_θ_old logprob| on scored tokens (engine/trainer numerical mismatch)."""
    logprob_drift_max: float
    """Max of the same."""
    tis_weight_mean: float | None = None
    """Mean truncated importance weight min(π_θ_old/μ, C) on scored tokens (``None`` when ``tis_cap`` is off)."""
    lr: float
    """Learning rate used."""
    updates: int
    """Optimizer updates applied (``ppo_epochs · minibatches``, fewer when one was non-finite)."""
    updates_nonfinite: int = 0
    """Updates not applied because their gradient norm was non-finite (torch trainer: the step stops at
    the first, so 0 or 1; verl: each is skipped and the step goes on). A step whose every update was
    non-finite is no step (the trainer raises)."""
    micro_batches: int
    """Forward/backward passes made."""
    time_s: StepTimings = Field(default_factory=StepTimings)
    created_at: float = 0.0
    """Unix time (s) when the step finished."""


class MetricsLog:
    """Append-only JSONL file of :class:`StepMetrics` (one object per line).

    Args:
        path: File to append to (parent directories are created).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def append(self, metrics: StepMetrics) -> None:
        """Append one step (flushed before returning)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(metrics.model_dump_json() + "\n")
            f.flush()

    def read(self) -> list[StepMetrics]:
        """All steps in file order; a torn last line (crash mid-write) is skipped."""
        if not self.path.exists():
            return []
        out: list[StepMetrics] = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                out.append(StepMetrics.model_validate(json.loads(line)))
            except (json.JSONDecodeError, ValueError):
                continue
        return out
