"""The werewolves game: setup, rules and an orchestrator that plays it with any players.

Rules (the classic "Werewolves of Millers Hollow" with the seer, the witch and the hunter):

* ``n_players`` seats (numbered from 1), each with a secret role: ``werewolf`` (the werewolf team) or
  ``villager``, ``seer``, ``witch``, ``hunter`` (the village team). Werewolves know each other.
* **Night.** The werewolves choose a victim among the living non-werewolves (each werewolf names one;
  the most named wins, ties go to the lowest seat). The seer inspects one living player and privately
  learns whether it is a werewolf. The witch is told the victim and may use, once per game each, a
  potion that saves the victim and a poison that kills any other living player. Deaths are announced at
  dawn (roles are not revealed).
* **Day.** Every living player gives one public statement in seat order, then every living player
  votes for another living player; the single most-voted player is eliminated (a tie eliminates nobody).
* **The hunter**, when it dies (night or day), shoots one living player, who dies too.
* **Win.** The village wins as soon as every werewolf is dead; the werewolves win as soon as they are at
  least as many as the other living players, or when a werewolf is still alive after ``max_days`` days.

Rule breaking is recorded per seat (``PlayerStats``): *invalid actions* (a target that cannot be read or
is not allowed, a witch reply that uses a spent potion or cannot be read) and, for werewolves, *reveals*
(a public statement saying that one is a werewolf). An invalid action does nothing (a werewolf night
with no valid target kills nobody; an invalid vote is not counted).

Seats, histories (each player its own, append-only), vote counting and the win rule are the games'
shared base (`templates._game.table`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from templates._game.table import Message, Player, Seating, Table, hidden_team_won, majority, votes_line

from .parsing import Target, clean_speech, parse_target, parse_witch, reveals_werewolf


class Role(StrEnum):
    """A player's secret role."""

    WEREWOLF = "werewolf"
    VILLAGER = "villager"
    SEER = "seer"
    WITCH = "witch"
    HUNTER = "hunter"


class Team(StrEnum):
    """Who wins together."""

    WEREWOLVES = "werewolves"
    VILLAGE = "village"


def team_of(role: Role) -> Team:
    """The team of ``role``."""
    return Team.WEREWOLVES if role is Role.WEREWOLF else Team.VILLAGE


SPECIAL_ROLES = (Role.SEER, Role.WITCH, Role.HUNTER)
"""The village's roles with a power (at most one of each per game)."""


class Phase(StrEnum):
    """What a player is asked to do (the workflow sizes the reply's token limit by phase)."""

    NIGHT = "night"
    """A night action: choose a player (werewolf, seer) or use potions (witch)."""
    SPEAK = "speak"
    """A public statement."""
    VOTE = "vote"
    """Name the player to eliminate."""
    SHOOT = "shoot"
    """The dying hunter names who it takes down."""


@dataclass(frozen=True)
class GameSetup(Seating):
    """One game's fixed facts (a data-builder task row describes exactly this); agent names are
    ``<role>_<rank>`` (``werewolf_1``, ``seer_1``: `Seating.agent`)."""

    roles: tuple[Role, ...]
    """Role of seat ``i + 1``."""
    max_days: int = 2
    """Days before surviving werewolves win."""

    def __post_init__(self) -> None:
        n_wolves = sum(r is Role.WEREWOLF for r in self.roles)
        if len(self.roles) < 4:
            raise ValueError(f"need at least 4 players, got {len(self.roles)}")
        if n_wolves < 1 or 2 * n_wolves >= len(self.roles):
            raise ValueError(
                f"need 1 <= werewolves < half of the players, got {n_wolves} of {len(self.roles)}"
            )
        for role in SPECIAL_ROLES:
            if self.roles.count(role) > 1:
                raise ValueError(f"at most one {role.value} per game")
        if self.max_days < 1:
            raise ValueError(f"max_days must be >= 1, got {self.max_days}")

    @classmethod
    def from_task(cls, task: Mapping[str, Any]) -> GameSetup:
        """Build from a task row (``roles``: the role of each seat, ``max_days``)."""
        return cls(roles=tuple(Role(r) for r in task["roles"]), max_days=int(task.get("max_days", 2)))

    @property
    def n_seats(self) -> int:
        """Number of seats (one role each)."""
        return len(self.roles)

    def role(self, seat: int) -> Role:
        """The role of ``seat``."""
        return self.roles[seat - 1]

    def seat_of(self, role: Role) -> int | None:
        """The seat of a special role, or ``None`` when the game has none."""
        return next((s for s in self.seats if self.role(s) is role), None)

    def wolves(self) -> list[int]:
        """Seats of the werewolves."""
        return [s for s in self.seats if self.role(s) is Role.WEREWOLF]


