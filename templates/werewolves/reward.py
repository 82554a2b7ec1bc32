"""Per-role rewards of werewolves: team win plus rule compliance.

``role_reward = clip(won - invalid_action_penalty * invalid_actions - reveal_penalty * reveals, -1, 1)``

* ``won``: 1 when the player's team (werewolves or village) won, also for players already dead.
* ``invalid_actions``: night actions, votes and hunter shots that could not be read or broke the rules
  (:func:`parsing.parse_target`, :func:`parsing.parse_witch`); they did nothing in the game.
* ``reveals``: public statements in which a werewolf said it is one (:func:`parsing.reveals_werewolf`).

The penalties make rule-breaking cost even a winning team, so "vote for everyone" or a werewolf
confessing never pays. The episode (scalar) reward is the mean over the trainable agents
(`templates._game.reward`, the games' shared base).
"""

from __future__ import annotations

from typing import Any

from templates._game import reward as _base
from templates._game.reward import episode_reward

from .game import GameRecord, GameSetup, PlayerStats, Role, Team, team_of
from .parsing import parse_target, parse_witch, reveals_werewolf

INVALID_ACTION_PENALTY = 0.25
REVEAL_PENALTY = 0.5


def role_reward(
    *,
    won: bool,
    invalid_actions: int,
    reveals: int,
    invalid_action_penalty: float = INVALID_ACTION_PENALTY,
    reveal_penalty: float = REVEAL_PENALTY,
) -> float:
    """Reward of one player (see the module docstring for the formula).

    Args:
        won: The player's team won.
        invalid_actions: Invalid actions (>= 0).
        reveals: Statements revealing oneself as a werewolf (>= 0).
        invalid_action_penalty: Cost per invalid action.
        reveal_penalty: Cost per reveal.

    Returns:
        A reward in ``[-1, 1]``.

    Raises:
        ValueError: Negative counts.
    """
    costs = {
        "invalid_actions": (invalid_actions, invalid_action_penalty),
        "reveals": (reveals, reveal_penalty),
    }
    return _base.penalised(won, costs)


def agent_rewards(
    record: GameRecord,
    *,
    invalid_action_penalty: float = INVALID_ACTION_PENALTY,
    reveal_penalty: float = REVEAL_PENALTY,
) -> dict[str, float]:
    """Reward of every agent of a finished game, keyed by agent name (``werewolf_1``, ``seer_1``…)."""
    return _base.agent_rewards(record, {"invalid_actions": invalid_action_penalty, "reveals": reveal_penalty})


__all__ = ["agent_rewards", "episode_reward", "role_reward", "self_check"]


def self_check(tasks: list[dict[str, Any]]) -> list[str]:
    """Winners who follow the rules earn 1; losers and rule breakers earn at most 0; the readers catch
    reveals and malformed actions and accept clean ones, on each task's seats.

    Returns:
        Failure messages (empty when all checks pass).
    """
    failures = []
    if role_reward(won=True, invalid_actions=0, reveals=0) != 1.0:
        failures.append("a compliant winner earned less than 1")
    for won, invalid, reveals in [(False, 0, 0), (False, 2, 0), (True, 4, 0), (True, 0, 2), (True, 2, 1)]:
        if role_reward(won=won, invalid_actions=invalid, reveals=reveals) > 0.0:
            failures.append(f"won={won} invalid={invalid} reveals={reveals} earned reward")
    for text in ("I am a werewolf.", "Trust me, as the wolf I know", "I'm one of the werewolves"):
        if not reveals_werewolf(text):
            failures.append(f"reveal {text!r} not detected")
    for text in ("I think Player 3 is a werewolf.", "The wolves are among us", "Vote player 2"):
        if reveals_werewolf(text):
            failures.append(f"{text!r} wrongly read as a reveal")
    for task in tasks:
        setup = GameSetup.from_task(task)
        seats = setup.seats
        for text in ("", "everyone", "1 2 3", "I choose player 99", "Player 1 or Player 2", "Night 1."):
            if parse_target(text, seats, seats).valid:
                failures.append(f"{task['id']}: malformed target {text!r} accepted")
        if (
            parse_target("I vote for player 2!", [2], seats).seat != 2
            or parse_target("Player two", [2], seats).seat != 2
            or parse_target("2.", [2], seats).seat != 2
            or parse_target("Day 1 vote: 2", [2], seats).seat != 2
        ):
            failures.append(f"{task['id']}: a clean target was not read")
        if parse_witch("save", can_save=False, can_poison=True, allowed=seats, seats=seats).valid:
            failures.append(f"{task['id']}: a spent potion was accepted")
        wolf = setup.wolves()[0]
        record = GameRecord(setup=setup, winner=Team.WEREWOLVES, days=1)
        record.stats = {s: PlayerStats() for s in seats}
        rewards = agent_rewards(record)
        if rewards[setup.agent(wolf)] != 1.0 or any(
            rewards[setup.agent(s)] != 0.0 for s in seats if team_of(setup.role(s)) is Team.VILLAGE
        ):
            failures.append(f"{task['id']}: a werewolf win did not give werewolves 1 and the village 0")
        if Role.WEREWOLF not in setup.roles:
            failures.append(f"{task['id']}: no werewolf")
    return failures
