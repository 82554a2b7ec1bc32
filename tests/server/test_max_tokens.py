"""A chat call's ``max_tokens``: every server rule in `max_tokens_for`, the context clip in the engines'
`max_new_tokens` (pure functions; the live routes are `tests/server/test_limits.py`)."""

from __future__ import annotations

import pytest

from swarm.engine.limits import max_new_tokens
from swarm.errors import RequestError
from swarm.protocol import ChatCompletionRequest
from swarm.server.anthropic_format import MessagesRequest, to_chat_request
from swarm.server.chat_service import max_tokens_for

HI = [{"role": "user", "content": "hi"}]


def chat(**fields: int) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=HI, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "default", "cap", "expected"),
    [
        ({}, 256, None, 256),  # the server's default
        ({}, 256, 64, 64),  # a default above the cap is lowered to it
        ({}, 16, 64, 16),
        ({"max_tokens": 40}, 256, 64, 40),
        ({"max_tokens": 40, "max_completion_tokens": 8}, 256, None, 8),  # the newer field wins
        ({"max_tokens": 999}, 256, None, 999),
    ],
)
def test_max_tokens_for(fields: dict[str, int], default: int, cap: int | None, expected: int) -> None:
    assert max_tokens_for(chat(**fields), default, cap) == expected


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_field_over_the_cap_is_refused_by_name(field: str) -> None:
    with pytest.raises(RequestError) as refused:
        max_tokens_for(chat(**{field: 65}), 16, 64)
    assert refused.value.status_code == 422 and refused.value.param == field
    assert str(refused.value) == f"{field}: 65 is above this server's cap of 64"


def test_an_anthropic_request_takes_the_same_rules() -> None:
    body = MessagesRequest.model_validate({"model": "m", "max_tokens": 65, "messages": HI})
    with pytest.raises(RequestError, match="max_tokens: 65 is above"):
        max_tokens_for(to_chat_request(body), 16, 64)
    assert max_tokens_for(to_chat_request(body), 16, None) == 65


@pytest.mark.parametrize(
    ("asked", "prompt_len", "context", "expected"),
    [(10, 5, 100, 10), (10, 95, 100, 5), (10, 99, 100, 1), (10, 100, 100, 1)],
)
def test_max_new_tokens_clips_to_the_context(
    asked: int, prompt_len: int, context: int, expected: int
) -> None:
    assert max_new_tokens(asked, prompt_len, context) == expected


@pytest.mark.parametrize("cap", [None, 10_000])
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_field_over_the_context_is_refused_by_name(field: str, cap: int | None) -> None:
    """Above the whole window (no cap, or a cap above the window): 400 naming the window, as vLLM."""
    from swarm.errors import ContextLengthError

    with pytest.raises(ContextLengthError) as refused:
        max_tokens_for(chat(**{field: 8193}), 16, cap, 8192)
    assert refused.value.status_code == 400 and refused.value.param == field
    assert str(refused.value).startswith(
        f"{field}: 8193 is more than this model's maximum context length of 8192"
    )
    assert (
        max_tokens_for(chat(**{field: 8192}), 16, cap, 8192) == 8192
    )  # the engine clips it to the room left
