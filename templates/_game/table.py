"""Seats, agent names, chat histories and vote counting of a multi-agent game.

Each player keeps its own chat history (system prompt, then one user message per turn carrying only
what it saw since its last turn, and its own replies verbatim), so histories are append-only and the
server merges a player's calls by token prefix. Players are any async callables (LLM-backed in the
workflow, scripted in tests).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

Message = dict[str, str]
"""One chat message: ``{"role": ..., "content": ...}``."""

PhaseT = TypeVar("PhaseT", bound=StrEnum, contravariant=True)


class Player(Protocol[PhaseT]):
    """Anything that answers a chat history (``messages`` ends with a user turn) with text."""

    async def __call__(self, messages: list[Message], phase: PhaseT) -> str:
        """Return the reply text for ``messages``; ``phase`` says what is asked (the workflow sizes the
        reply's token limit by it)."""
        ...


def agent_name(role: StrEnum, rank: int) -> str:
    """The agent name ``"<role>_<rank>"`` sent as the OpenAI ``user`` (``spy_1``, ``werewolf_1``).

    ``rank`` counts players of that role in seat order from 1, so the names depend only on the game's
    role counts, never on the (random) seating: a run names its trainable agents once for every task.
    """
    return f"{role.value}_{rank}"


def role_names(role: str, count: int) -> list[str]:
    """The agent names of ``count`` players of ``role``: ``role_1`` .. ``role_<count>``."""
    return [f"{role}_{k}" for k in range(1, count + 1)]


class Seating(ABC):
    """Seats ``1..n`` of a game setup and their agent names; a setup defines ``n_seats`` and ``role``."""

    @property
    @abstractmethod
    def n_seats(self) -> int:
        """Number of seats."""

    @abstractmethod
    def role(self, seat: int) -> StrEnum:
        """The role of ``seat``."""

    @property
    def seats(self) -> list[int]:
        """All seats in order."""
        return list(range(1, self.n_seats + 1))

    def agent(self, seat: int) -> str:
        """The agent name of ``seat`` (see :func:`agent_name`)."""
        role = self.role(seat)
        return agent_name(role, sum(1 for s in range(1, seat + 1) if self.role(s) == role))


def hidden_team_won(hidden: int, alive: int, *, out_of_time: bool) -> bool | None:
    """The outcome of a game of a hidden minority (spies, werewolves) against the others.

    Args:
        hidden: Living members of the hidden team.
        alive: Living players.
        out_of_time: The last round (day) has been played.

    Returns:
        ``False`` when no hidden player is left, ``True`` when they are at least as many as the others
        or time ran out, ``None`` while the game goes on.
    """
    if hidden == 0:
        return False
    if hidden >= alive - hidden or out_of_time:
        return True
    return None


def majority(choices: Iterable[int | None], *, ties_to_lowest: bool) -> int | None:
    """The most chosen seat (``None`` choices are invalid and not counted); on a tie the lowest seat
    (``ties_to_lowest``) or nobody; ``None`` when nothing was chosen."""
    ranked = Counter(c for c in choices if c is not None).most_common()
    if not ranked:
        return None
    top = [seat for seat, n in ranked if n == ranked[0][1]]
    if len(top) == 1 or ties_to_lowest:
        return min(top)
    return None


def votes_line(votes: Mapping[int, int | None]) -> str:
    """The public tally, ``"Player 1 -> 3, Player 2 -> invalid"`` (voters in seat order; ``None``: invalid)."""
    return ", ".join(
        f"Player {voter} -> {target if target is not None else 'invalid'}"
        for voter, target in sorted(votes.items())
    )


class History:
    """One player's append-only history plus how much of the public transcript it has seen."""

    def __init__(self, system: str) -> None:
        self.messages: list[Message] = [{"role": "system", "content": system}]
        self.seen = 0

    def prompt(
        self, transcript: list[str], instruction: str, private: list[str] | None = None
    ) -> list[Message]:
        """Append a user turn: the public events since this player's last turn, then what it alone
        learnt (``private``, emptied), then ``instruction``; return the whole history."""
        news = transcript[self.seen :] + (private or [])
        self.seen = len(transcript)
        if private:
            private.clear()
        content = ("\n".join(news) + "\n\n" if news else "") + instruction
        self.messages.append({"role": "user", "content": content})
        return list(self.messages)

    def reply(self, text: str) -> None:
        """Append the player's reply, verbatim: the server merges its calls by exact token prefix."""
        self.messages.append({"role": "assistant", "content": text})


class Table(Generic[PhaseT]):
    """The players of one game and their histories: asks a seat and records its reply."""

    def __init__(self, systems: Mapping[int, str], players: Mapping[int, Player[PhaseT]]) -> None:
        """Seat a player at each seat of ``systems`` (seat → its system prompt).

        Raises:
            ValueError: ``players`` does not cover exactly the seats.
        """
        if sorted(players) != sorted(systems):
            raise ValueError(f"players must be given for seats {sorted(systems)}, got {sorted(players)}")
        self.players = players
        self.histories = {seat: History(system) for seat, system in systems.items()}

    async def ask(
        self,
        seat: int,
        transcript: list[str],
        instruction: str,
        phase: PhaseT,
        private: list[str] | None = None,
    ) -> str:
        """Prompt ``seat`` (see `History.prompt`), await its player's reply and record it."""
        history = self.histories[seat]
        reply = await self.players[seat](history.prompt(transcript, instruction, private), phase)
        history.reply(reply)
        return reply

    async def ask_each(
        self,
        seats: Sequence[int],
        transcript: list[str],
        instruction: Callable[[int], str],
        phase: PhaseT,
        private: Mapping[int, list[str]] | None = None,
    ) -> dict[int, str]:
        """Ask ``seats`` at once (a vote, the werewolves' night choice): seat → reply, in seat order."""

        async def one(seat: int) -> str:
            mine = private[seat] if private is not None else None
            return await self.ask(seat, transcript, instruction(seat), phase, mine)

        replies = await asyncio.gather(*(one(seat) for seat in seats))
        return dict(zip(seats, replies, strict=True))

    def transcripts(self) -> dict[int, list[Message]]:
        """Each seat's full chat history."""
        return {seat: history.messages for seat, history in self.histories.items()}
