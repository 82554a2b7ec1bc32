"""Data builder of the math template: writes the chosen problem sets as JSONL tasks.

Each task: ``{"id", "problem", "answer", "source"}``; ids are the dataset ids (``aime24-01``,
``gsm8k-0001``...), kept from ``data/*.jsonl`` (copied from the project's shared data, see README).

Usage: ``python data.py --out tasks.jsonl [--dataset gsm8k] [--limit 0]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from templates import _tasks

DATA_DIR = Path(__file__).resolve().parent / "data"
SOURCES = {
    "aime24": ("aime24",),
    "aime25": ("aime25",),
    "aime": ("aime24", "aime25"),
    "gsm8k": ("gsm8k_test200",),
}
SOURCES["all"] = SOURCES["aime"] + SOURCES["gsm8k"]


def build(dataset: str = "gsm8k", limit: int = 0) -> list[dict[str, Any]]:
    """Tasks of ``dataset`` in file order.

    Args:
        dataset: ``gsm8k``, ``aime24``, ``aime25``, ``aime`` or ``all``.
        limit: Keep the first ``limit`` tasks (0 keeps all).

    Returns:
        Task dicts with ``id``, ``problem``, ``answer`` and ``source``.

    Raises:
        ValueError: Unknown dataset or negative limit.
    """
    if dataset not in SOURCES:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(SOURCES)}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    tasks = []
    for name in SOURCES[dataset]:
        with open(DATA_DIR / f"{name}.jsonl", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                tasks.append(
                    {"id": row["id"], "problem": row["problem"], "answer": row["answer"], "source": name}
                )
    return tasks[:limit] if limit else tasks


def main(argv: list[str] | None = None) -> None:
    """Command line entry point (see module docstring)."""
    _tasks.main(__doc__ or "", build, argv, {"dataset": sorted(SOURCES)})


if __name__ == "__main__":
    main()
