"""The workflow side of a multi-agent game: one OpenAI-backed player per seat.

Trainable seats call their server (the episode's, or their team's when a workflow is given several).
Untrained seats call it too (their calls are recorded but not trained), unless the workflow's
``opponent_base_url`` parameter names another OpenAI-compatible endpoint (`templates.opponent`).
Each call names its agent in the OpenAI ``user`` field.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from swarm.client.workflow import LLM
from templates.opponent import opponent_client

from .table import Message, Seating


def trainable_agents(task: dict[str, Any]) -> list[str]:
    """Agent names whose calls the server trains for ``task`` (its ``trainable_agents`` field)."""
    return list(task["trainable_agents"])


def chat_player(
    client: Any, model: str, agent: str, *, max_tokens: Callable[[Any], int], temperature: float
) -> Any:
    """A player that asks ``model`` through ``client`` (an ``openai.AsyncOpenAI``) as ``agent``, with
    the token limit ``max_tokens(phase)`` of the phase asked; an empty reply reads as ``""``."""

    async def act(messages: list[Message], phase: Any) -> str:
        response = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens(phase),
            temperature=temperature,
            user=agent,
        )
        return response.choices[0].message.content or ""

    return act


async def seat_players(
    stack: contextlib.AsyncExitStack,
    setup: Seating,
    trainable: set[str],
    endpoints: Mapping[str, LLM],
    server_of: Callable[[int], str],
    params: Mapping[str, Any],
    max_tokens: Callable[[Any], int],
) -> dict[int, Any]:
    """One player per seat of ``setup``, their clients opened on ``stack``.

    Args:
        stack: Closes the clients when the game is over.
        setup: The game's seats and agent names.
        trainable: Agent names the run trains.
        endpoints: Server key → endpoint (one client each).
        server_of: The key of a seat's server (``lambda seat: "game"`` with one server).
        params: The workflow's ``PARAMS`` (``temperature`` and the opponent's ``opponent_*``).
        max_tokens: Token limit of a reply by phase.

    Returns:
        Seat → player.
    """
    own = {key: await stack.enter_async_context(e.openai()) for key, e in endpoints.items()}
    opponent = (
        await stack.enter_async_context(opponent_client(params)) if params["opponent_base_url"] else None
    )
    players = {}
    for seat in setup.seats:
        agent, key = setup.agent(seat), server_of(seat)
        client, model = own[key], endpoints[key].model
        if agent not in trainable and opponent is not None:
            client, model = opponent, params["opponent_model"] or model
        players[seat] = chat_player(
            client, model, agent, max_tokens=max_tokens, temperature=params["temperature"]
        )
    return players
