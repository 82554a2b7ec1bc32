"""Final-answer extraction from model text, shared by the answer-checking templates.

Rules (each guards against a way of gaming a checker):

* Text inside ``<think>...</think>`` is ignored; an unclosed ``<think>`` hides everything after it, so
  an answer written only while "thinking" earns nothing.
* ``\\boxed{...}`` / ``\\fbox{...}`` contents are read with balanced braces. Several boxes are allowed
  only if they all hold the same answer; different boxed answers are *ambiguous* (no answer).
* GSM8K-style ``#### 42`` markers follow the official normalisation (strip, drop thousands commas), as
  in nanochat ``tasks/gsm8k.py`` ``extract_answer``, itself following
  https://github.com/openai/grade-school-math/blob/3101c7d5072418e28b9008a6636bde82a006892c/grade_school_math/dataset.py#L28
* Over-long completions and over-long answers are rejected before any parsing, so a huge output can
  neither list every number nor make the parser slow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM_MARKER = re.compile(r"#### (\-?[0-9\.\,]+)")  # nanochat tasks/gsm8k.py GSM_RE
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

MAX_ANSWER_CHARS = 100
"""Longest accepted final answer, in characters (longer ones are treated as listing/gaming)."""


class AnswerStatus(StrEnum):
    """Outcome of extracting a final answer from a completion."""

    OK = "ok"
    """Exactly one final answer was found."""
    MISSING = "missing"
    """No final answer in the expected format."""
    AMBIGUOUS = "ambiguous"
    """Several different final answers (e.g. two boxes with different contents)."""
    TOO_LONG = "too_long"
    """The completion or the answer exceeds its length limit."""


@dataclass(frozen=True)
class Extraction:
    """A final answer and how it was found."""

    status: AnswerStatus
    """Whether an answer was found, and if not why."""
    answer: str | None = None
    """The answer text (without the surrounding box or marker) when ``status`` is ``OK``."""


def strip_thinking(text: str) -> str:
    """Remove ``<think>...</think>`` blocks; an unclosed ``<think>`` drops everything after it.

    Args:
        text: Model output.

    Returns:
        The visible text.
    """
    visible = _THINK_BLOCK.sub(" ", text)
    opened = _THINK_OPEN.search(visible)
    return visible[: opened.start()] if opened else visible


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, braces balanced, in order.

    An unbalanced box (no closing brace) is skipped.
    """
    found: list[str] = []
    for match in _BOX_OPEN.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[start:i].strip())
                    break
    return found


def gsm8k_marker(text: str) -> str | None:
    """The number after the last ``#### `` marker, commas removed (nanochat ``extract_answer``)."""
    matches = _GSM_MARKER.findall(text)
    return matches[-1].strip().replace(",", "") if matches else None


def extract_final_answer(
    completion: str, *, max_completion_chars: int = 20_000, allow_gsm8k_marker: bool = True
) -> Extraction:
    """Find the single final answer of a completion (boxed first, then a GSM8K ``####`` marker).

    Args:
        completion: Raw model output.
        max_completion_chars: Completions longer than this are rejected (``TOO_LONG``).
        allow_gsm8k_marker: Accept ``#### 42`` when there is no box.

    Returns:
        The extraction (status and answer).
    """
    if len(completion) > max_completion_chars:
        return Extraction(AnswerStatus.TOO_LONG)
    visible = strip_thinking(completion)
    boxes = [b for b in boxed_contents(visible) if b]
    if boxes:
        distinct = {re.sub(r"\s+", "", b) for b in boxes}
        if len(distinct) > 1:
            return Extraction(AnswerStatus.AMBIGUOUS)
        answer = boxes[-1]
    else:
        marker = gsm8k_marker(visible) if allow_gsm8k_marker else None
        if marker is None:
            return Extraction(AnswerStatus.MISSING)
        answer = marker
    if len(answer) > MAX_ANSWER_CHARS:
        return Extraction(AnswerStatus.TOO_LONG)
    return Extraction(AnswerStatus.OK, answer)


def extract_short_number(completion: str, *, max_completion_chars: int = 400) -> Extraction:
    """Read a bare numeric answer from a short reply (for small models that skip the box).

    Order: a boxed answer if present (see :func:`extract_final_answer`); else the first non-empty
    visible line, where text after the last ``=`` is preferred (``3 + 4 = 7`` → ``7``). That part
    must contain exactly one number; a list of numbers (``5 6 7 8``) is ``AMBIGUOUS``.

    Args:
        completion: Raw model output.
        max_completion_chars: Longer completions are ``TOO_LONG``.

    Returns:
        The extraction; ``answer`` is the number as written (e.g. ``"-12"``, ``"3.5"``).
    """
    boxed = extract_final_answer(
        completion, max_completion_chars=max_completion_chars, allow_gsm8k_marker=False
    )
    if boxed.status != AnswerStatus.MISSING:
        return boxed
    visible = strip_thinking(completion)
    lines = [line.strip() for line in visible.splitlines() if line.strip()]
    if not lines:
        return Extraction(AnswerStatus.MISSING)
    line = lines[0].replace(",", "")  # thousands separators, as in the GSM8K normalisation
    tail = line.rsplit("=", 1)[-1]
    numbers = _NUMBER.findall(tail)
    if not numbers:
        return Extraction(AnswerStatus.MISSING)
    if len(set(numbers)) > 1:
        return Extraction(AnswerStatus.AMBIGUOUS)
    return Extraction(AnswerStatus.OK, numbers[0])
