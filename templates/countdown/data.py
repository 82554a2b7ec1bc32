"""Data builder of the countdown template: solvable puzzles generated from (seed, sizes, index).

Puzzle ``i`` draws ``n_numbers`` numbers from 1..``max_number`` and combines them, in a random order and
with random operators, into a solution expression whose value (the target) is a positive integer; draws
that give a non-integer or non-positive value are redrawn from the same per-index generator
``random.Random(f"countdown:{seed}:{n_numbers}:{max_number}:{i}")``, so any slice regenerates alone.
Each task: ``{"id", "numbers": [..], "target": int, "solution": "(3 + 5) * 2"}``.

Usage: ``python data.py --out tasks.jsonl [--n-numbers 3] [--max-number 20] [--n-tasks 512] [--seed 0]``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from templates import _tasks

_APPLY: dict[str, Callable[[Fraction, Fraction], Fraction | None]] = {
    "+": lambda x, y: x + y,
    "-": lambda x, y: x - y,
    "*": lambda x, y: x * y,
    "/": lambda x, y: x / y if y != 0 else None,
}


def make_task(index: int, n_numbers: int = 3, max_number: int = 20, seed: int = 0) -> dict[str, Any]:
    """Puzzle ``index`` of the stream (see module docstring).

    Raises:
        ValueError: Sizes out of range or negative index.
    """
    if not 2 <= n_numbers <= 6 or max_number < 2 or index < 0:
        raise ValueError(
            f"need 2 <= n_numbers <= 6, max_number >= 2, index >= 0; got {n_numbers}, {max_number}, {index}"
        )
    rng = random.Random(f"countdown:{seed}:{n_numbers}:{max_number}:{index}")
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(n_numbers)]
        order = rng.sample(numbers, len(numbers))
        expression, value = str(order[0]), Fraction(order[0])
        for number in order[1:]:
            op = rng.choice("+-*/")
            result = _APPLY[op](value, Fraction(number))
            if result is None:
                break
            expression, value = f"({expression} {op} {number})", result
        else:
            if value.denominator == 1 and value > 0 and value != max(numbers):
                break
    if expression.startswith("(") and expression.endswith(")"):
        expression = expression[1:-1]
    return {
        "id": f"countdown-n{n_numbers}-m{max_number}-s{seed}-{index:06d}",
        "numbers": sorted(numbers),
        "target": int(value),
        "solution": expression,
    }


def build(
    n_numbers: int = 3, max_number: int = 20, n_tasks: int = 512, seed: int = 0
) -> list[dict[str, Any]]:
    """Puzzles ``0..n_tasks-1`` of the stream (see :func:`make_task`)."""
    if n_tasks < 1:
        raise ValueError(f"n_tasks must be >= 1, got {n_tasks}")
    return [make_task(i, n_numbers, max_number, seed) for i in range(n_tasks)]


def main(argv: list[str] | None = None) -> None:
    """Command line entry point (see module docstring)."""
    _tasks.main(__doc__ or "", build, argv)


if __name__ == "__main__":
    main()
