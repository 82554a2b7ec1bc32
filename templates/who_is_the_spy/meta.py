"""Metadata of the who-is-the-spy template."""

from typing import Any

from templates import _params
from templates._errors import TemplateParamError
from templates._meta import ParamSpec, TemplateMeta

from . import data as _data
from .reward import INVALID_VOTE_PENALTY, LEAK_PENALTY

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
    reward_weights={"leak_rate": "leak_penalty", "invalid_vote_rate": "invalid_vote_penalty"},
    reward_patch_reason=(
        "Raising the penalty makes breaking the rule cost more than a win pays, so the policy can no "
        "longer buy reward with it (the held-out evaluator keeps the original weights)."
    ),
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
        _params.players(3, 3, 8, "Players per game (3: sized for CPU runs; 4-6 for the classic game)."),
        _params.data_int("n_spies", 1, 1, 3, "Spies per game (fewer than half the players).",
                         counts="sp(?:y|ies)"),
        _params.data_int("max_rounds", 2, 1, 10, "Rounds before surviving spies win.", counts="rounds?"),
        _params.train_roles("both", ("both", "spy", "civilian"), "Which roles' agents are trainable."),
        _params.n_tasks(0, "Games to write (0 = one per word pair, 322).", minimum=0),
        _params.seed("Seating/word-swap seed (task i depends only on seed and i)."),
        _params.max_tokens(24, 1024, "Token limit of a description (a one-line clue; sized for a CPU run).",
                           name="describe_max_tokens"),
        _params.max_tokens(8, 1024, "Token limit of a vote.", name="vote_max_tokens"),
        _params.temperature("Sampling temperature for every player."),
        ParamSpec(name="tell_roles", type="bool", default=False,
                  description="Tell each player whether it is a spy (classic rules: no)."),
        ParamSpec(name="hide_leaks", type="bool", default=True,
                  description="Show a description that says its speaker's word as *** (False: as said, so a "
                              "leak tells the others one's word and can win the vote)."),
        _params.penalty("leak_penalty", LEAK_PENALTY, "Reward cost per description that says the own word (negative: a "
                        "broken reward that pays for leaking, for reward-hacking experiments).", minimum=-1.0),
        _params.penalty("invalid_vote_penalty", INVALID_VOTE_PENALTY,
                        "Reward cost per invalid vote (negative: a broken reward that pays for it).", minimum=-1.0),
        *_params.opponent("OpenAI base URL for untrained players (None: the episode's own server)."),
    ),
)  # fmt: skip


def trainable_agents(params: dict[str, Any]) -> list[str]:
    """Agent names a run of these (resolved) parameters trains, e.g. ``["spy_1"]`` for ``train_roles="spy"``
    (`data.trainable_agents`)."""
    return _data.trainable_agents(params["n_players"], params["n_spies"], params["train_roles"])


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
