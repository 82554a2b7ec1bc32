"""The who-is-the-spy game: setup, rules and an orchestrator that plays it with any players.

Rules (the classic "who is the undercover" word game):

* ``n_players`` seats (numbered from 1). Civilians share one secret word; the ``n_spies`` spies get a
  similar but different word. Nobody is told their role unless ``tell_roles`` is set.
* Each round, every living player in seat order gives a one-sentence description of their word
  without saying it; descriptions are public. Then every living player votes (simultaneously) for one
  other living player. The single player with the most valid votes is eliminated; a tie eliminates
  nobody. Votes and the elimination are announced; roles are not revealed.
* Civilians win as soon as every spy is eliminated. Spies win when living spies are at least as many
  as living civilians, or when a spy is still alive after ``max_rounds`` rounds.

Seats, histories (each player its own, append-only), vote counting and the win rule are the games'
shared base (`templates._game.table`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from templates._game.table import Message, Player, Seating, Table, hidden_team_won, majority, votes_line

from .parsing import Vote, clean_description, mentions_word, parse_vote


class Role(StrEnum):
    """A player's team."""

    CIVILIAN = "civilian"
    """Holds the majority word."""
    SPY = "spy"
    """Holds the other word and tries to stay hidden."""


class Phase(StrEnum):
    """What a player is asked to do."""

    DESCRIBE = "describe"
    """Give one public sentence about the secret word."""
    VOTE = "vote"
    """Name the player to eliminate."""


@dataclass(frozen=True)
class GameSetup(Seating):
    """One game's fixed facts (a data-builder task row describes exactly this); agent names are
    ``<role>_<rank>`` (``spy_1``, ``civilian_2``: `Seating.agent`)."""

    civilian_word: str
    """Word of the civilians."""
    spy_word: str
    """Word of the spies."""
    n_players: int
    """Number of seats, numbered ``1..n_players``."""
    spy_seats: tuple[int, ...]
    """Seats of the spies."""
    max_rounds: int = 3
    """Rounds before the spies win by survival."""

    def __post_init__(self) -> None:
        if self.n_players < 3:
            raise ValueError(f"need at least 3 players, got {self.n_players}")
        if not self.spy_seats or len(set(self.spy_seats)) != len(self.spy_seats):
            raise ValueError(f"spy seats must be distinct and non-empty, got {self.spy_seats}")
        if any(not 1 <= s <= self.n_players for s in self.spy_seats):
            raise ValueError(f"spy seats {self.spy_seats} outside 1..{self.n_players}")
        if 2 * len(self.spy_seats) >= self.n_players:
            raise ValueError("spies must be fewer than half of the players")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if normalise_word(self.civilian_word) == normalise_word(self.spy_word):
            raise ValueError("civilian and spy words must differ")

    @classmethod
    def from_task(cls, task: Mapping[str, Any]) -> GameSetup:
        """Build from a task row (``civilian_word``, ``spy_word``, ``n_players``, ``spy_seats``, ``max_rounds``)."""
        return cls(
            civilian_word=task["civilian_word"],
            spy_word=task["spy_word"],
            n_players=int(task["n_players"]),
            spy_seats=tuple(int(s) for s in task["spy_seats"]),
            max_rounds=int(task.get("max_rounds", 3)),
        )

    @property
    def n_seats(self) -> int:
        """Number of seats (``n_players``)."""
        return self.n_players

    def role(self, seat: int) -> Role:
        """The role of ``seat``."""
        return Role.SPY if seat in self.spy_seats else Role.CIVILIAN

    def word(self, seat: int) -> str:
        """The secret word of ``seat``."""
        return self.spy_word if seat in self.spy_seats else self.civilian_word


def normalise_word(word: str) -> str:
    """Case- and space-insensitive form of a word."""
    return " ".join(word.lower().split())


@dataclass
class PlayerStats:
    """Rule compliance of one player over a game."""

    descriptions: int = 0
    """Descriptions given."""
    leaks: int = 0
    """Descriptions that said the player's own word (or were empty)."""
    votes: int = 0
    """Votes cast."""
    invalid_votes: int = 0
    """Votes that could not be read or broke the rules (self, eliminated or unknown player)."""


@dataclass
class GameRecord:
    """The outcome of one game."""

    setup: GameSetup
    winner: Role
    """The winning team."""
    rounds: int
    """Rounds played."""
    eliminated: list[int] = field(default_factory=list)
    """Seats in elimination order."""
    stats: dict[int, PlayerStats] = field(default_factory=dict)
    """Per-seat compliance counts."""
    transcript: list[str] = field(default_factory=list)
    """Public events in order (descriptions, votes, eliminations)."""
    histories: dict[int, list[Message]] = field(default_factory=dict)
    """Each seat's full chat history (its prompts and its verbatim replies)."""

    def won(self, seat: int) -> bool:
        """Whether ``seat``'s team won (eliminated players share their team's result)."""
        return self.setup.role(seat) == self.winner


