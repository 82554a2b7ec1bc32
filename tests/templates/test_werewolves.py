"""Werewolves: rules played by scripted pure-Python players, parsing, rewards, data, registry routing,
and whole games on the real server (tiny model; the untrained opponent on another endpoint)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import templates
from a3r.app.cli import app as a3r_app
from swarm.client import AsyncSwarmClient
from templates import render
from templates.werewolves import data
from templates.werewolves.game import GameSetup, Phase, Role, Team, play, witch_options
from templates.werewolves.parsing import TargetStatus, parse_target, parse_witch, reveals_werewolf
from templates.werewolves.reward import agent_rewards, role_reward, self_check
from tests.templates.test_workflows_e2e import run_episodes


class Scripted:
    """A player answering from a script: ``script[phase]`` is a reply, or a function of the prompt text."""

    def __init__(self, **script: Any) -> None:
        self.script = script
        self.prompts: list[str] = []

    async def __call__(self, messages: list[dict[str, str]], phase: Phase) -> str:
        self.prompts.append(messages[-1]["content"])
        reply = self.script.get(phase.value, "pass")
        return reply(messages[-1]["content"]) if callable(reply) else reply


# seats: 1 werewolf, 2 seer, 3 witch, 4 hunter, 5 villager
ROLES = (Role.WEREWOLF, Role.SEER, Role.WITCH, Role.HUNTER, Role.VILLAGER)


def _table(**by_seat: Scripted) -> dict[int, Scripted]:
    default = {"speak": "I am a simple villager.", "vote": "player 1", "night": "pass"}
    players = {seat: Scripted(**default) for seat in range(1, 6)}
    players.update({int(k.removeprefix("p")): v for k, v in by_seat.items()})
    return players


def test_the_village_wins_when_it_votes_out_the_werewolf_and_only_the_seer_learns_the_vision() -> None:
    players = _table(
        p1=Scripted(night="I kill player 5", speak="Hello all.", vote="player 2"),
        p2=Scripted(night="1", speak="Player 1 is suspicious.", vote="player 1"),
    )
    record = asyncio.run(play(GameSetup(ROLES, max_days=3), players))
    assert record.winner is Team.VILLAGE and record.days == 1
    assert record.deaths == [(5, "werewolves"), (1, "vote")]
    assert any("Player 1 is a werewolf" in p for p in players[2].prompts)
    assert not any("Player 1 is a werewolf" in p for s in (1, 3, 4, 5) for p in players[s].prompts)
    assert "The werewolves attacked Player 5" in players[3].prompts[0]  # the witch is told the victim
    # every action prompt lists the valid answers
    assert players[1].prompts[0].endswith("Answer with one number from: 2, 3, 4, 5.")
    assert (
        players[3]
        .prompts[0]
        .endswith("Answer with one of: save, poison 1, poison 2, poison 4, poison 5, pass.")
    )
    assert (
        players[2]
        .prompts[-1]
        .endswith("vote: who should be eliminated? Answer with one number from: 1, 3, 4.")
    )
    assert all(stats.invalid_actions == 0 and stats.reveals == 0 for stats in record.stats.values())
    assert agent_rewards(record) == {
        "werewolf_1": 0.0,
        "seer_1": 1.0,
        "witch_1": 1.0,
        "hunter_1": 1.0,
        "villager_1": 1.0,
    }


def test_the_witch_saves_once_and_the_dying_hunter_shoots() -> None:
    players = _table(
        p1=Scripted(night="4", speak="Hi.", vote="4"),
        p3=Scripted(night="save", speak="Hi.", vote="4"),  # saves the hunter on night 1
        p4=Scripted(night="pass", speak="Hi.", vote="5", shoot="I shoot player 1"),
        p5=Scripted(speak="Hi.", vote="4"),
        p2=Scripted(night="3", speak="Hi.", vote="4"),
    )
    record = asyncio.run(play(GameSetup(ROLES, max_days=3), players))
    # night 1: nobody dies (saved); day 1: the hunter is voted out and takes the werewolf with it
    assert record.deaths == [(4, "vote"), (1, "hunter")] and record.winner is Team.VILLAGE
    assert any("Nobody died during the night" in line for line in record.transcript)


def test_werewolves_win_at_parity_and_by_surviving_the_last_day() -> None:
    roles = (Role.VILLAGER, Role.WEREWOLF, Role.VILLAGER, Role.VILLAGER)
    players = {
        s: Scripted(night="player 1", speak="Hm.", vote="player 3" if s != 3 else "player 4")
        for s in range(1, 5)
    }
    record = asyncio.run(play(GameSetup(roles, max_days=5), players))
    # night 1 kills 1; day 1 votes 3 out; 1 werewolf vs 1 villager: parity
    assert record.deaths == [(1, "werewolves"), (3, "vote")] and record.winner is Team.WEREWOLVES
    tie = {
        s: Scripted(night="player 1", speak="Hm.", vote="player 2" if s in (3, 4) else "player 3")
        for s in range(1, 5)
    }
    record = asyncio.run(play(GameSetup(roles, max_days=1), tie))
    # night 1 kills 1; day 1 votes 3→2, 4→2, 2→3: player 2 (the werewolf) is out
    assert record.winner is Team.VILLAGE
    survive = {s: Scripted(night="nobody", speak="Hm.", vote="everyone") for s in range(1, 5)}
    record = asyncio.run(play(GameSetup(roles, max_days=1), survive))
    assert record.winner is Team.WEREWOLVES and record.days == 1 and record.deaths == []
    assert record.stats[2].invalid_actions == 2  # its unreadable night target and its unreadable vote


def test_rule_breaking_costs_even_a_winning_werewolf() -> None:
    roles = (Role.WEREWOLF, Role.VILLAGER, Role.VILLAGER, Role.VILLAGER, Role.VILLAGER)
    players = {s: Scripted(speak="Hi.", vote="player 2") for s in range(2, 6)}
    players[1] = Scripted(night="player 1", speak="I am a werewolf, fear me.", vote="player 1")
    record = asyncio.run(play(GameSetup(roles, max_days=1), players))
    assert record.winner is Team.WEREWOLVES  # it survives the only day
    stats = record.stats[1]
    assert (stats.invalid_actions, stats.reveals) == (2, 1)  # killing itself, voting for itself; the reveal
    assert agent_rewards(record)["werewolf_1"] == pytest.approx(1.0 - 2 * 0.25 - 0.5)


def test_parsing_reads_messy_output_and_refuses_ambiguity() -> None:
    seats = [1, 2, 3, 4, 5]
    assert parse_target("I vote for Player 3!", [3], seats).seat == 3
    assert parse_target("three", [3], seats).seat == 3
    assert parse_target("player 2", [3], seats).status is TargetStatus.NOT_ALLOWED
    for text in ("", "everyone", "1 2", "player 9", "Player 1 or Player 2"):
        assert parse_target(text, seats, seats).status is TargetStatus.UNPARSED, text
    move = parse_witch(
        "Save them, and poison player 2", can_save=True, can_poison=True, allowed=seats, seats=seats
    )
    assert move.valid and move.save and move.poison is not None and move.poison.seat == 2
    assert parse_witch("pass", can_save=True, can_poison=True, allowed=seats, seats=seats) == type(move)()
    assert not parse_witch("save", can_save=False, can_poison=True, allowed=seats, seats=seats).valid
    assert not parse_witch("hmm", can_save=True, can_poison=True, allowed=seats, seats=seats).valid
    assert reveals_werewolf("Honestly, I'm the werewolf") and not reveals_werewolf("Player 2 is a werewolf")


@pytest.mark.parametrize(
    ("reply", "seat"),
    [
        # replies of the embedded 135M model (bench/werewolves_compliance.py) and their near variants
        ("3.", 3),
        ("3.\n", 3),
        ("Player 3.", 3),
        ("I vote 3", 3),
        ("Night 1. Choosing 4,", 4),  # the echoed clock is not a player
        ("Night 1, Player 3 Player", 3),
        ("Day 2 vote: 5", 5),
        ("You are a card, 1.", 1),
        # still invalid: several players, none, a decimal, or only the echoed clock
        ("1. 3. 2.", None),
        ("Suncoin. 1 or 2", None),
        ("1. Avoiding a Mayday\n2", None),
        ("Day 1, \nPlayers", None),
        ("Night 1: Polynesality's Sub", None),
        ("3.5", None),
        ("Day 1 vote. 3 or 4", None),
    ],
)
def test_a_single_player_is_read_from_model_replies_and_several_or_none_stay_invalid(
    reply: str, seat: int | None
) -> None:
    seats = [1, 2, 3, 4, 5]
    target = parse_target(reply, seats, seats)
    assert (target.seat, target.valid) == ((seat, True) if seat else (None, False)), reply


def test_the_witch_is_offered_only_the_potions_she_has() -> None:
    assert witch_options(can_save=True, can_poison=True, others=[2, 4]) == "save, poison 2, poison 4, pass"
    assert witch_options(can_save=False, can_poison=True, others=[2]) == "poison 2, pass"
    assert witch_options(can_save=False, can_poison=False, others=[2]) == "pass"
    seats = [1, 2, 3, 4, 5]
    for answer in ("save", "poison 2", "pass"):  # each offered answer, given verbatim, is valid
        assert parse_witch(answer, can_save=True, can_poison=True, allowed=[2, 4], seats=seats).valid
    assert not parse_witch(
        "save, poison 2, poison 4, pass", can_save=True, can_poison=True, allowed=[2, 4], seats=seats
    ).valid  # the whole list copied back names two players


def test_rewards_and_self_check() -> None:
    assert role_reward(won=True, invalid_actions=0, reveals=0) == 1.0
    assert role_reward(won=False, invalid_actions=10, reveals=10) == -1.0
    with pytest.raises(ValueError):
        role_reward(won=True, invalid_actions=-1, reveals=0)
    assert self_check(data.build(n_tasks=4)) == []


def test_data_is_seeded_per_index_and_names_the_trainable_roles() -> None:
    tasks = data.build(n_tasks=6, seed=3)
    assert tasks == data.build(n_tasks=6, seed=3) and tasks[4] == data.make_task(4, seed=3)
    assert all(
        sorted(t["roles"]) == sorted(["werewolf", "seer", "witch", "hunter", "villager"]) for t in tasks
    )
    assert len({tuple(t["roles"]) for t in tasks}) > 1
    census = data.role_census(7, 2, "seer,witch")
    assert data.trainable_agents(census, "werewolves") == ["werewolf_1", "werewolf_2"]
    assert data.trainable_agents(census, "special") == ["seer_1", "witch_1"]
    assert data.trainable_agents(census, "village") == [
        "seer_1",
        "witch_1",
        "villager_1",
        "villager_2",
        "villager_3",
    ]
    with pytest.raises(ValueError):
        data.role_census(4, 2, "")  # werewolves not fewer than half
    with pytest.raises(ValueError):
        data.role_census(4, 1, "seer,witch,hunter,seer")
    template = templates.get_template("werewolves")
    assert template.trainable_agents({"train_roles": "hunter"}) == ["hunter_1"]
    with pytest.raises(templates.TemplateParamError, match="special_roles"):
        template.resolve({"special_roles": "seer,wizard"})


def test_requests_route_to_werewolves_not_to_the_spy_game() -> None:
    for sentence in (
        "train werewolves",
        "RL on the werewolf game",
        "train the mafia game with a seer and a witch",
    ):
        assert templates.match(sentence)[0][0] == "werewolves", sentence
    assert "who_is_the_spy" not in dict(templates.match("train werewolves"))
    assert "who_is_the_spy" not in dict(templates.match("a werewolf"))  # the spy game no longer claims it
    assert templates.match("train who-is-the-spy")[0][0] == "who_is_the_spy"


def test_a3r_vibe_dry_run_shows_the_plan_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        a3r_app, ["vibe", "train werewolves with 6 players", "--dry-run", "--steps", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "template: werewolves" in result.output and "n_players = 6" in result.output
    assert "trainable agents: werewolf_1" in result.output and "steps=3" in result.output
    assert not (tmp_path / ".a3r").exists()  # nothing started or stored


async def test_a_game_on_the_server_records_each_agent_and_trains_only_the_chosen_roles(
    server: Any, tmp_path: Path
) -> None:
    params = {
        "n_tasks": 2,
        "max_days": 1,
        "train_roles": "special",
        "speak_max_tokens": 6,
        "action_max_tokens": 4,
    }
    rendered = render("werewolves", params, tmp_path / "wolves")
    for task, result, view in await run_episodes(server.url, rendered.folder, 2):
        trainable = set(task["trainable_agents"])
        assert trainable == {"seer_1", "witch_1", "hunter_1"}
        assert set(result.agent_rewards) == {"werewolf_1", "seer_1", "witch_1", "hunter_1", "villager_1"}
        assert {c.agent for c in view.calls} <= set(result.agent_rewards)
        assert all(call.trainable == (call.agent in trainable) for call in view.calls)
        # append-only histories: each trained agent's calls chain into one sample, nobody else's are trained
        trained = [s for s in view.samples if any(s.loss_mask)]
        assert {s.agent for s in trained} <= trainable
        assert len({s.agent for s in trained}) == len(trained)
        assert result.reward == pytest.approx(sum(result.agent_rewards[a] for a in trainable) / 3)


async def test_the_opponent_roles_can_play_on_another_endpoint(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The untrained roles (here the village) are served by an opponent endpoint: a frozen copy in practice,
    here a second episode keyed through an environment variable NAME."""
    async with AsyncSwarmClient(server.url) as client:
        async with client.episode("opponent", kind="eval") as opponent:
            monkeypatch.setenv("WOLF_TEST_OPPONENT_KEY", opponent.api_key)
            params = {
                "n_tasks": 1,
                "max_days": 1,
                "speak_max_tokens": 4,
                "action_max_tokens": 4,
                "opponent_base_url": opponent.base_url,
                "opponent_api_key_env": "WOLF_TEST_OPPONENT_KEY",
            }
            rendered = render("werewolves", params, tmp_path / "wolves")
            ((_, result, view),) = await run_episodes(server.url, rendered.folder, 1)
            await opponent.finish(0.0)
        opponent_view = await client.get_episode(opponent.id)
    assert {c.agent for c in view.calls} == {"werewolf_1"}
    assert {c.agent for c in opponent_view.calls} <= set(result.agent_rewards) - {"werewolf_1"}
    assert len({c.agent for c in opponent_view.calls}) >= 3
