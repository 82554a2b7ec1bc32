"""Parameter specs that several templates declare, written once: the task count and seed of a data
builder, a completion token limit, the sampling temperature and a game's opponent endpoint.

Each function returns a :class:`ParamSpec` with the shared name, type, range and target; a template
passes what is its own (its default, its one-line description, a token limit's maximum).
"""

from __future__ import annotations

from ._meta import ParamSpec, ParamTarget

MAX_TASKS = 1_000_000
"""Largest ``n_tasks`` a data builder is asked for."""
MAX_SEED = 2**31 - 1
"""Largest generator seed."""


def n_tasks(default: int, description: str, *, minimum: int = 1) -> ParamSpec:
    """``n_tasks``: how many tasks the data builder writes (``minimum..1e6``; "100 tasks" in a request)."""
    return data_int("n_tasks", default, minimum, MAX_TASKS, description, counts="tasks")


def seed(description: str) -> ParamSpec:
    """``seed``: the data builder's generator seed (default 0, ``0..2**31-1``)."""
    return data_int("seed", 0, 0, MAX_SEED, description)


def max_tokens(
    default: int, maximum: int, description: str = "Completion token limit.", *, name: str = "max_tokens"
) -> ParamSpec:
    """A completion token limit of the workflow (``max_tokens``, or a game's per-phase ``name``), ``1..maximum``."""
    return ParamSpec(
        name=name,
        type="int",
        default=default,
        minimum=1,
        maximum=maximum,
        description=description,
        phrases=(r"max[ _-]?tokens\s*(?:of|=|:)?\s*",) if name == "max_tokens" else (),
    )


def temperature(description: str = "Sampling temperature.") -> ParamSpec:
    """``temperature``: the workflow's sampling temperature (default 1.0, ``0..2``)."""
    return ParamSpec(
        name="temperature",
        type="float",
        default=1.0,
        minimum=0.0,
        maximum=2.0,
        description=description,
        phrases=(r"temperature\s*(?:of|=|:)?\s*",),
    )


def opponent(base_url_description: str) -> tuple[ParamSpec, ParamSpec, ParamSpec]:
    """The opponent endpoint of a multi-agent game (`templates.opponent`): ``opponent_base_url`` (described by
    the template), ``opponent_model`` and ``opponent_api_key_env``, each nullable with default ``None``."""
    return (
        ParamSpec(
            name="opponent_base_url",
            type="str",
            default=None,
            nullable=True,
            description=base_url_description,
        ),
        ParamSpec(
            name="opponent_model",
            type="str",
            default=None,
            nullable=True,
            description="Model name at the opponent endpoint (None: the episode's model).",
        ),
        ParamSpec(
            name="opponent_api_key_env",
            type="str",
            default=None,
            nullable=True,
            description="NAME of the environment variable holding the opponent API key.",
        ),
    )


def data_int(
    name: str,
    default: int,
    minimum: int,
    maximum: int,
    description: str,
    *,
    counts: str | None = None,
    phrases: tuple[str, ...] = (),
) -> ParamSpec:
    """An integer parameter of the data builder (a game size, a difficulty level, a limit), ``minimum..maximum``;
    ``counts``: the things it counts as a request writes them (`ParamSpec.counts`); ``phrases``: what a
    request writes before its value (`ParamSpec.phrases`)."""
    return ParamSpec(
        name=name,
        type="int",
        default=default,
        minimum=minimum,
        maximum=maximum,
        description=description,
        target=ParamTarget.DATA,
        counts=counts,
        phrases=phrases,
    )


def players(default: int, minimum: int, maximum: int, description: str) -> ParamSpec:
    """``n_players``: seats per game of a multi-agent game (a data parameter; "6 players" in a request)."""
    return data_int("n_players", default, minimum, maximum, description, counts="players?")


def train_roles(default: str, choices: tuple[str, ...], description: str) -> ParamSpec:
    """``train_roles``: which roles' agents of a game a run trains (a data parameter: the tasks name them)."""
    return ParamSpec(
        name="train_roles",
        type="str",
        default=default,
        choices=choices,
        description=description,
        target=ParamTarget.DATA,
    )


def penalty(name: str, default: float, description: str, *, minimum: float = 0.0) -> ParamSpec:
    """A reward penalty weight of the workflow, ``minimum..1`` (the reward is clipped to ``[-1, 1]``, so a
    larger cost changes nothing); a template's ``reward_weights`` names it for the part it weighs."""
    return ParamSpec(
        name=name, type="float", default=default, minimum=minimum, maximum=1.0, description=description
    )
