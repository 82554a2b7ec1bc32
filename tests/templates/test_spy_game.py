"""Who-is-the-spy rules, played by scripted pure-Python players (testing game logic, not a service)."""

import asyncio

import pytest

from templates.who_is_the_spy import data
from templates.who_is_the_spy.game import GameSetup, Phase, Role, play
from templates.who_is_the_spy.reward import (
    agent_rewards,
    episode_reward,
    reward_parts,
    role_reward,
    self_check,
)


class Scripted:
    """A player answering from a script: ``describe(round)`` and ``vote(round)`` give the reply text."""

    def __init__(self, describe, vote):
        self.describe, self.vote = describe, vote
        self.calls = []

    async def __call__(self, messages, phase):
        self.calls.append([dict(m) for m in messages])
        n = sum(
            1 for m in messages if m["role"] == "user" and ("voting" in m["content"]) == (phase == Phase.VOTE)
        )
        return self.describe(n) if phase == Phase.DESCRIBE else self.vote(n)


def setup4(**kwargs):
    return GameSetup(civilian_word="apple", spy_word="pear", n_players=4, spy_seats=(3,), **kwargs)


def test_civilians_win_when_they_vote_out_the_spy():
    players = {s: Scripted(lambda r: "A sweet fruit.", lambda r: "I vote for player 3") for s in (1, 2, 4)}
    players[3] = Scripted(lambda r: "A sweet fruit.", lambda r: "player 1")
    record = asyncio.run(play(setup4(), players))
    assert record.winner == Role.CIVILIAN and record.rounds == 1 and record.eliminated == [3]
    rewards = agent_rewards(record)
    assert rewards == {"civilian_1": 1.0, "civilian_2": 1.0, "spy_1": 0.0, "civilian_3": 1.0}
    assert "Player 3 is eliminated" in record.transcript[-1]


def test_spies_win_by_survival_and_ties_eliminate_nobody():
    # 1,2 vote 4; 3,4 vote 1: a 2-2 tie every round, so the spy survives max_rounds.
    players = {
        s: Scripted(lambda r: "Grows on trees.", lambda r, s=s: "4" if s < 3 else "1") for s in range(1, 5)
    }
    record = asyncio.run(play(setup4(max_rounds=2), players))
    assert record.winner == Role.SPY and record.rounds == 2 and record.eliminated == []
    assert all("nobody is eliminated" in line for line in record.transcript if line.startswith("Votes"))


def test_spies_win_when_they_reach_parity():
    # Civilians eliminate each other: round 1 player 1 goes, round 2 player 2 goes -> 1 spy vs 1 civilian.
    def vote_for(round_):
        return "player 1" if round_ == 1 else "player 2"

    players = {s: Scripted(lambda r: "It is juicy.", vote_for) for s in (2, 3, 4)}
    players[1] = Scripted(lambda r: "It is juicy.", lambda r: "player 2")
    record = asyncio.run(play(setup4(max_rounds=5), players))
    assert record.eliminated == [1, 2] and record.winner == Role.SPY and record.rounds == 2


def test_leaks_and_invalid_votes_are_counted_hidden_and_penalised():
    players = {s: Scripted(lambda r: "Round and red.", lambda r: "player 3") for s in (1, 2)}
    players[4] = Scripted(lambda r: "It's an APPLE!", lambda r: "player 4")  # leak + self vote
    players[3] = Scripted(lambda r: "", lambda r: "all of them")  # empty description + unparsed vote
    record = asyncio.run(play(setup4(), players))
    assert record.stats[4].leaks == 1 and record.stats[4].invalid_votes == 1
    assert record.stats[3].leaks == 1 and record.stats[3].invalid_votes == 1
    assert "Player 4: ***" in record.transcript and "Player 3: (no description)" in record.transcript
    assert all("APPLE" not in line for line in record.transcript)
    rewards = agent_rewards(record)
    assert record.winner == Role.CIVILIAN
    assert rewards["civilian_3"] == pytest.approx(1.0 - 0.5 - 0.25)
    assert rewards["spy_1"] == pytest.approx(-0.75)
    # The reward's parts, as rates over the trainable agents' descriptions and votes (all agents when none).
    civilians = reward_parts(record, ["civilian_1", "civilian_2", "civilian_3"])
    assert civilians == pytest.approx({"win_rate": 1.0, "leak_rate": 1 / 3, "invalid_vote_rate": 1 / 3})
    assert reward_parts(record, ["spy_1"]) == {"win_rate": 0.0, "leak_rate": 1.0, "invalid_vote_rate": 1.0}
    assert reward_parts(record, []) == {"win_rate": 0.75, "leak_rate": 0.5, "invalid_vote_rate": 0.5}


def test_hide_leaks_false_shows_a_leak_as_said_and_still_counts_it():
    players = {s: Scripted(lambda r: "Round and red.", lambda r: "player 3") for s in (1, 2)}
    players[4] = Scripted(lambda r: "It's an APPLE!", lambda r: "player 3")  # a civilian says its word
    players[3] = Scripted(lambda r: "Pears are green.", lambda r: "player 1")  # the spy says its word
    record = asyncio.run(play(setup4(), players, hide_leaks=False))
    assert (
        "Player 4: It's an APPLE!" in record.transcript and "Player 3: Pears are green." in record.transcript
    )
    assert record.stats[4].leaks == 1 and record.stats[3].leaks == 1 and record.stats[1].leaks == 0
    # the others hear it: the next player's prompt carries the leaked words
    assert "APPLE" in players[1].calls[1][-1]["content"] and "Pears" in players[1].calls[1][-1]["content"]
    assert agent_rewards(record)["civilian_3"] == pytest.approx(0.5)  # still penalised by default
    assert agent_rewards(record, leak_penalty=0.0)["civilian_3"] == 1.0  # free under a broken reward
    quiet = {s: Scripted(lambda r: "", lambda r: "player 3") for s in range(1, 5)}
    hidden = asyncio.run(play(setup4(), quiet, hide_leaks=False))
    assert "Player 1: (no description)" in hidden.transcript  # an empty description is still empty


