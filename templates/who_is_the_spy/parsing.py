"""Robust reading of player output: public descriptions, votes and own-word leaks.

Model output is messy ("I vote for player 3!", "3", "Player three", a paragraph naming several
players). Each reader either returns a clean value or says why it could not, so the game can treat
the move as invalid (and the reward can penalise it) instead of guessing.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection
from enum import StrEnum

from templates._game.parsing import NUMBER_WORDS as _NUMBER_WORDS
from templates._game.parsing import Choice
from templates.answers import strip_thinking

MAX_DESCRIPTION_CHARS = 200
"""Public descriptions are cut to this many characters."""

_WORDS = "|".join(_NUMBER_WORDS)
_PLAYER_WORD = re.compile(rf"\b(player|p)\s+({_WORDS})\b")
_LONE_NUMBER_WORD = re.compile(rf"\W*({_WORDS})\W*")
_LEADING_NUMBER_WORD = re.compile(rf"^\W*({_WORDS})(?=\s*[,.!:;)])")
_NUMBER_WORD = re.compile(rf"\b({_WORDS})\b")
_SEAT = r"(?:player|p|#|no\.?|number)?\s*#?\s*(\d+)\b"
_EXPLICIT = (
    re.compile(r"\bvot(?:e|ed|ing)\b\s*(?:for|:|is|=|-)?\s*" + _SEAT),
    re.compile(r"\bspy\s*(?:is|=|:|-)\s*" + _SEAT),
    re.compile(r"\b(?:player|p)\s*#?\s*(\d+)\s+is\s+(?:the\s+|a\s+)?spy\b"),
    re.compile(r"\banswer\s*(?:is|:|=|-)\s*" + _SEAT),
)
_PLAYER_MENTION = re.compile(r"\b(?:player|p)\s*#?\s*(\d+)\b")
_INTEGER = re.compile(r"(?<![\d.])(\d+)(?!\d|\.\d)")
_ALTERNATIVES = re.compile(r"(\d+)\s*(?:,|/|&|\bor\b|\band\b)\s*(?:player|p)?\s*#?\s*(\d+)")
_LABEL = re.compile(r"^\W*(?:player|p)\s*#?\s*(\d+)\s*:\s*(?=\S)")
_SPEAKER_PREFIX = re.compile(
    r"^\s*(?:\*\*)?(?:player\s*\d+|description|my description|answer)\s*(?:\*\*)?\s*[:\-–]\s*", re.I
)


class VoteStatus(StrEnum):
    """How a vote was read."""

    VALID = "valid"
    """A living player other than the voter."""
    UNPARSED = "unparsed"
    """No single player could be read from the text (empty, no number, several candidates)."""
    SELF = "self"
    """The voter named themself."""
    NOT_ALIVE = "not_alive"
    """The named player does not exist or was already eliminated."""


class Vote(Choice):
    """A parsed vote (its ``status`` a `VoteStatus`; the seat voted for is set for every status except
    ``UNPARSED``)."""

    @property
    def target(self) -> int | None:
        """The seat voted for."""
        return self.seat


def normalise(text: str) -> str:
    """Lower-case, accents removed (NFKD), whitespace collapsed."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return re.sub(r"\s+", " ", plain).strip().lower()


def read_seat(text: str, voter: int | None = None) -> int | None:
    """The one seat number a vote text names, or ``None`` when there is none or several.

    Read in this order, each stage deciding when it finds anything:

    1. explicit votes: "vote (for) (player) N", "the spy is (player) N", "player N is the spy",
       "answer: N"; they must all name the same seat;
    2. "player N" mentions ("P2", "#2" count; "Player three" reads as 3): exactly one distinct seat;
    3. bare integers ("2", "2.", "The answer, 2"): exactly one distinct integer, and no other number
       written as a word ("Two, 3" is ambiguous; decimals such as "1.5" are not seats).

    Two different seats side by side ("2 or 3", "player 2 and player 3", "2, 3") are ambiguous
    wherever they stand. A number word counts only when it is the whole reply ("three") or opens it before a punctuation
    mark ("Two, no doubt."), so "Which one?" is no vote for player 1. A leading "Player K:" label followed by text imitates the transcript: the voter's
    own label is dropped ("Player 3: 2" from seat 3 reads as 2); another seat's label is a vote for K
    only when the rest names K or nothing else, ("Player 2: player 2"), else ambiguous ("Player 2: 1")
    or a description, not a vote ("Player 2: a red fruit").

    Args:
        text: The voter's raw reply.
        voter: The voter's seat (``None``: every leading label is taken as the speaker's own).
    """
    visible = normalise(strip_thinking(text))
    label = _LABEL.match(visible)
    if label is None:
        return _named_seat(visible)
    seat = _named_seat(visible[label.end() :])
    labelled = int(label.group(1))
    if voter is None or labelled == voter or seat == labelled:
        return seat
    return None


