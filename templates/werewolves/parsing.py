"""Robust reading of werewolves player output: targets ("I vote for player 3", "3", "Player three"),
witch decisions ("save", "poison 2", "pass"), and a werewolf revealing its role in public.

Each reader either returns a clean value or says why it could not, so the game can count the move as an
invalid action (and the reward can penalise it) instead of guessing.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from templates._game.parsing import NUMBER_WORDS as _NUMBER_WORDS
from templates._game.parsing import Choice
from templates.answers import strip_thinking

MAX_SPEECH_CHARS = 300
"""Public speeches are cut to this many characters."""

_NUMBER_WORD_RE = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b")
_PLAYER = re.compile(r"\b(?:player|p|seat)\s*#?\s*(\d+)\b")
_INTEGER = re.compile(r"(?<!\d)(?<!\d\.)(\d+)(?!\d)(?!\.\d)")
"""A whole number, not part of a decimal ("3", "3.", "(3)"; not the 3 of "3.5" or "2.3")."""
_CLOCK = re.compile(r"\b(?:night|day)\s*#?\s*\d+\b")
"""A game-clock phrase echoed from the prompt ("Night 1.", "Day 2 vote"): its number is not a player."""
_PASS = re.compile(r"^\W*(?:no|none|nobody|pass|skip|nothing|no one)\b")
_REVEAL = re.compile(
    r"\b(?:i\s*am|i'm|im|i\s+was)\s+(?:a\s+|the\s+|one\s+of\s+the\s+)?(?:were)?wol(?:f|ves)\b"
    r"|\bas\s+(?:a|the)\s+(?:were)?wolf\b"
    r"|\bmy\s+role\s+is\s+(?:a\s+|the\s+)?(?:were)?wolf\b"
    r"|\bwe\s+(?:are\s+)?(?:the\s+)?(?:were)?wolves\b"
)


class TargetStatus(StrEnum):
    """How a target was read."""

    VALID = "valid"
    """An allowed living player."""
    UNPARSED = "unparsed"
    """No single player could be read (empty, no number, several candidates)."""
    NOT_ALLOWED = "not_allowed"
    """The named player exists but may not be chosen (oneself, a dead player, a fellow werewolf…)."""


class Target(Choice):
    """A parsed choice of one player (its ``status`` a `TargetStatus`; ``seat`` set unless ``UNPARSED``)."""


def _normalise(text: str) -> str:
    text = strip_thinking(text).lower()
    return _NUMBER_WORD_RE.sub(lambda m: str(_NUMBER_WORDS[m.group(1)]), text)


def parse_target(text: str, allowed: Collection[int], seats: Collection[int]) -> Target:
    """Read one player out of ``text``.

    A number after "player"/"p"/"seat" wins; else the text must hold exactly one distinct integer.
    Several distinct candidates, or none, are ``UNPARSED``. A game-clock phrase echoed from the prompt
    ("Night 1, Player 3", "Day 2: 4") is not a candidate, and a number ending a sentence counts ("3.").

    Args:
        text: The model's reply.
        allowed: Seats that may be chosen now.
        seats: Every seat of the game (a named seat outside it is ``UNPARSED``).

    Returns:
        The parsed target.
    """
    body = _CLOCK.sub(" ", _normalise(text))
    named = {int(m) for m in _PLAYER.findall(body)} or {int(m) for m in _INTEGER.findall(body)}
    named &= set(seats)
    if len(named) != 1:
        return Target(TargetStatus.UNPARSED)
    (seat,) = named
    return Target(TargetStatus.VALID if seat in allowed else TargetStatus.NOT_ALLOWED, seat)


@dataclass(frozen=True)
class WitchMove:
    """The witch's night: save the victim, and/or poison one player (each potion once per game)."""

    save: bool = False
    poison: Target | None = None
    """``None``: no poison used."""
    valid: bool = True
    """False when the reply could not be read or used a potion it no longer has."""


def parse_witch(
    text: str, *, can_save: bool, can_poison: bool, allowed: Collection[int], seats: Collection[int]
) -> WitchMove:
    """Read the witch's reply: ``save``, ``poison N``, both (``save, poison 3``), or ``pass``.

    Returns:
        The move; using a spent potion, or poisoning an unreadable/forbidden player, is invalid (and
        then nothing is used).
    """
    body = _normalise(text)
    if _PASS.search(body) and "save" not in body and "poison" not in body:
        return WitchMove()
    save = bool(re.search(r"\bsav(?:e|ing)\b|\bheal\b", body))
    poison: Target | None = None
    if re.search(r"\bpoison", body):
        poison = parse_target(body.split("poison", 1)[1], allowed, seats)
    if not save and poison is None:
        return WitchMove(valid=False)
    if (save and not can_save) or (poison is not None and (not can_poison or not poison.valid)):
        return WitchMove(valid=False)
    return WitchMove(save=save, poison=poison)


def reveals_werewolf(text: str) -> bool:
    """Whether ``text`` says its speaker is a werewolf ("I am a werewolf", "as the wolf", "we wolves")."""
    return bool(_REVEAL.search(strip_thinking(text).lower()))


def clean_speech(text: str) -> str:
    """The public form of a speech: no thinking block, one line, at most `MAX_SPEECH_CHARS`."""
    return " ".join(strip_thinking(text).split())[:MAX_SPEECH_CHARS]
