"""Parsing ``<tool_call>`` blocks from model output into OpenAI tool calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swarm.tracking.toolcalls import parse_tool_calls


def _calls(tool_calls: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls]


def test_plain_text_has_no_calls() -> None:
    assert parse_tool_calls("The answer is 4.") == ("The answer is 4.", [])


def test_hermes_block_with_content() -> None:
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me add."
    assert _calls(calls) == [("add", {"a": 2, "b": 3})]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")


def test_several_blocks_and_smollm2_list_form() -> None:
    text = (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>[{"name": "b", "arguments": {"x": [1, 2]}}, {"name": "c", "arguments": {"s": "é"}}]</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content is None
    assert _calls(calls) == [("a", {}), ("b", {"x": [1, 2]}), ("c", {"s": "é"})]
    assert len({c["id"] for c in calls}) == 3
    assert (
        json.loads(calls[2]["function"]["arguments"]) == {"s": "é"}
        and "é" in calls[2]["function"]["arguments"]
    )


def test_arguments_as_json_string_and_parameters_alias() -> None:
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"k\\": 1}"}</tool_call>')
    assert _calls(calls) == [("f", {"k": 1})]
    _, calls = parse_tool_calls('<tool_call>{"name": "g", "parameters": {"k": 2}}</tool_call>')
    assert _calls(calls) == [("g", {"k": 2})]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>',  # bad JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # non-object arguments
        '<tool_call>{"name": "f", "arguments": {}}',  # unclosed
        'ok <tool_call>{"name": "f", "arguments": {}}</tool_call> <tool_call>{"name": ',  # second unclosed
        "<tool_call>[]</tool_call>",  # empty list
        '<tool_call>"just a string"</tool_call>',
    ],
)
def test_malformed_output_is_returned_as_content(text: str) -> None:
    assert parse_tool_calls(text) == (text, [])


def test_ids_are_deterministic_and_depend_on_the_text_and_the_salt() -> None:
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text) == parse_tool_calls(text)
    other = 'x<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text)[1][0]["id"] != parse_tool_calls(other)[1][0]["id"]
    # The same call sampled at two places of an episode (the server salts with episode id and call index).
    first, again = parse_tool_calls(text, salt="ep-1:0"), parse_tool_calls(text, salt="ep-1:2")
    assert first[1][0]["id"] != again[1][0]["id"] and first == parse_tool_calls(text, salt="ep-1:0")
