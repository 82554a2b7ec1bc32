"""Chat messages are validated once: models render as they are, dicts are validated by the same models."""

from __future__ import annotations

from typing import Any

import pytest
from tracking_sim import TemplateSetup

from swarm.tracking.errors import PromptError
from swarm.tracking.messages import ChatMessage, parse_messages

CONVERSATION: list[dict[str, Any]] = [
    {"role": "developer", "content": [{"type": "text", "text": "Use"}, {"type": "text", "text": "tools."}]},
    {"role": "user", "content": "2+3?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": ""}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
]


def test_models_and_dicts_render_the_same(setups: dict[str, TemplateSetup]) -> None:
    renderer = setups["smollm2"].renderer()
    models = [ChatMessage.model_validate(m) for m in CONVERSATION]
    assert renderer.render(models) == renderer.render(CONVERSATION)
    assert models[0].text() == "Use\ntools." and models[2].tool_calls is not None
    assert models[2].tool_calls[0].function.parsed_arguments() == {}  # an empty string: no arguments


def test_validated_models_are_taken_as_they_are() -> None:
    models = [ChatMessage(role="user", content="hi")]
    assert parse_messages(models)[0] is models[0]


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"role": "user"}, "messages[0]: a user message needs content"),
        ({"role": "assistant"}, "messages[0]: an assistant message needs content"),
        ({"role": "user", "content": {"text": "x"}}, "messages[0].content: content must be a string"),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1"}}]},
            "messages[0].tool_calls[0].function.arguments: not valid JSON",
        ),
    ],
)
def test_a_bad_dict_names_the_field(message: dict[str, Any], problem: str) -> None:
    with pytest.raises(PromptError) as info:
        parse_messages([message])
    assert str(info.value).startswith(problem) and info.value.param == "messages"
