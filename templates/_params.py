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
    """``n_tasks``: how many tasks the data builder writes (a DATA parameter, ``minimum..1e6``)."""
    return ParamSpec(
        name="n_tasks",
        type="int",
        default=default,
        minimum=minimum,
        maximum=MAX_TASKS,
        description=description,
        target=ParamTarget.DATA,
        counts="tasks",
    )


def seed(description: str) -> ParamSpec:
    """``seed``: the data builder's generator seed (a DATA parameter, default 0, ``0..2**31-1``)."""
    return ParamSpec(
        name="seed",
        type="int",
        default=0,
        minimum=0,
        maximum=MAX_SEED,
        description=description,
        target=ParamTarget.DATA,
    )


def max_tokens(
    default: int, maximum: int, description: str = "Completion token limit.", *, name: str = "max_tokens"
) -> ParamSpec:
    """A completion token limit of the workflow (``max_tokens``, or a game's per-phase ``name``), ``1..maximum``."""
    return ParamSpec(
        name=name, type="int", default=default, minimum=1, maximum=maximum, description=description
    )


def temperature(description: str = "Sampling temperature.") -> ParamSpec:
    """``temperature``: the workflow's sampling temperature (default 1.0, ``0..2``)."""
    return ParamSpec(
        name="temperature", type="float", default=1.0, minimum=0.0, maximum=2.0, description=description
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