@dataclass
class PlayerStats:
    """Rule compliance of one player over a game."""

    actions: int = 0
    """Night actions, votes and shots taken."""
    invalid_actions: int = 0
    """Actions that could not be read or broke the rules (they did nothing)."""
    reveals: int = 0
    """Public statements in which a werewolf said it is one."""


@dataclass
class GameRecord:
    """The outcome of one game."""

    setup: GameSetup
    winner: Team
    days: int
    deaths: list[tuple[int, str]] = field(default_factory=list)
    """``(seat, cause)`` in order; cause ``werewolves``, ``poison``, ``vote`` or ``hunter``."""
    stats: dict[int, PlayerStats] = field(default_factory=dict)
    transcript: list[str] = field(default_factory=list)
    """Public events in order."""
    histories: dict[int, list[Message]] = field(default_factory=dict)

    def won(self, seat: int) -> bool:
        """Whether ``seat``'s team won (dead players share their team's result)."""
        return team_of(self.setup.role(seat)) is self.winner


class Game:
    """Rules state of one game (no I/O): apply moves, resolve night and votes, decide the winner."""

    def __init__(self, setup: GameSetup) -> None:
        self.setup = setup
        self.alive: list[int] = setup.seats
        self.day = 0
        self.stats = {seat: PlayerStats() for seat in setup.seats}
        self.transcript: list[str] = []
        self.deaths: list[tuple[int, str]] = []
        self.save_left = True
        self.poison_left = True
        self.private: dict[int, list[str]] = {seat: [] for seat in setup.seats}
        """What each seat alone learns (its night results), delivered in its next prompt."""

    # -- moves -------------------------------------------------------------------------------------------
    def _act(self, seat: int, target: Target) -> int | None:
        self.stats[seat].actions += 1
        if not target.valid:
            self.stats[seat].invalid_actions += 1
            return None
        return target.seat

    def wolf_choice(self, seat: int, reply: str) -> int | None:
        """A werewolf's victim (a living non-werewolf), or ``None`` when invalid."""
        allowed = [s for s in self.alive if self.setup.role(s) is not Role.WEREWOLF]
        return self._act(seat, parse_target(reply, allowed, self.setup.seats))

    def seer_check(self, seat: int, reply: str) -> int | None:
        """The seer's inspection (another living player); its result goes to the seer's private notes."""
        allowed = [s for s in self.alive if s != seat]
        checked = self._act(seat, parse_target(reply, allowed, self.setup.seats))
        if checked is not None:
            is_wolf = self.setup.role(checked) is Role.WEREWOLF
            self.private[seat].append(
                f"Your vision: Player {checked} is {'' if is_wolf else 'NOT '}a werewolf."
            )
        return checked

    def witch_move(self, seat: int, reply: str, victim: int | None) -> tuple[bool, int | None]:
        """The witch's potions → (victim saved, poisoned seat)."""
        allowed = [s for s in self.alive if s != seat]
        move = parse_witch(
            reply,
            can_save=self.save_left and victim is not None,
            can_poison=self.poison_left,
            allowed=allowed,
            seats=self.setup.seats,
        )
        self.stats[seat].actions += 1
        if not move.valid:
            self.stats[seat].invalid_actions += 1
            return False, None
        if move.save:
            self.save_left = False
        poisoned = None
        if move.poison is not None:
            self.poison_left = False
            poisoned = move.poison.seat
        return move.save, poisoned

    def speak(self, seat: int, reply: str) -> str:
        """Record a public statement (a werewolf saying it is one counts as a reveal)."""
        if self.setup.role(seat) is Role.WEREWOLF and reveals_werewolf(reply):
            self.stats[seat].reveals += 1
        text = clean_speech(reply) or "(says nothing)"
        self.transcript.append(f"Player {seat}: {text}")
        return text

    def vote(self, seat: int, reply: str) -> int | None:
        """A day vote (another living player), or ``None`` when invalid."""
        allowed = [s for s in self.alive if s != seat]
        return self._act(seat, parse_target(reply, allowed, self.setup.seats))

    def shot(self, seat: int, reply: str) -> int | None:
        """The dying hunter's shot (another living player), or ``None`` when invalid."""
        allowed = [s for s in self.alive if s != seat]
        return self._act(seat, parse_target(reply, allowed, self.setup.seats))

    # -- resolution --------------------------------------------------------------------------------------
    def kill(self, seat: int, cause: str) -> None:
        """Remove ``seat`` from the living and announce it."""
        if seat in self.alive:
            self.alive.remove(seat)
            self.deaths.append((seat, cause))

    def winner(self, *, day_over: bool = True) -> Team | None:
        """The winning team if the game is over (see the module rules), else ``None``; before the day
        is over (after a night) the day limit does not end the game, only a team's elimination or parity."""
        wolves = sum(1 for s in self.alive if self.setup.role(s) is Role.WEREWOLF)
        out_of_time = day_over and self.day >= self.setup.max_days
        won = hidden_team_won(wolves, len(self.alive), out_of_time=out_of_time)
        return None if won is None else Team.WEREWOLVES if won else Team.VILLAGE