def _named_seat(visible: str) -> int | None:
    """:func:`read_seat` on normalised text with no leading label."""
    lone = _LONE_NUMBER_WORD.fullmatch(visible)
    if lone:
        return _NUMBER_WORDS[lone.group(1)]
    visible = _LEADING_NUMBER_WORD.sub(lambda m: str(_NUMBER_WORDS[m.group(1)]), visible)
    visible = _PLAYER_WORD.sub(lambda m: f"{m.group(1)} {_NUMBER_WORDS[m.group(2)]}", visible)
    if any(a != b for a, b in _ALTERNATIVES.findall(visible)):
        return None
    explicit = {int(n) for pattern in _EXPLICIT for n in pattern.findall(visible)}
    if explicit:
        return explicit.pop() if len(explicit) == 1 else None
    mentioned = {int(n) for n in _PLAYER_MENTION.findall(visible)}
    if mentioned:
        return mentioned.pop() if len(mentioned) == 1 else None
    numbers = {int(n) for n in _INTEGER.findall(visible)}
    words = {_NUMBER_WORDS[w] for w in _NUMBER_WORD.findall(visible)}
    if len(numbers) == 1 and words <= numbers:
        return numbers.pop()
    return None


def parse_vote(text: str, *, voter: int, alive: Collection[int]) -> Vote:
    """Read a vote and check it against the rules.

    Args:
        text: The voter's raw reply.
        voter: The voter's seat.
        alive: Seats still in the game.

    Returns:
        The vote with its status.
    """
    seat = read_seat(text, voter)
    if seat is None:
        return Vote(VoteStatus.UNPARSED)
    if seat == voter:
        return Vote(VoteStatus.SELF, seat)
    if seat not in alive:
        return Vote(VoteStatus.NOT_ALIVE, seat)
    return Vote(VoteStatus.VALID, seat)


def clean_description(text: str, *, max_chars: int = MAX_DESCRIPTION_CHARS) -> str:
    """The public part of a description: first visible non-empty line, speaker prefix removed, capped.

    Args:
        text: The player's raw reply.
        max_chars: Longest public description.

    Returns:
        The description (may be empty when the reply had no visible text).
    """
    for line in strip_thinking(text).splitlines():
        line = _SPEAKER_PREFIX.sub("", line).strip().strip('"').strip()
        if line:
            return re.sub(r"\s+", " ", line)[:max_chars]
    return ""


def mentions_word(text: str, word: str) -> bool:
    """Whether ``text`` says ``word`` (the rule "never say your own word").

    Caught: the word in any case or accent form, with a plural ending (``apples``), inside a compound
    written as one word only when it stands alone (``apple-pie`` counts, ``pineapple`` does not), and
    spelled out with separators (``a-p-p-l-e``, ``a p p l e``). Multi-word words match with any spacing.

    Args:
        text: Public text.
        word: The secret word.

    Returns:
        ``True`` when the word is said.
    """
    norm_text, norm_word = normalise(text), normalise(word)
    if not norm_word:
        return False
    phrase = r"\s*".join(re.escape(part) for part in norm_word.split())
    if re.search(rf"(?<![a-z0-9]){phrase}(?:s|es)?(?![a-z0-9])", norm_text):
        return True
    letters = [c for c in norm_word if c.isalnum()]
    if len(letters) >= 3:
        spelled = r"[\W_]+".join(re.escape(c) for c in letters)
        if re.search(rf"(?<![a-z0-9]){spelled}(?![a-z0-9])", norm_text):
            return True
    return False
