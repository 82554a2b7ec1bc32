"""The JSONL log of per-step training metrics (one :class:`~swarm.protocol.StepMetrics` per policy update).

The metrics themselves are defined once in :mod:`swarm.protocol` (``GET /api/v1/metrics`` serves them);
the run dir keeps them in ``metrics.jsonl`` (one JSON object per line, appended after each step).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from swarm.protocol import StepMetrics, StepTimings

__all__ = ["MetricsLog", "StepMetrics", "StepTimings", "batch_statistics"]


def batch_statistics(advantages: Sequence[float], rewards: Sequence[float] | None) -> dict[str, Any]:
    """The :class:`StepMetrics` fields that describe a batch rather than the update: reward mean and
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
