"""Arithmetic reward: 1.0 when the reply's single number equals the answer, else 0.0.

The answer is read by :func:`templates.answers.extract_short_number`: a boxed answer if any, else the
first visible line (text after its last ``=``), which must hold exactly one number. So ``7``,
``The answer is 7.``, ``3 + 4 = 7`` and ``\\boxed{7}`` are read as 7, while listing numbers
(``6 7 8``), empty replies, answers only inside ``<think>`` and replies over ``max_completion_chars``
earn 0. Numbers compare exactly as integers (``7.0`` equals ``7``; ``7.5`` does not).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from templates.answers import AnswerStatus, extract_short_number

MAX_COMPLETION_CHARS = 400
"""Replies longer than this (characters) earn 0."""


def reward(completion: str, answer: str, *, max_completion_chars: int = MAX_COMPLETION_CHARS) -> float:
    """Score one reply.

    Args:
        completion: Model output.
        answer: Reference integer as a string (e.g. ``"7"``).
        max_completion_chars: Longer replies earn 0.

    Returns:
        ``1.0`` when correct, else ``0.0``.
    """
    extraction = extract_short_number(completion, max_completion_chars=max_completion_chars)
    if extraction.status != AnswerStatus.OK or extraction.answer is None:
        return 0.0
    try:
        return 1.0 if Decimal(extraction.answer) == Decimal(answer) else 0.0
    except InvalidOperation:  # a boxed answer that is not a plain number
        return 0.0


def gold_completion(task: dict[str, Any]) -> str:
    """A reply that must earn full reward on ``task``."""
    return str(task["answer"])


GARBAGE = (
    "",
    "   \n  ",
    "I don't know",
    "ANSWER1",
    "ANSWER1 ANSWER ANSWER2",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 ANSWER",
    "<think>ANSWER</think>",
    "<think>The answer is ANSWER",
    "\\boxed{ANSWER} \\boxed{ANSWER1}",
    "ANSWER" + " " * 500,
)
"""Replies that must earn 0 (``ANSWER`` → the answer, ``ANSWER1``/``ANSWER2`` → answer+1/+2)."""


def self_check(tasks: list[dict[str, Any]]) -> list[str]:
    """Gold replies earn 1 and :data:`GARBAGE` earns 0 on each task; returns failure messages."""
    failures = []
    for task in tasks:
        answer = str(task["answer"])
        if reward(gold_completion(task), answer) != 1.0:
            failures.append(f"{task['id']}: gold reply earned less than 1")
        for text in GARBAGE:
            bad = (
                text.replace("ANSWER1", str(int(answer) + 1))
                .replace("ANSWER2", str(int(answer) + 2))
                .replace("ANSWER", answer)
            )
            if reward(bad, answer) != 0.0:
                failures.append(f"{task['id']}: garbage {bad[:40]!r} earned reward")
    return failures