def test_each_history_is_append_only_and_private():
    players = {s: Scripted(lambda r, s=s: f"Clue {s}-{r}", lambda r: "player 2") for s in range(1, 5)}
    players[2] = Scripted(lambda r: "Clue 2", lambda r: "player 1")
    record = asyncio.run(play(setup4(max_rounds=3), players))
    for seat, player in players.items():
        for before, after in zip(player.calls, player.calls[1:], strict=False):
            assert after[: len(before)] == before  # every call extends the previous one
        final = record.histories[seat]
        assert final[: len(player.calls[-1])] == player.calls[-1]
        system = final[0]["content"]
        assert f"Your secret word is: {'pear' if seat == 3 else 'apple'}." in system
        assert "spy" not in system.split("You are Player")[1]  # roles stay secret by default
        replies = [m["content"] for m in final if m["role"] == "assistant"]
        assert replies[0] == f"Clue {seat}-1" or seat == 2


def test_tell_roles_and_setup_validation():
    players = {s: Scripted(lambda r: "clue", lambda r: "player 3") for s in range(1, 5)}
    record = asyncio.run(play(setup4(), players, tell_roles=True))
    assert "You are a spy." in record.histories[3][0]["content"]
    with pytest.raises(ValueError, match="fewer than half"):
        GameSetup(civilian_word="a", spy_word="b", n_players=4, spy_seats=(1, 2))
    with pytest.raises(ValueError, match="differ"):
        GameSetup(civilian_word="Apple", spy_word="apple ", n_players=4, spy_seats=(1,))
    with pytest.raises(ValueError, match="seats"):
        asyncio.run(play(setup4(), {1: players[1]}))


def test_agent_names_depend_on_the_game_size_not_the_seating():
    a = GameSetup(civilian_word="x", spy_word="y", n_players=5, spy_seats=(1, 4))
    b = GameSetup(civilian_word="x", spy_word="y", n_players=5, spy_seats=(2, 5))
    assert [a.agent(s) for s in a.seats] == ["spy_1", "civilian_1", "civilian_2", "spy_2", "civilian_3"]
    assert {a.agent(s) for s in a.seats} == {b.agent(s) for s in b.seats}
    assert sorted(data.trainable_agents(5, 2, "both")) == sorted(a.agent(s) for s in a.seats)


def test_role_reward_and_episode_reward():
    assert role_reward(won=True, leaks=0, invalid_votes=0) == 1.0
    assert role_reward(won=False, leaks=5, invalid_votes=5) == -1.0
    assert role_reward(won=True, leaks=1, invalid_votes=0, leak_penalty=0.2) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        role_reward(won=True, leaks=-1, invalid_votes=0)
    rewards = {"spy_1": 1.0, "civilian_2": 0.0, "civilian_3": -0.5}
    assert episode_reward(rewards, ["spy_1"]) == 1.0
    assert episode_reward(rewards, ["civilian_2", "civilian_3"]) == -0.25
    assert episode_reward(rewards, []) == pytest.approx(0.5 / 3)


def test_word_pairs_and_builder():
    pairs = data.load_pairs()
    assert len(pairs) >= 300
    assert len(set(pairs)) == len(pairs)
    tasks = data.build(n_players=5, n_spies=2, train_roles="spy", seed=1)
    assert len(tasks) == len(pairs) and len({t["id"] for t in tasks}) == len(tasks)
    for task in tasks[:50]:
        setup = GameSetup.from_task(task)
        assert task["trainable_agents"] == ["spy_1", "spy_2"]
        assert {setup.agent(s) for s in setup.spy_seats} == {"spy_1", "spy_2"}
        assert {task["civilian_word"], task["spy_word"]} == set(pairs[tasks.index(task) % len(pairs)])
        assert len(setup.spy_seats) == 2
    swapped = sum(task["civilian_word"] != pairs[i][0] for i, task in enumerate(tasks))
    assert 0.3 < swapped / len(tasks) < 0.7
    assert data.make_task(17, pairs, seed=1, n_players=5, n_spies=2, train_roles="spy") == tasks[17]
    both = data.build(n_tasks=3, train_roles="both")
    assert all(len(t["trainable_agents"]) == 3 for t in both)  # the default game has 3 players
    civ = data.build(n_tasks=3, train_roles="civilian")
    assert all(all(a.startswith("civilian_") for a in t["trainable_agents"]) for t in civ)
    with pytest.raises(ValueError):
        data.build(n_players=4, n_spies=2)


def test_load_pairs_rejects_bad_lines(tmp_path):
    bad = tmp_path / "pairs.txt"
    bad.write_text("# ok\napple,pear\nsame,Same\n")
    with pytest.raises(ValueError, match=":3:"):
        data.load_pairs(bad)


def test_self_check_passes():
    assert self_check(data.build(n_tasks=10)) == []
