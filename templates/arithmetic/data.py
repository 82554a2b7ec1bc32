"""Data builder of the arithmetic template: questions generated from (seed, level, index).

Task ``i`` is drawn from ``random.Random(f"arithmetic:{seed}:{level}:{i}")``, so any slice of the
dataset can be regenerated alone (runs repeat and resume), as in tinker-cookbook
``recipes/math_rl/arithmetic_env.py`` (seeded by batch index). Each task:
``{"id": "arith-L1-s0-000000", "question": "What is 3 + 4?", "answer": "7", "level": 1}``.

Levels:

1. ``a + b``, a, b in 0..9
2. ``a + b``, a, b in 10..99
3. ``a + b`` or ``a - b`` (a >= b), a, b in 10..99
4. ``a * b``, a in 2..12, b in 2..19
5. ``(a op b) op c`` with a, b, c in 2..20 and op in + - *

Usage: ``python data.py --out tasks.jsonl [--level 1] [--n-tasks 512] [--seed 0]``.
"""

from __future__ import annotations

import operator
import random
from typing import Any

from templates import _tasks

LEVELS = (1, 2, 3, 4, 5)
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def make_task(index: int, level: int = 1, seed: int = 0) -> dict[str, Any]:
    """Task ``index`` of the (seed, level) stream.

    Args:
        index: Position in the dataset (>= 0).
        level: Difficulty 1..5 (see module docstring).
        seed: Stream seed.

    Returns:
        ``{"id", "question", "answer", "level"}``; ``answer`` is an integer as a string.

    Raises:
        ValueError: Unknown level or negative index.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level}")
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    rng = random.Random(f"arithmetic:{seed}:{level}:{index}")
    if level == 1:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        expression, value = f"{a} + {b}", a + b
    elif level == 2:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        expression, value = f"{a} + {b}", a + b
    elif level == 3:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if rng.random() < 0.5:
            expression, value = f"{a} + {b}", a + b
        else:
            a, b = max(a, b), min(a, b)
            expression, value = f"{a} - {b}", a - b
    elif level == 4:
        a, b = rng.randint(2, 12), rng.randint(2, 19)
        expression, value = f"{a} * {b}", a * b
    else:
        a, b, c = (rng.randint(2, 20) for _ in range(3))
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        expression = f"({a} {op1} {b}) {op2} {c}"
        value = _OPS[op2](_OPS[op1](a, b), c)
    return {
        "id": f"arith-L{level}-s{seed}-{index:06d}",
        "question": f"What is {expression}?",
        "answer": str(value),
        "level": level,
    }


def build(level: int = 1, n_tasks: int = 512, seed: int = 0) -> list[dict[str, Any]]:
    """Tasks ``0..n_tasks-1`` of the (seed, level) stream (see :func:`make_task`)."""
    if n_tasks < 1:
        raise ValueError(f"n_tasks must be >= 1, got {n_tasks}")
    return [make_task(i, level, seed) for i in range(n_tasks)]


def main(argv: list[str] | None = None) -> None:
    """Command line entry point (see module docstring)."""
    _tasks.main(__doc__ or "", build, argv, {"level": LEVELS})


if __name__ == "__main__":
    main()
