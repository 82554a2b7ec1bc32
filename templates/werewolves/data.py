"""Data builder of werewolves: one seating (a role per seat) per task, seeded by index.

Roles: ``n_werewolves`` werewolves, the special roles listed in ``special_roles`` (``seer``, ``witch``,
``hunter``; at most one each), villagers for the other seats. ``random.Random(f"werewolves:{seed}:{i}")``
shuffles the seats, so any slice regenerates alone. Each task::

    {"id": "wolf-n5-w1-s0-000000", "roles": ["seer", "werewolf", "villager", "hunter", "witch"],
     "max_days": 2, "trainable_agents": ["werewolf_1"]}

``trainable_agents`` lists the agent names (``<role>_<rank>``, the OpenAI ``user`` the workflow sends;
rank counts players of a role in seat order) whose calls the server trains, from ``train_roles``:
``all``, ``werewolves`` (the werewolf team), ``village`` (the whole village team), ``special`` (the
seer, witch and hunter), or one role (``seer``, ``witch``, ``hunter``, ``villager``). It is the same for
every task of one game size.

Usage: ``python data.py --out tasks.jsonl [--n-players 5] [--n-werewolves 1] [--special-roles
seer,witch,hunter] [--max-days 2] [--train-roles werewolves] [--n-tasks 64] [--seed 0]``.
"""

from __future__ import annotations

import random
from typing import Any

from templates import _tasks
from templates._game.table import role_names

TRAIN_ROLES = ("all", "werewolves", "village", "special", "seer", "witch", "hunter", "villager")
SPECIAL = ("seer", "witch", "hunter")


def parse_special(special_roles: str) -> list[str]:
    """The special roles of a comma list (``"seer,witch"``; ``""`` or ``"none"`` for none).

    Raises:
        ValueError: An unknown or repeated role.
    """
    names = [r.strip() for r in special_roles.split(",") if r.strip() and r.strip() != "none"]
    bad = [r for r in names if r not in SPECIAL]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"special_roles must list distinct roles of {SPECIAL}, got {special_roles!r}")
    return [r for r in SPECIAL if r in names]


def role_census(n_players: int, n_werewolves: int, special_roles: str) -> list[str]:
    """The roles of a game before seating (werewolves, special roles, then villagers).

    Raises:
        ValueError: Fewer than 4 players, werewolves not fewer than half, or too many roles for the seats.
    """
    special = parse_special(special_roles)
    if n_players < 4 or n_werewolves < 1 or 2 * n_werewolves >= n_players:
        raise ValueError(
            f"need n_players >= 4 and 1 <= n_werewolves < n_players / 2; got {n_players}, {n_werewolves}"
        )
    villagers = n_players - n_werewolves - len(special)
    if villagers < 0:
        raise ValueError(
            f"{n_werewolves} werewolves and {len(special)} special roles do not fit {n_players} seats"
        )
    return ["werewolf"] * n_werewolves + special + ["villager"] * villagers


def trainable_agents(census: list[str], train_roles: str) -> list[str]:
    """Agent names to train for a census (``werewolf_1``…, ``seer_1``, ``villager_2``…).

    Raises:
        ValueError: Unknown ``train_roles``.
    """
    if train_roles not in TRAIN_ROLES:
        raise ValueError(f"train_roles must be one of {TRAIN_ROLES}, got {train_roles!r}")
    groups = {
        "all": set(census),
        "werewolves": {"werewolf"},
        "village": set(census) - {"werewolf"},
        "special": set(SPECIAL),
    }
    wanted = groups.get(train_roles, {train_roles})
    names = []
    for role in ("werewolf", *SPECIAL, "villager"):
        if role in wanted:
            names += role_names(role, census.count(role))
    return names


def make_task(
    index: int,
    *,
    n_players: int = 5,
    n_werewolves: int = 1,
    special_roles: str = "seer,witch,hunter",
    max_days: int = 2,
    train_roles: str = "werewolves",
    seed: int = 0,
) -> dict[str, Any]:
    """Game setup ``index`` (see the module docstring).

    Raises:
        ValueError: A bad game size, role list or index.
    """
    if index < 0:
        raise ValueError("index must be >= 0")
    census = role_census(n_players, n_werewolves, special_roles)
    roles = list(census)
    random.Random(f"werewolves:{seed}:{index}").shuffle(roles)
    return {
        "id": f"wolf-n{n_players}-w{n_werewolves}-s{seed}-{index:06d}",
        "roles": roles,
        "max_days": max_days,
        "trainable_agents": trainable_agents(census, train_roles),
    }


def build(
    n_players: int = 5,
    n_werewolves: int = 1,
    special_roles: str = "seer,witch,hunter",
    max_days: int = 2,
    train_roles: str = "werewolves",
    n_tasks: int = 64,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Tasks ``0..n_tasks-1``."""
    return [
        make_task(
            i,
            n_players=n_players,
            n_werewolves=n_werewolves,
            special_roles=special_roles,
            max_days=max_days,
            train_roles=train_roles,
            seed=seed,
        )
        for i in range(n_tasks)
    ]


def main(argv: list[str] | None = None) -> None:
    """Command line entry point (see the module docstring)."""
    _tasks.main(__doc__ or "", build, argv, {"train_roles": TRAIN_ROLES})


if __name__ == "__main__":
    main()