class Game:
    """Rules state of one game (no I/O): record moves, resolve votes, decide the winner."""

    def __init__(self, setup: GameSetup, *, hide_leaks: bool = True) -> None:
        self.setup = setup
        self.hide_leaks = hide_leaks
        self.alive: list[int] = setup.seats
        self.round = 0
        self.eliminated: list[int] = []
        self.stats = {seat: PlayerStats() for seat in setup.seats}
        self.transcript: list[str] = []

    def describe(self, seat: int, reply: str) -> str:
        """Record ``seat``'s description and return its public text.

        A description that says the player's own word, or has no visible text, counts as a leak; the
        public text then hides the word as ``***`` so other players do not learn it (unless the game
        was started with ``hide_leaks=False``: then the leaked description is public as said, so a
        leak tells the others one's word).
        """
        text = clean_description(reply)
        stats = self.stats[seat]
        stats.descriptions += 1
        word = self.setup.word(seat)
        if not text or mentions_word(text, word):
            stats.leaks += 1
            if self.hide_leaks or not text:
                text = "***" if text else "(no description)"
        self.transcript.append(f"Player {seat}: {text}")
        return text

    def vote(self, seat: int, reply: str) -> Vote:
        """Record and return ``seat``'s parsed vote (invalid votes are counted and ignored)."""
        vote = parse_vote(reply, voter=seat, alive=self.alive)
        self.stats[seat].votes += 1
        if not vote.valid:
            self.stats[seat].invalid_votes += 1
        return vote

    def resolve(self, votes: Mapping[int, Vote]) -> int | None:
        """Eliminate the single most-voted player, announce the result, and return the seat (or None on a tie)."""
        counted = {voter: vote.target if vote.valid else None for voter, vote in votes.items()}
        shown = votes_line(counted)
        out = majority(counted.values(), ties_to_lowest=False)
        if out is not None:
            self.alive.remove(out)
            self.eliminated.append(out)
            self.transcript.append(f"Votes: {shown}. Player {out} is eliminated.")
        else:
            self.transcript.append(f"Votes: {shown}. Tie or no valid votes: nobody is eliminated.")
        return out

    def winner(self) -> Role | None:
        """The winning team if the game is over (see module rules), else ``None``."""
        spies = sum(1 for s in self.alive if self.setup.role(s) == Role.SPY)
        won = hidden_team_won(spies, len(self.alive), out_of_time=self.round >= self.setup.max_rounds)
        return None if won is None else Role.SPY if won else Role.CIVILIAN


RULES = (
    "You are playing the party game 'Who is the spy' with {n} players (Players {seats}). Most players "
    "share the same secret word; {spies} spy player(s) got a different but similar word. Nobody knows "
    "who has which word. Each round every player describes their word in one short sentence without "
    "saying the word itself, then everyone votes to eliminate the player they think is a spy. "
    "Civilians win when all spies are out; spies win by surviving.\n"
    "You are Player {seat}. Your secret word is: {word}.{role_line}"
)
DESCRIBE_PROMPT = (
    "Round {round}. Your turn: describe your word in one short sentence. Never say the word itself."
)
VOTE_PROMPT = "Round {round} voting. Which player is the spy? Choose one: {candidates}.\nAnswer:"
"""The vote instruction: a closed question ending in an answer cue, which the embedded 135M model
answered readably more often than "Reply with the player number only." (templates/who_is_the_spy/
README.md, "Defaults from pilots")."""


def system_prompt(setup: GameSetup, seat: int, tell_roles: bool) -> str:
    """The rules and ``seat``'s secret word (and its role when ``tell_roles``)."""
    role_line = f" You are a {setup.role(seat).value}." if tell_roles else ""
    return RULES.format(
        n=setup.n_players,
        seats=", ".join(map(str, setup.seats)),
        spies=len(setup.spy_seats),
        seat=seat,
        word=setup.word(seat),
        role_line=role_line,
    )


async def play(
    setup: GameSetup,
    players: Mapping[int, Player[Phase]],
    *,
    tell_roles: bool = False,
    hide_leaks: bool = True,
) -> GameRecord:
    """Play one full game.

    Args:
        setup: Words, seats and round limit.
        players: One player per seat (``1..n_players``).
        tell_roles: Tell each player its role in the system prompt.
        hide_leaks: Show a description that says its speaker's word as ``***`` (the default); with
            ``False`` it is shown as said, so leaking the word tells the other players one's word.

    Returns:
        The game record (winner, eliminations, compliance stats, transcript, histories).

    Raises:
        ValueError: ``players`` does not cover exactly the seats.
    """
    table = Table({seat: system_prompt(setup, seat, tell_roles) for seat in setup.seats}, players)
    game = Game(setup, hide_leaks=hide_leaks)
    winner = None
    while winner is None:
        game.round += 1
        for seat in list(game.alive):
            instruction = DESCRIBE_PROMPT.format(round=game.round)
            game.describe(seat, await table.ask(seat, game.transcript, instruction, Phase.DESCRIBE))

        def vote_prompt(seat: int) -> str:
            candidates = ", ".join(str(s) for s in game.alive if s != seat)
            return VOTE_PROMPT.format(round=game.round, candidates=candidates)

        replies = await table.ask_each(list(game.alive), game.transcript, vote_prompt, Phase.VOTE)
        game.resolve({seat: game.vote(seat, reply) for seat, reply in replies.items()})
        winner = game.winner()
    return GameRecord(
        setup=setup,
        winner=winner,
        rounds=game.round,
        eliminated=game.eliminated,
        stats=game.stats,
        transcript=game.transcript,
        histories=table.transcripts(),
    )
