"""Math answer reward: one boxed final answer checked against the reference with math-verify.

Normalisation: the final answer is taken by :func:`templates.answers.extract_final_answer` (think blocks
ignored, a single distinct ``\\boxed{}`` answer, else a GSM8K ``#### N`` marker as in nanochat
``tasks/gsm8k.py`` ``extract_answer``), then compared with the reference by math-verify
(``parse``/``verify``: numeric, fraction and LaTeX equivalence, so ``\\frac{408}{2}`` equals ``204``).
Sets, lists and "a or b" answers never equal a single reference value, so listing candidates fails.
"""

from __future__ import annotations

import threading
from typing import Any

from math_verify import parse, verify

from templates.answers import AnswerStatus, extract_final_answer

MAX_COMPLETION_CHARS = 20_000
"""Completions longer than this (characters) earn 0 without parsing."""


def _timeout() -> int | None:
    # math-verify enforces timeouts with signal.alarm, which only works in the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


def is_equivalent(prediction: str, answer: str) -> bool:
    """Whether the LaTeX/number ``prediction`` equals the reference ``answer`` (math-verify).

    Args:
        prediction: Extracted answer text (no box), e.g. ``"\\frac{1}{2}"``.
        answer: Reference answer, e.g. ``"0.5"`` or ``"204"``.

    Returns:
        ``True`` when math-verify finds them equivalent; ``False`` on any parse failure.
    """
    try:
        gold = parse(f"${answer}$", parsing_timeout=_timeout())
        pred = parse(f"\\boxed{{{prediction}}}", parsing_timeout=_timeout())
        return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=_timeout()))
    except Exception:  # math-verify raises on timeouts and odd inputs: an unscorable answer is wrong
        return False


def reward(completion: str, answer: str, *, max_completion_chars: int = MAX_COMPLETION_CHARS) -> float:
    """1.0 when the completion's single final answer equals ``answer``, else 0.0.

    Args:
        completion: Model output (may contain ``<think>`` blocks).
        answer: Reference answer (string; AIME integers, GSM8K numbers or LaTeX).
        max_completion_chars: Longer completions earn 0.

    Returns:
        ``1.0`` or ``0.0``.
    """
    extraction = extract_final_answer(completion, max_completion_chars=max_completion_chars)
    if extraction.status != AnswerStatus.OK or extraction.answer is None:
        return 0.0
    return 1.0 if is_equivalent(extraction.answer, answer) else 0.0


def gold_completion(task: dict[str, Any]) -> str:
    """A completion that must earn full reward on ``task`` (used by :func:`self_check`)."""
    return f"Working it out carefully.\nThe final answer is $\\boxed{{{task['answer']}}}$."


GARBAGE = (
    "",
    "I don't know.",
    "\\boxed{}",
    "\\boxed{-1} \\boxed{-2}",
    "<think>\\boxed{ANSWER}</think> I am not sure.",
    "<think> the answer is \\boxed{ANSWER}",
    "\\boxed{ANSWER} or maybe \\boxed{ANSWER1}",
    "\\boxed{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ANSWER, ANSWER1}",
    "ANSWER " * 5000,
)
"""Outputs that must earn 0 (``ANSWER`` is replaced by the reference, ``ANSWER1`` by reference+1)."""


def self_check(tasks: list[dict[str, Any]]) -> list[str]:
    """Check that gold completions earn 1 and :data:`GARBAGE` earns 0 on each task.

    Returns:
        Failure messages (empty when all checks pass).
    """
    failures = []
    for task in tasks:
        answer = str(task["answer"])
        if reward(gold_completion(task), answer) != 1.0:
            failures.append(f"{task['id']}: gold completion earned less than 1")
        alt = str(int(answer) + 1) if answer.lstrip("-").isdigit() else f"{answer}+1"
        for text in GARBAGE:
            bad = text.replace("ANSWER1", alt).replace("ANSWER", answer)
            if reward(bad, answer) != 0.0:
                failures.append(f"{task['id']}: garbage {bad[:40]!r} earned reward")
    return failures
