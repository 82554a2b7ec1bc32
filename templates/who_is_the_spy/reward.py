"""Per-role rewards of who-is-the-spy: team win plus rule compliance.

``role_reward = clip(won - leak_penalty * leaks - invalid_vote_penalty * invalid_votes, -1, 1)``

* ``won``: 1 when the player's team (civilians or spies) won, also for players already eliminated.
* ``leaks``: descriptions that said the player's own word (:func:`parsing.mentions_word`: case,
  plurals and spelled-out forms count) or were empty.
* ``invalid_votes``: votes that could not be read as one player, or named oneself, an eliminated or
  a non-existent player (:func:`parsing.parse_vote`).

The penalties make rule-breaking cost even a winning team, so "say the word to win the vote" or
"vote for everyone" never pays. The episode (scalar) reward is the mean over the trainable agents
(`templates._game.reward`, the games' shared base).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from templates._game import reward as _base
from templates._game.reward import episode_reward

from .game import GameRecord, GameSetup, PlayerStats
from .parsing import mentions_word, parse_vote

LEAK_PENALTY = 0.5
INVALID_VOTE_PENALTY = 0.25


def role_reward(
    *,
    won: bool,
    leaks: int,
    invalid_votes: int,
    leak_penalty: float = LEAK_PENALTY,
    invalid_vote_penalty: float = INVALID_VOTE_PENALTY,
) -> float:
    """Reward of one player (see module docstring for the formula).

    Args:
        won: The player's team won.
        leaks: Descriptions that said the own word or were empty (>= 0).
        invalid_votes: Invalid votes (>= 0).
        leak_penalty: Cost per leak.
        invalid_vote_penalty: Cost per invalid vote.

    Returns:
        A reward in ``[-1, 1]``.

    Raises:
        ValueError: Negative counts.
    """
    costs = {"leaks": (leaks, leak_penalty), "invalid_votes": (invalid_votes, invalid_vote_penalty)}
    return _base.penalised(won, costs)


def agent_rewards(
    record: GameRecord,
    *,
    leak_penalty: float = LEAK_PENALTY,
    invalid_vote_penalty: float = INVALID_VOTE_PENALTY,
) -> dict[str, float]:
    """Reward of every agent of a finished game, keyed by agent name (``spy_3``, ``civilian_1``...)."""
    return _base.agent_rewards(record, {"leaks": leak_penalty, "invalid_votes": invalid_vote_penalty})


__all__ = ["agent_rewards", "episode_reward", "reward_parts", "role_reward", "self_check"]


def reward_parts(record: GameRecord, trainable: Iterable[str]) -> dict[str, float]:
    """The parts of the reward of the trainable agents (of all agents when none is), as rates:

    * ``win_rate``: fraction of them whose team won;
    * ``leak_rate``: their leaks per description given (0 when none was given);
    * ``invalid_vote_rate``: their invalid votes per vote cast (0 when none was cast).
    """
    names = set(trainable)
    seats = [seat for seat in record.stats if record.setup.agent(seat) in names] or list(record.stats)
    descriptions = sum(record.stats[s].descriptions for s in seats)
    votes = sum(record.stats[s].votes for s in seats)
    return {
        "win_rate": sum(record.won(s) for s in seats) / len(seats),
        "leak_rate": sum(record.stats[s].leaks for s in seats) / descriptions if descriptions else 0.0,
        "invalid_vote_rate": sum(record.stats[s].invalid_votes for s in seats) / votes if votes else 0.0,
    }


def self_check(tasks: list[dict[str, Any]]) -> list[str]:
    """Winners who follow the rules earn 1; losers and rule breakers earn at most 0.

    Also checks, on each task's words, that leaks and malformed votes are detected.

    Returns:
        Failure messages (empty when all checks pass).
    """
    failures = []
    if role_reward(won=True, leaks=0, invalid_votes=0) != 1.0:
        failures.append("a compliant winner earned less than 1")
    for won, leaks, invalid in [(False, 0, 0), (False, 1, 0), (False, 0, 3), (True, 2, 0), (True, 0, 4)]:
        if role_reward(won=won, leaks=leaks, invalid_votes=invalid) > 0.0:
            failures.append(f"won={won} leaks={leaks} invalid={invalid} earned reward")
    for task in tasks:
        setup = GameSetup.from_task(task)
        for word in (setup.civilian_word, setup.spy_word):
            for text in (
                f"My word is {word}.",
                f"{word.upper()}S everywhere",
                "-".join(word.replace(" ", "")),
            ):
                if not mentions_word(text, word):
                    failures.append(f"{task['id']}: leak {text!r} not detected")
        alive = setup.seats
        for text in (
            "",
            "everyone",
            "1 2 3",
            "I vote for player 99",
            "Player 1 or Player 2",
            "Which one?",
            "Two, 3.",
        ):
            if parse_vote(text, voter=1, alive=alive).valid:
                failures.append(f"{task['id']}: malformed vote {text!r} accepted")
        for text in ("2", "Player 2", "I vote for player 2.", "two"):
            vote = parse_vote(text, voter=1, alive=alive)
            if not vote.valid or vote.target != 2:
                failures.append(f"{task['id']}: clear vote {text!r} for player 2 not read")
        record = GameRecord(setup=setup, winner=setup.role(setup.spy_seats[0]), rounds=1)
        record.stats = {s: PlayerStats() for s in setup.seats}
        rewards = agent_rewards(record)
        if rewards[setup.agent(setup.spy_seats[0])] != 1.0 or min(rewards.values()) != 0.0:
            failures.append(f"{task['id']}: a spy win did not give spies 1 and civilians 0")
    return failures
