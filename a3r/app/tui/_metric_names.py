"""Which metric of a run is its reward curve."""

from __future__ import annotations

from collections.abc import Iterable

from memory import Store

__all__ = ["REWARD_METRICS", "reward_history", "reward_metric"]

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


def reward_history(store: Store, run_id: int) -> tuple[str, list[float]]:
    """A run's reward curve from the store: the metric `reward_metric` picks and its values by step.

    The known reward names are read one by one (indexed by run, name and step), so a run with many
    other metrics is not read whole; only a run logging none of them is.

    Returns:
        ``(metric name, values oldest first)``; ``("reward", [])`` when the run logged no metric.

    Raises:
        memory.StoreError: The store cannot be read.
    """
    for name in REWARD_METRICS:
        points = store.metric_history(run_id, name)
        if points:
            return name, [point.value for point in points]
    history = store.metric_history(run_id)
    name = reward_metric(point.name for point in history) or "reward"
    return name, [point.value for point in history if point.name == name]
