"""Werewolves workflow: one full game per episode, each seat an agent with its own history.

Contract (swarm/client/workflow.py): ``async def run(task, llm) -> Result``; only the OpenAI
chat-completions API is used. Multi-agent conventions:

* Agent names are ``<role>_<rank>`` (``werewolf_1``, ``seer_1``, ``villager_2``; rank = order among
  players of that role by seat), sent as the OpenAI ``user`` field; the names depend only on the role
  counts.
* Which agents train is decided by the data builder (``train_roles``) and stored in each task's
  ``trainable_agents``; :func:`trainable_agents` returns it for the runner to pass at episode start.
* Trainable seats call the episode's server. Untrained seats (the opponent) call it too (recorded, not
  trained), unless ``opponent_base_url`` names another OpenAI-compatible endpoint: a frozen copy of the
  model (``swarm serve --no-train``) or another server.
* Several servers (``llm`` is a dict, ``swarm run --server werewolves=URL --server village=URL``): each
  seat calls the server of its team, ``werewolves`` or ``village``; each server's result holds that
  team's agent rewards (non-shared parameters: one model per team).
* Assistant replies go back into each player's history verbatim, so histories are append-only.

Players and their endpoints are the games' shared base (`templates._game.players`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from swarm.client.workflow import LLM, Result
from templates._game.players import seat_players, trainable_agents
from templates._loader import import_sibling

_game = import_sibling(__name__, __file__, "game")
_reward = import_sibling(__name__, __file__, "reward")

# <params> (rendered by templates.render; edit values here or re-render)
PARAMS: dict[str, Any] = {
    "action_max_tokens": 8,
    "invalid_action_penalty": 0.25,
    "opponent_api_key_env": None,
    "opponent_base_url": None,
    "opponent_model": None,
    "reveal_penalty": 0.5,
    "speak_max_tokens": 32,
    "temperature": 1.0,
}
# </params>


def _max_tokens(phase: Any) -> int:
    return int(PARAMS["speak_max_tokens" if phase == _game.Phase.SPEAK else "action_max_tokens"])


async def run(task: dict[str, Any], llm: LLM | Mapping[str, LLM]) -> Result | dict[str, Result]:
    """Play one game and return per-agent rewards.

    Args:
        task: A row from ``data.py`` (roles by seat, days, trainable agents).
        llm: The episode's endpoint, or team name (``werewolves``, ``village``) → endpoint.

    Returns:
        ``Result`` whose ``reward`` is the mean reward of the trainable agents, ``agent_rewards`` has every
        agent, metrics ``werewolves_won``, ``days``, ``invalid_actions``, ``reveals``; with several servers,
        team → that team's ``Result``.

    Raises:
        KeyError: ``llm`` is a dict without a ``werewolves`` or ``village`` entry.
    """
    setup = _game.GameSetup.from_task(task)
    trainable = set(trainable_agents(task))
    endpoints = dict(llm) if isinstance(llm, Mapping) else {team.value: llm for team in _game.Team}
    async with contextlib.AsyncExitStack() as stack:
        players = await seat_players(
            stack,
            setup,
            trainable,
            endpoints,
            lambda seat: _game.team_of(setup.role(seat)).value,
            PARAMS,
            _max_tokens,
        )
        record = await _game.play(setup, players)
    rewards = _reward.agent_rewards(
        record,
        invalid_action_penalty=PARAMS["invalid_action_penalty"],
        reveal_penalty=PARAMS["reveal_penalty"],
    )
    metrics = {
        "werewolves_won": float(record.winner == _game.Team.WEREWOLVES),
        "days": float(record.days),
        "invalid_actions": float(sum(s.invalid_actions for s in record.stats.values())),
        "reveals": float(sum(s.reveals for s in record.stats.values())),
    }
    if not isinstance(llm, Mapping):
        return Result(
            reward=_reward.episode_reward(rewards, trainable), agent_rewards=rewards, metrics=metrics
        )
    out = {}
    for team in endpoints:
        mine = {
            setup.agent(s): rewards[setup.agent(s)]
            for s in setup.seats
            if _game.team_of(setup.role(s)).value == team
        }
        out[team] = Result(
            reward=_reward.episode_reward(mine, trainable & set(mine)), agent_rewards=mine, metrics=metrics
        )
    return out
