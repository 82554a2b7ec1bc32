"""Metadata of the werewolves template."""

from typing import Any

from templates import _params
from templates._errors import TemplateParamError
from templates._loader import import_sibling
from templates._meta import ParamSpec, ParamTarget, TemplateMeta

from .reward import INVALID_ACTION_PENALTY, REVEAL_PENALTY

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
        _params.players(5, 4, 12, "Players per game (5: sized for CPU runs; 7-9 for the classic game)."),
        _params.data_int("n_werewolves", 1, 1, 4, "Werewolves per game (fewer than half the players).",
                         counts="(?:were)?wol(?:f|ves)"),
        ParamSpec(name="special_roles", type="str", default="seer,witch,hunter",
                  description="Village roles with a power, comma list of seer, witch, hunter ('none': only "
                  "villagers).", target=ParamTarget.DATA),
        _params.data_int("max_days", 2, 1, 10, "Days before surviving werewolves win.", counts="days?"),
        _params.train_roles("werewolves",
                            ("all", "werewolves", "village", "special", "seer", "witch", "hunter", "villager"),
                            "Which roles' agents are trainable (the others are the opponent)."),
        _params.n_tasks(64, "Games (seatings) to write."),
        _params.seed("Seating seed (task i depends only on seed and i)."),
        _params.max_tokens(32, 1024, "Token limit of a day statement.", name="speak_max_tokens"),
        _params.max_tokens(8, 1024, "Token limit of a night action, a vote or a shot.", name="action_max_tokens"),
        _params.temperature("Sampling temperature for every player."),
        _params.penalty("invalid_action_penalty", INVALID_ACTION_PENALTY,
                        "Reward cost per invalid action (unreadable or forbidden target, spent potion)."),
        _params.penalty("reveal_penalty", REVEAL_PENALTY, "Reward cost per statement in which a werewolf reveals its role."),
        *_params.opponent("OpenAI base URL for untrained players: a frozen copy (swarm serve --no-train) "
                          "or another server (None: the episode's own server, untrained)."),
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
