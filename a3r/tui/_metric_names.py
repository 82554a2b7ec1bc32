"""Which metric of a run is its reward curve."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["REWARD_METRICS", "reward_metric"]

REWARD_METRICS = ("reward/mean", "reward_mean", "reward", "train/reward", "eval/reward")
"""Names tried in order; the store's runs log ``reward/mean``, the swarm server's metrics ``reward_mean``."""


def reward_metric(names: Iterable[str]) -> str | None:
    """The metric to draw as the reward curve: a known reward name, else the first name containing
    ``reward``, else the first name (sorted); ``None`` when there is none."""
    present = sorted(set(names))
    for name in REWARD_METRICS:
        if name in present:
            return name
    return next((name for name in present if "reward" in name), present[0] if present else None)