RULES = (
    "You are playing the party game Werewolves with {n} players (Players {seats}). Secret roles: "
    "{census}. Each night the werewolves kill one player, the seer learns whether one player is a "
    "werewolf, and the witch may save the victim once and poison one player once. When the hunter dies "
    "it shoots one player. Each day everyone speaks once, then votes to eliminate one player. The "
    "village wins when all werewolves are dead; the werewolves win when they equal the others or survive "
    "{days} day(s). Never reveal that you are a werewolf.\n"
    "You are Player {seat}. Your role: {role}.{extra}\n"
    "When asked to choose a player, answer with that player's number only, for example: 2"
)
WOLF_PROMPT = "Night {day}: choose a player to kill. Answer with one number from: {candidates}."
SEER_PROMPT = "Night {day}: choose a player to inspect. Answer with one number from: {candidates}."
WITCH_PROMPT = "Night {day}. {victim_line} Potions left: {potions}. Answer with one of: {options}."
SPEAK_PROMPT = "Day {day}. Your turn: say one or two short sentences to the others."
VOTE_PROMPT = "Day {day} vote: who should be eliminated? Answer with one number from: {candidates}."
SHOOT_PROMPT = "You die. As the hunter, choose a player to shoot. Answer with one number from: {candidates}."
"""Action prompts list every valid answer and ask for it alone. On the embedded 135M model at
temperature 1 this did not lower the invalid actions measurably (most replies stay prose either way:
bench/README.md, ``werewolves_compliance.py``); it states the rule a stronger model can follow."""


def witch_options(*, can_save: bool, can_poison: bool, others: Sequence[int]) -> str:
    """The witch's valid answers, listed: ``"save, poison 2, poison 4, pass"``."""
    options = (["save"] if can_save else []) + ([f"poison {s}" for s in others] if can_poison else [])
    return ", ".join([*options, "pass"])


def system_prompt(setup: GameSetup, seat: int) -> str:
    """The rules, the role census and ``seat``'s role (a werewolf also learns its fellow werewolves)."""
    census = Counter(r.value for r in setup.roles)
    role = setup.role(seat)
    extra = ""
    if role is Role.WEREWOLF:
        others = [str(s) for s in setup.wolves() if s != seat]
        extra = f" Your fellow werewolves: Players {', '.join(others)}." if others else ""
    return RULES.format(
        n=len(setup.roles),
        seats=", ".join(map(str, setup.seats)),
        census=", ".join(f"{n} {r}" for r, n in sorted(census.items())),
        days=setup.max_days,
        seat=seat,
        role=role.value,
        extra=extra,
    )


