"""Who-is-the-spy workflow: one full game per episode, each seat an agent with its own history.

Contract (swarm/client/workflow.py): ``async def run(task, llm) -> Result``; only the OpenAI
chat-completions API is used. Multi-agent conventions:

* Agent names are ``<role>_<rank>`` (``spy_1``, ``civilian_2``; rank = order among players of that
  role by seat), sent as the OpenAI ``user`` field; the names depend only on the game size.
* Which agents train is decided by the data builder (``train_roles``) and stored in each task's
  ``trainable_agents``; :func:`trainable_agents` returns it for the runner to pass at episode start
  (it is the same list for every task, so ``swarm run --trainable-agent spy_1`` works too).
* Trainable seats always call the episode's server. Untrained seats call it too (their calls are
  recorded but not trained), unless ``opponent_base_url`` names another OpenAI-compatible endpoint
  (`templates._game.players`, the games' shared base).
* Assistant replies go back into each player's history verbatim, so histories are append-only.
"""

from __future__ import annotations

import contextlib
from typing import Any

from swarm.client.workflow import LLM, Result
from templates._game.players import seat_players, trainable_agents
from templates._loader import import_sibling

_game = import_sibling(__name__, __file__, "game")
_reward = import_sibling(__name__, __file__, "reward")

# <params> (rendered by templates.render; edit values here or re-render)
PARAMS: dict[str, Any] = {
    "describe_max_tokens": 24,
    "hide_leaks": True,
    "invalid_vote_penalty": 0.25,
    "leak_penalty": 0.5,
    "opponent_api_key_env": None,
    "opponent_base_url": None,
    "opponent_model": None,
    "temperature": 1.0,
    "tell_roles": False,
    "vote_max_tokens": 8,
}
# </params>


def _max_tokens(phase: Any) -> int:
    return int(PARAMS["describe_max_tokens" if phase == _game.Phase.DESCRIBE else "vote_max_tokens"])


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """Play one game and return per-agent rewards.

    Args:
        task: A row from ``data.py`` (words, seats, spies, rounds, trainable agents).
        llm: The episode's endpoint.

    Returns:
        ``Result`` whose ``reward`` is the mean reward of the trainable agents, ``agent_rewards`` has
        every agent, and metrics ``spy_won``, ``rounds``, ``leaks``, ``invalid_votes`` (whole game),
        the reward's parts for the trainable agents (`reward.reward_parts`): ``win_rate``,
        ``leak_rate``, ``invalid_vote_rate``, and ``default_weights_reward``: the episode reward
        under the template's default penalties (`reward.LEAK_PENALTY`,
        `reward.INVALID_VOTE_PENALTY`) whatever ``PARAMS`` say, the yardstick for a run trained on
        changed (e.g. broken, then patched) weights.
    """
    setup = _game.GameSetup.from_task(task)
    trainable = set(trainable_agents(task))
    async with contextlib.AsyncExitStack() as stack:
        players = await seat_players(
            stack, setup, trainable, {"game": llm}, lambda seat: "game", PARAMS, _max_tokens
        )
        record = await _game.play(
            setup, players, tell_roles=PARAMS["tell_roles"], hide_leaks=PARAMS["hide_leaks"]
        )
    rewards = _reward.agent_rewards(
        record, leak_penalty=PARAMS["leak_penalty"], invalid_vote_penalty=PARAMS["invalid_vote_penalty"]
    )
    return Result(
        reward=_reward.episode_reward(rewards, trainable),
        agent_rewards=rewards,
        metrics={
            "spy_won": float(record.winner == _game.Role.SPY),
            "rounds": float(record.rounds),
            "leaks": float(sum(s.leaks for s in record.stats.values())),
            "invalid_votes": float(sum(s.invalid_votes for s in record.stats.values())),
            **_reward.reward_parts(record, trainable),
            "default_weights_reward": _reward.episode_reward(_reward.agent_rewards(record), trainable),
        },
    )
