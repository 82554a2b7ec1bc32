"""Per-agent GRPO advantages for multi-agent episodes (pure function used by the training loop)."""

from __future__ import annotations

import pytest

from swarm.train.losses import agent_advantages


def test_each_agent_is_normalised_within_its_own_group() -> None:
    groups = {"game-1": ["e1", "e2"]}
    rewards = {"e1": 0.5, "e2": 0.5}  # scalar rewards carry no signal…
    per_agent = {"e1": {"spy": 1.0, "civilian": 0.0}, "e2": {"spy": 0.0, "civilian": 1.0}}
    adv = agent_advantages(groups, rewards, per_agent, normalize_std=False)
    # …but each role still learns from its own outcome
    assert adv == {("e1", "civilian"): -0.5, ("e2", "civilian"): 0.5, ("e1", "spy"): 0.5, ("e2", "spy"): -0.5}


def test_missing_agent_reward_falls_back_to_the_episode_reward() -> None:
    adv = agent_advantages({"t": ["a", "b"]}, {"a": 0.0, "b": 2.0}, {"a": {"x": 1.0}}, normalize_std=True)
    # agent x: rewards (1.0 reported, 2.0 fallback) → centred ±0.5, divided by std 0.5
    assert adv[("a", "x")] == pytest.approx(-1.0, abs=1e-5) and adv[("b", "x")] == pytest.approx(
        1.0, abs=1e-5
    )


def test_no_agent_rewards_gives_no_entries() -> None:
    assert agent_advantages({"t": ["a", "b"]}, {"a": 0.0, "b": 1.0}, {}) == {}
