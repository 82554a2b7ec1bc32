"""Rewards of a multi-agent game: a team win less a penalty per rule broken, per agent and per episode.

``reward = clip(won - Σ penalty_i * count_i, -1, 1)``: the penalties make rule-breaking cost even a
winning team. A template names its counts and weights (`penalised`); the episode (scalar) reward is the
mean over the trainable agents (`episode_reward`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

StatsT = TypeVar("StatsT", covariant=True)


class Record(Protocol[StatsT]):
    """What a finished game's record offers the reward: per-seat stats, agent names and who won."""

    @property
    def stats(self) -> Mapping[int, StatsT]:
        """Rule-compliance counts by seat."""
        ...

    @property
    def setup(self) -> Any:
        """The game setup (its ``agent(seat)`` names a seat's agent)."""
        ...

    def won(self, seat: int) -> bool:
        """Whether ``seat``'s team won."""
        ...


def penalised(won: bool, costs: Mapping[str, tuple[int, float]]) -> float:
    """``clip(won - Σ penalty * count, -1, 1)`` over ``costs`` (name → ``(count, penalty)``, subtracted in order).

    Raises:
        ValueError: A negative count (the message names every count).
    """
    if any(count < 0 for count, _ in costs.values()):
        shown = ", ".join(f"{name}={count}" for name, (count, _) in costs.items())
        raise ValueError(f"counts must be >= 0, got {shown}")
    raw = float(won)
    for count, penalty in costs.values():
        raw -= penalty * count
    return max(-1.0, min(1.0, raw))


def agent_rewards(record: Record[Any], weights: Mapping[str, float]) -> dict[str, float]:
    """`penalised` reward of every seat of a finished game, keyed by its agent name (``spy_1``...).

    Args:
        record: The finished game.
        weights: Penalty per rule broken, by the name of the count in the seats' stats (``{"leaks": 0.5}``
            charges ``stats.leaks * 0.5``), in the order they are subtracted.
    """
    return {
        record.setup.agent(seat): penalised(
            record.won(seat), {name: (getattr(stats, name), w) for name, w in weights.items()}
        )
        for seat, stats in record.stats.items()
    }


def episode_reward(rewards: dict[str, float], trainable: Iterable[str]) -> float:
    """Mean reward of the trainable agents (of all agents when none is trainable)."""
    names = [a for a in trainable if a in rewards] or list(rewards)
    return sum(rewards[a] for a in names) / len(names)
