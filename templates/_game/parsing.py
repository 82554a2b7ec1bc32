"""What the games' readers of player output share: number words and a parsed choice of one seat.

Each game reads its own moves (a spy vote, a werewolf's night target, the witch's potions) and returns
a :class:`Choice`: a clean seat or why none could be taken, so the game can count the move as invalid
(and the reward can penalise it) instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}  # fmt: skip
"""Seat numbers a player may write as a word (up to the largest game, 12 seats)."""


@dataclass(frozen=True)
class Choice:
    """A parsed choice of one seat."""

    status: StrEnum
    """How it was read: the game's status enum, whose ``"valid"`` member means the choice counts."""
    seat: int | None = None
    """The seat named (``None`` when no single seat could be read)."""

    @property
    def valid(self) -> bool:
        """Whether the choice counts."""
        return self.status.value == "valid"
