"""Metadata of the who-is-the-spy template."""

from typing import Any

from templates._errors import TemplateParamError
from templates._meta import ParamSpec, ParamTarget, TemplateMeta

META = TemplateMeta(
    name="who_is_the_spy",
    title="Who is the spy (multi-agent word game)",
    description=(
        "A social deduction game played by LLM agents: civilians share a secret word, spies hold a "
        "similar one; players describe their word without saying it, vote, and eliminate. Each player "
        "keeps its own history and is named `<role>_<rank>` (`spy_1`, `civilian_2`) in the OpenAI `user` field; which roles "
        "train is a parameter (others are played untrained by the same server or another endpoint). "
        "Per-agent rewards: team win minus penalties for saying one's own word or voting invalidly."
    ),
    keywords=(
        "who is the spy",
        "who-is-the-spy",
        "spy",
        "undercover",
        "who is the undercover",
        "social deduction",
        "word game",
        "party game",
        "multi-agent",
        "multi agent",
        "multiagent",
        "self-play",
        "game",
        "deception",
        "voting",
    ),
    reward_range=(-1.0, 1.0),
    reward_parts={"win_rate": "goal", "leak_rate": "violation", "invalid_vote_rate": "violation"},
    capabilities=(
        "multi-turn chat with a system prompt",
        "follow game rules (describe without saying a word, vote with a player number)",
        "reason about other players' statements",
    ),
    multi_agent=True,
    defaults_evidence=(
        "vote instruction and vote reading chosen from pilot games of the embedded SmolLM2-135M "
        "(bench/spy_pilots.py, 2026-12-02, CPU, 48 games a variant): invalid votes per game 0.84 -> 0.75; "
        "game size, rounds, token limits, temperature and reward weights kept; see "
        "templates/who_is_the_spy/README.md"
    ),
    parameters=(
        ParamSpec(name="n_players", type="int", default=3, minimum=3, maximum=8,
                  description="Players per game (3: sized for CPU runs; 4-6 for the classic game).",
                  target=ParamTarget.DATA),
        ParamSpec(name="n_spies", type="int", default=1, minimum=1, maximum=3,
                  description="Spies per game (fewer than half the players).", target=ParamTarget.DATA),
        ParamSpec(name="max_rounds", type="int", default=2, minimum=1, maximum=10,
                  description="Rounds before surviving spies win.", target=ParamTarget.DATA),
        ParamSpec(name="train_roles", type="str", default="both", choices=("both", "spy", "civilian"),
                  description="Which roles' agents are trainable.", target=ParamTarget.DATA),
        ParamSpec(name="n_tasks", type="int", default=0, minimum=0, maximum=1_000_000,
                  description="Games to write (0 = one per word pair, 322).", target=ParamTarget.DATA),
        ParamSpec(name="seed", type="int", default=0, minimum=0, maximum=2**31 - 1,
                  description="Seating/word-swap seed (task i depends only on seed and i).",
                  target=ParamTarget.DATA),
        ParamSpec(name="describe_max_tokens", type="int", default=24, minimum=1, maximum=1024,
                  description="Token limit of a description (a one-line clue; sized for a CPU run)."),
        ParamSpec(name="vote_max_tokens", type="int", default=8, minimum=1, maximum=1024,
                  description="Token limit of a vote."),
        ParamSpec(name="temperature", type="float", default=1.0, minimum=0.0, maximum=2.0,
                  description="Sampling temperature for every player."),
        ParamSpec(name="tell_roles", type="bool", default=False,
                  description="Tell each player whether it is a spy (classic rules: no)."),
        ParamSpec(name="hide_leaks", type="bool", default=True,
                  description="Show a description that says its speaker's word as *** (False: as said, so a "
                              "leak tells the others one's word and can win the vote)."),
        ParamSpec(name="leak_penalty", type="float", default=0.5, minimum=-1.0, maximum=1.0,
                  description="Reward cost per description that says the own word (negative: a broken "
                              "reward that pays for leaking, for reward-hacking experiments)."),
        ParamSpec(name="invalid_vote_penalty", type="float", default=0.25, minimum=-1.0, maximum=1.0,
                  description="Reward cost per invalid vote (negative: a broken reward that pays for it)."),
        ParamSpec(name="opponent_base_url", type="str", default=None, nullable=True,
                  description="OpenAI base URL for untrained players (None: the episode's own server)."),
        ParamSpec(name="opponent_model", type="str", default=None, nullable=True,
                  description="Model name at the opponent endpoint (None: the episode's model)."),
        ParamSpec(name="opponent_api_key_env", type="str", default=None, nullable=True,
                  description="NAME of the environment variable holding the opponent API key."),
    ),
)  # fmt: skip


def trainable_agents(params: dict[str, Any]) -> list[str]:
    """Agent names a run of these (resolved) parameters trains, e.g. ``["spy_1"]`` for ``train_roles="spy"``."""
    names = {"spy": [f"spy_{k}" for k in range(1, params["n_spies"] + 1)]}
    names["civilian"] = [f"civilian_{k}" for k in range(1, params["n_players"] - params["n_spies"] + 1)]
    role = params["train_roles"]
    return names["spy"] + names["civilian"] if role == "both" else names[role]


def model_calls(params: dict[str, Any]) -> list[int]:
    """Token limits of the model calls one game makes at most (resolved parameters): every player
    describes, then votes, in each of ``max_rounds`` rounds (a tied vote eliminates nobody)."""
    players, rounds = int(params["n_players"]), int(params["max_rounds"])
    describe, vote = int(params["describe_max_tokens"]), int(params["vote_max_tokens"])
    return ([describe] * players + [vote] * players) * rounds


def check_params(params: dict[str, Any]) -> None:
    """Cross-parameter rules: spies must be fewer than half of the players.

    Raises:
        TemplateParamError: The rule is broken.
    """
    if 2 * params["n_spies"] >= params["n_players"]:
        raise TemplateParamError(
            META.name,
            "n_spies",
            f"{params['n_spies']} spies is not fewer than half of {params['n_players']} players",
        )