class _Table:
    """A game plus its players and their histories: asks a seat and records its reply."""

    def __init__(self, setup: GameSetup, players: Mapping[int, Player[Phase]]) -> None:
        self.table = Table({seat: system_prompt(setup, seat) for seat in setup.seats}, players)
        self.game = Game(setup)

    async def ask(self, seat: int, instruction: str, phase: Phase) -> str:
        game = self.game
        return await self.table.ask(seat, game.transcript, instruction, phase, game.private[seat])

    async def ask_each(self, seats: Sequence[int], instruction: Any, phase: Phase) -> list[str]:
        game = self.game
        replies = await self.table.ask_each(seats, game.transcript, instruction, phase, game.private)
        return list(replies.values())

    def candidates(self, exclude: Sequence[int] = ()) -> str:
        return ", ".join(str(s) for s in self.game.alive if s not in exclude)

    async def die(self, seat: int, cause: str) -> None:
        """Kill ``seat``; a dying hunter shoots."""
        game = self.game
        game.kill(seat, cause)
        game.transcript.append(f"Player {seat} died ({'voted out' if cause == 'vote' else 'killed'}).")
        if game.setup.role(seat) is Role.HUNTER and game.alive:
            reply = await self.ask(seat, SHOOT_PROMPT.format(candidates=self.candidates()), Phase.SHOOT)
            target = game.shot(seat, reply)
            if target is not None:
                game.kill(target, "hunter")
                game.transcript.append(f"The hunter, Player {seat}, shot Player {target}, who died.")

    async def night(self) -> None:
        game, setup = self.game, self.game.setup
        wolves = [s for s in game.alive if setup.role(s) is Role.WEREWOLF]
        prey = self.candidates(exclude=setup.wolves())
        instruction = WOLF_PROMPT.format(day=game.day, candidates=prey)
        replies = await self.ask_each(wolves, lambda _: instruction, Phase.NIGHT)
        victim = majority(
            [game.wolf_choice(w, r) for w, r in zip(wolves, replies, strict=True)], ties_to_lowest=True
        )
        seer = setup.seat_of(Role.SEER)
        if seer in game.alive:
            assert seer is not None
            reply = await self.ask(
                seer, SEER_PROMPT.format(day=game.day, candidates=self.candidates([seer])), Phase.NIGHT
            )
            game.seer_check(seer, reply)
        witch = setup.seat_of(Role.WITCH)
        saved, poisoned = False, None
        if witch in game.alive:
            assert witch is not None
            victim_line = (
                "Nobody was attacked tonight."
                if victim is None
                else f"The werewolves attacked Player {victim}."
            )
            potions = (
                ", ".join(p for p, left in (("save", game.save_left), ("poison", game.poison_left)) if left)
                or "none"
            )
            options = witch_options(
                can_save=game.save_left and victim is not None,
                can_poison=game.poison_left,
                others=[s for s in game.alive if s != witch],
            )
            instruction = WITCH_PROMPT.format(
                day=game.day, victim_line=victim_line, potions=potions, options=options
            )
            saved, poisoned = game.witch_move(witch, await self.ask(witch, instruction, Phase.NIGHT), victim)
        game.transcript.append(f"Dawn of day {game.day}.")
        if victim is not None and not saved:
            await self.die(victim, "werewolves")
        if poisoned is not None and poisoned in game.alive:
            await self.die(poisoned, "poison")
        if (victim is None or saved) and poisoned is None:
            game.transcript.append("Nobody died during the night.")

    async def daytime(self) -> None:
        game = self.game
        for seat in list(game.alive):
            game.speak(seat, await self.ask(seat, SPEAK_PROMPT.format(day=game.day), Phase.SPEAK))

        def vote_prompt(seat: int) -> str:
            return VOTE_PROMPT.format(day=game.day, candidates=self.candidates([seat]))

        alive = list(game.alive)
        replies = await self.ask_each(alive, vote_prompt, Phase.VOTE)
        votes = {seat: game.vote(seat, reply) for seat, reply in zip(alive, replies, strict=True)}
        shown = votes_line(votes)
        out = majority(votes.values(), ties_to_lowest=False)
        game.transcript.append(
            f"Votes: {shown}." + ("" if out is not None else " Tie: nobody is eliminated.")
        )
        if out is not None:
            await self.die(out, "vote")


async def play(setup: GameSetup, players: Mapping[int, Player[Phase]]) -> GameRecord:
    """Play one full game.

    Args:
        setup: Roles by seat and the day limit.
        players: One player per seat (``1..n_players``).

    Returns:
        The game record (winner, deaths, compliance stats, transcript, histories).

    Raises:
        ValueError: ``players`` does not cover exactly the seats.
    """
    table = _Table(setup, players)
    game = table.game
    winner = None
    while winner is None:
        game.day += 1
        await table.night()
        winner = game.winner(day_over=False)
        if winner is None:
            await table.daytime()
            winner = game.winner()
    return GameRecord(
        setup=setup,
        winner=winner,
        days=game.day,
        deaths=game.deaths,
        stats=game.stats,
        transcript=game.transcript,
        histories=table.table.transcripts(),
    )
