"""A count with its noun in the right number, for the lines a3r writes: ``1 seed``, ``3 seeds``,
``≈ 1 more step``."""

from __future__ import annotations

__all__ = ["counted", "unit_noun"]


def unit_noun(n: int, unit: str) -> str:
    """``unit`` (a plural: seeds, steps, episodes, runs, tasks) in the singular when ``n`` is 1."""
    return unit[:-1] if n == 1 and unit.endswith("s") else unit


def counted(n: int, unit: str) -> str:
    """``n`` with its unit in the right number: ``1 seed``, ``3 seeds``, ``1 step``."""
    return f"{n} {unit_noun(n, unit)}"
