"""Metadata of the werewolves template."""

from typing import Any

from templates._errors import TemplateParamError
from templates._loader import import_sibling
from templates._meta import ParamSpec, ParamTarget, TemplateMeta

META = TemplateMeta(
    name="werewolves",
    title="Werewolves (multi-agent social deduction with night roles)",
    description=(
        "The Werewolves party game played by LLM agents: werewolves kill at night, the seer inspects, the "
        "witch saves or poisons, the hunter shoots when it dies; by day everyone speaks and votes someone "
        "out. Each player keeps its own history and is named `<role>_<rank>` (`werewolf_1`, `seer_1`) in "
        "the OpenAI `user` field; which roles train is a parameter, the others are played by an opponent "
        "(the same model untrained, a frozen copy or another server). Per-agent rewards: team win minus "
        "penalties for invalid actions and for a werewolf revealing its role."
    ),
    keywords=(
        "werewolves",
        "werewolf",
        "werewolf game",
        "werewolves game",
        "werewolves of millers hollow",
        "mafia",
        "seer",
        "witch",
        "hunter",
        "night phase",
        "social deduction",
        "multi-agent",
        "multi agent",
        "multiagent",
        "self-play",
        "voting",
    ),
    capabilities=(
        "multi-turn chat with a system prompt",
        "follow game rules (name a player by number, use potions correctly, keep one's role secret)",
        "reason about other players' statements and votes",
    ),
    reward_range=(-1.0, 1.0),
    multi_agent=True,
    parameters=(
        ParamSpec(name="n_players", type="int", default=5, minimum=4, maximum=12,
                  description="Players per game (5: sized for CPU runs; 7-9 for the classic game).",
                  target=ParamTarget.DATA),
        ParamSpec(name="n_werewolves", type="int", default=1, minimum=1, maximum=4,
                  description="Werewolves per game (fewer than half the players).", target=ParamTarget.DATA),
        ParamSpec(name="special_roles", type="str", default="seer,witch,hunter",
                  description="Village roles with a power, comma list of seer, witch, hunter ('none': only "
                  "villagers).", target=ParamTarget.DATA),
        ParamSpec(name="max_days", type="int", default=2, minimum=1, maximum=10,
                  description="Days before surviving werewolves win.", target=ParamTarget.DATA),
        ParamSpec(name="train_roles", type="str", default="werewolves",
                  choices=("all", "werewolves", "village", "special", "seer", "witch", "hunter", "villager"),
                  description="Which roles' agents are trainable (the others are the opponent).",
                  target=ParamTarget.DATA),
        ParamSpec(name="n_tasks", type="int", default=64, minimum=1, maximum=1_000_000,
                  description="Games (seatings) to write.", target=ParamTarget.DATA),
        ParamSpec(name="seed", type="int", default=0, minimum=0, maximum=2**31 - 1,
                  description="Seating seed (task i depends only on seed and i).", target=ParamTarget.DATA),
        ParamSpec(name="speak_max_tokens", type="int", default=32, minimum=1, maximum=1024,
                  description="Token limit of a day statement."),
        ParamSpec(name="action_max_tokens", type="int", default=8, minimum=1, maximum=1024,
                  description="Token limit of a night action, a vote or a shot."),
        ParamSpec(name="temperature", type="float", default=1.0, minimum=0.0, maximum=2.0,
                  description="Sampling temperature for every player."),
        ParamSpec(name="invalid_action_penalty", type="float", default=0.25, minimum=0.0, maximum=1.0,
                  description="Reward cost per invalid action (unreadable or forbidden target, spent potion)."),
        ParamSpec(name="reveal_penalty", type="float", default=0.5, minimum=0.0, maximum=1.0,
                  description="Reward cost per statement in which a werewolf reveals its role."),
        ParamSpec(name="opponent_base_url", type="str", default=None, nullable=True,
                  description="OpenAI base URL for untrained players: a frozen copy (swarm serve --no-train) "
                  "or another server (None: the episode's own server, untrained)."),
        ParamSpec(name="opponent_model", type="str", default=None, nullable=True,
                  description="Model name at the opponent endpoint (None: the episode's model)."),
        ParamSpec(name="opponent_api_key_env", type="str", default=None, nullable=True,
                  description="NAME of the environment variable holding the opponent API key."),
    ),
)  # fmt: skip


def _data() -> Any:
    return import_sibling(__name__, __file__, "data")


def trainable_agents(params: dict[str, Any]) -> list[str]:
    """Agent names a run of these (resolved) parameters trains, e.g. ``["werewolf_1"]`` for ``werewolves``."""
    census = _data().role_census(params["n_players"], params["n_werewolves"], params["special_roles"])
    names: list[str] = _data().trainable_agents(census, params["train_roles"])
    return names


def model_calls(params: dict[str, Any]) -> list[int]:
    """Token limits of the model calls one game makes at most (resolved parameters), in each of
    ``max_days`` days: the night's actions (each werewolf, the seer, the witch), then every player speaks
    and votes, and the hunter's shot."""
    special = _data().parse_special(params["special_roles"])
    act, speak, n = (
        int(params["action_max_tokens"]),
        int(params["speak_max_tokens"]),
        int(params["n_players"]),
    )
    night = [act] * (int(params["n_werewolves"]) + sum(role in special for role in ("seer", "witch")))
    day = [speak] * n + [act] * n + [act] * ("hunter" in special)
    return (night + day) * int(params["max_days"])


def check_params(params: dict[str, Any]) -> None:
    """Cross-parameter rules: werewolves fewer than half, the roles fit the seats, known special roles.

    Raises:
        TemplateParamError: A rule is broken.
    """
    try:
        _data().role_census(params["n_players"], params["n_werewolves"], params["special_roles"])
    except ValueError as exc:
        name = "special_roles" if "special_roles" in str(exc) else "n_werewolves"
        raise TemplateParamError(META.name, name, str(exc)) from None
