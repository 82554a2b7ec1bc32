"""Where a completion must end, shared by every engine: the end-of-turn ids and the context window
(`check_prompt_fits` before sampling, `max_new_tokens` for the sampling itself)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from swarm.errors import ContextLengthError, RequestError


def end_of_turn_ids(configs: Iterable[Any], tokenizer: Any) -> frozenset[int]:
    """The token ids that end a turn: every ``eos_token_id`` (an int or a list) of ``configs`` (a model
    config, a generation config; ``None`` entries are skipped) and of the tokenizer."""
    ids: set[int] = set()
    for source in configs:
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list | tuple):
            ids.update(int(i) for i in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def check_prompt_fits(prompt_ids: list[int], max_context: int) -> None:
    """Check that a prompt leaves room for at least one completion token.

    Raises:
        ContextLengthError: the prompt is empty, or ``len(prompt_ids) >= max_context`` (HTTP 400).
    """
    if not prompt_ids:
        raise ContextLengthError("the rendered prompt is empty", param="messages")
    if len(prompt_ids) >= max_context:
        raise ContextLengthError(
            f"the prompt is {len(prompt_ids)} tokens but the context window is {max_context} "
            "tokens (prompt + at least one completion token must fit)",
            param="messages",  # what OpenAI's API names for a prompt over the context window
        )


def check_score_input(token_ids: list[int], start: int, max_context: int, vocab_size: int) -> None:
    """Check a scoring request (`Engine.score`): positions ``[start, len)`` with ``start >= 1`` (the
    first token has no context), ids inside the vocabulary and the sequence inside the context window.

    Raises:
        RequestError: what is wrong, naming the field (HTTP 400; `ContextLengthError` for the length).
    """
    if not 1 <= start <= len(token_ids):
        raise RequestError(
            f"start must be in [1, {len(token_ids)}] for {len(token_ids)} token ids (position 0 has no "
            f"context), got {start}",
            param="start",
        )
    if len(token_ids) > max_context:
        raise ContextLengthError(
            f"{len(token_ids)} token ids to score but the context window is {max_context} tokens",
            param="token_ids",
        )
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(
            f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})", param="token_ids"
        )


def max_new_tokens(max_tokens: int, prompt_len: int, max_context: int) -> int:
    """How many tokens a completion may have: the ``max_tokens`` asked for (`SamplingParams.max_tokens`,
    whose server rules are `swarm.server.chat_service.max_tokens_for`), clipped to the room the context window
    leaves after the prompt, and at least 1 (`check_prompt_fits` refuses a prompt that leaves none).

    Args:
        max_tokens: completion tokens asked for (>= 1).
        prompt_len: prompt length in tokens.
        max_context: the model's context window in tokens.
    """
    return max(1, min(max_tokens, max_context - prompt_len))
