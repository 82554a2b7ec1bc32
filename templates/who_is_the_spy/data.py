"""Data builder of who-is-the-spy: one game setup per task from the word-pair list, seeded by index.

Task ``i`` uses word pair ``i mod len(pairs)`` (``data/word_pairs.txt``, civilian word first), and
``random.Random(f"spy:{seed}:{i}")`` decides whether the two words swap roles and which seats the
spies take, so any slice regenerates alone. Each task::

    {"id": "spy-n4-k1-s0-000000", "civilian_word": "apple", "spy_word": "pear", "n_players": 4,
     "spy_seats": [3], "max_rounds": 3, "trainable_agents": ["spy_1"]}

``trainable_agents`` lists the agent names (``<role>_<rank>``, the OpenAI ``user`` the workflow
sends; rank counts players of a role in seat order) whose calls the server should train, from
``train_roles`` (``spy``, ``civilian`` or ``both``). It is the same for every task of one game size.

Usage: ``python data.py --out tasks.jsonl [--n-players 3] [--n-spies 1] [--max-rounds 2]
[--train-roles both] [--n-tasks 0] [--seed 0]``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from templates import _tasks
from templates._game.table import role_names

PAIRS_FILE = Path(__file__).resolve().parent / "data" / "word_pairs.txt"
TRAIN_ROLES = ("both", "spy", "civilian")


def load_pairs(path: str | Path = PAIRS_FILE) -> list[tuple[str, str]]:
    """Word pairs ``(civilian, spy)`` from a ``word,word`` per line file (``#`` comments).

    Raises:
        ValueError: A line is not two different non-empty words.
    """
    pairs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not all(parts) or parts[0].lower() == parts[1].lower():
            raise ValueError(f"{path}:{number}: expected 'civilian word,spy word', got {line!r}")
        pairs.append((parts[0], parts[1]))
    return pairs


def trainable_agents(n_players: int, n_spies: int, train_roles: str) -> list[str]:
    """Agent names to train for a game size (``spy_1..``, ``civilian_1..``; see ``templates._game.table.agent_name``).

    The names depend only on the sizes, not on the seating, so one list serves every task of a run.

    Raises:
        ValueError: Unknown ``train_roles``.
    """
    if train_roles not in TRAIN_ROLES:
        raise ValueError(f"train_roles must be one of {TRAIN_ROLES}, got {train_roles!r}")
    names = []
    if train_roles in ("both", "spy"):
        names += role_names("spy", n_spies)
    if train_roles in ("both", "civilian"):
        names += role_names("civilian", n_players - n_spies)
    return names


def make_task(
    index: int,
    pairs: list[tuple[str, str]],
    *,
    n_players: int = 3,
    n_spies: int = 1,
    max_rounds: int = 2,
    train_roles: str = "both",
    seed: int = 0,
) -> dict[str, Any]:
    """Game setup ``index`` (see module docstring).

    Raises:
        ValueError: Spies not fewer than half the players, fewer than 3 players, or a bad index.
    """
    if n_players < 3 or n_spies < 1 or 2 * n_spies >= n_players:
        raise ValueError(f"need n_players >= 3 and 1 <= n_spies < n_players / 2; got {n_players}, {n_spies}")
    if index < 0 or not pairs:
        raise ValueError("index must be >= 0 and pairs non-empty")
    rng = random.Random(f"spy:{seed}:{index}")
    civilian, spy = pairs[index % len(pairs)]
    if rng.random() < 0.5:
        civilian, spy = spy, civilian
    spy_seats = sorted(rng.sample(range(1, n_players + 1), n_spies))
    return {
        "id": f"spy-n{n_players}-k{n_spies}-s{seed}-{index:06d}",
        "civilian_word": civilian,
        "spy_word": spy,
        "n_players": n_players,
        "spy_seats": spy_seats,
        "max_rounds": max_rounds,
        "trainable_agents": trainable_agents(n_players, n_spies, train_roles),
    }


def build(
    n_players: int = 3,
    n_spies: int = 1,
    max_rounds: int = 2,
    train_roles: str = "both",
    n_tasks: int = 0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Tasks ``0..n_tasks-1`` (``n_tasks=0``: one per word pair)."""
    pairs = load_pairs()
    count = n_tasks or len(pairs)
    return [
        make_task(
            i,
            pairs,
            n_players=n_players,
            n_spies=n_spies,
            max_rounds=max_rounds,
            train_roles=train_roles,
            seed=seed,
        )
        for i in range(count)
    ]


def main(argv: list[str] | None = None) -> None:
    """Command line entry point (see module docstring)."""
    _tasks.main(__doc__ or "", build, argv, {"train_roles": TRAIN_ROLES})


if __name__ == "__main__":
    main()
