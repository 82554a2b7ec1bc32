"""Tool calls end to end: parsed into OpenAI ``tool_calls``, spliced on the next turn, malformed ones as text.

``tool_server`` (tests/server/conftest.py) is a tiny model taught to answer two fixed prompts with a
well-formed and a malformed tool call; everything else is the real server, tokenizer and template.
"""

from __future__ import annotations

import json

import httpx
from openai import OpenAI

from swarm.client import SwarmClient
from tests.conftest import LiveServer
from tests.server.conftest import BAD_PROMPT, BAD_REPLY, GOOD_PROMPT, GOOD_REPLY, TOOLS


def test_tool_call_is_parsed_and_the_next_turn_splices_it(tool_server: LiveServer) -> None:
    with SwarmClient(tool_server.url) as client:
        with client.episode("tools") as ep:
            oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
            first = oa.chat.completions.create(
                model=ep.model, messages=GOOD_PROMPT, tools=TOOLS, temperature=0, max_tokens=40
            )
            choice = first.choices[0]
            assert choice.finish_reason == "tool_calls"
            (call,) = choice.message.tool_calls
            assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
            messages = [
                *GOOD_PROMPT,
                choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "5"},
            ]
            second = oa.chat.completions.create(
                model=ep.model, messages=messages, tools=TOOLS, temperature=0, max_tokens=5
            )
            assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
            ep.finish(1.0)
        view = client.get_episode(ep.id)
    first_call, second_call = view.calls
    assert second_call.splices == 1 and second_call.splice_mismatches == 0
    assert second_call.prompt_ids[: len(first_call.prompt_ids) + len(first_call.completion_ids)] == (
        first_call.prompt_ids + first_call.completion_ids
    )
    assert view.merge.samples == 1 and view.merge.merge_ratio == 2.0


def test_malformed_tool_call_comes_back_as_text_and_the_episode_lives_on(tool_server: LiveServer) -> None:
    with SwarmClient(tool_server.url) as client:
        with client.episode("bad-tools") as ep:
            oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
            bad = oa.chat.completions.create(
                model=ep.model, messages=BAD_PROMPT, tools=TOOLS, temperature=0, max_tokens=40
            )
            assert bad.choices[0].message.tool_calls is None
            assert bad.choices[0].finish_reason == "stop"
            assert bad.choices[0].message.content == BAD_REPLY.removesuffix("<|im_end|>")
            again = oa.chat.completions.create(
                model=ep.model, messages=GOOD_PROMPT, tools=TOOLS, temperature=0, max_tokens=40
            )
            assert again.choices[0].finish_reason == "tool_calls"
            ep.finish(0.0)
        assert client.get_episode(ep.id).status == "finished"


def test_tool_choice_none_leaves_the_text_alone_and_forced_choices_are_refused(
    tool_server: LiveServer,
) -> None:
    with SwarmClient(tool_server.url) as client, client.episode("tool-choice") as ep:
        oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
        plain = oa.chat.completions.create(
            model=ep.model,
            messages=GOOD_PROMPT,
            tools=TOOLS,
            tool_choice="none",
            temperature=0,
            max_tokens=40,
        )
        assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason == "stop"
        assert plain.choices[0].message.content == GOOD_REPLY.removesuffix("<|im_end|>")
        for choice, reason in (
            ("required", "cannot force a tool call"),
            ({"type": "function", "function": {"name": "add"}}, "cannot force a tool call"),
            ("bogus", "'bogus' is not a tool choice"),
        ):
            refused = httpx.post(
                f"{ep.base_url}/chat/completions",
                json={"model": ep.model, "messages": GOOD_PROMPT, "tools": TOOLS, "tool_choice": choice},
                headers={"Authorization": f"Bearer {ep.api_key}"},
            )
            error = refused.json()["error"]
            assert refused.status_code == 422 and error["param"] == "tool_choice", error
            assert reason in error["message"]
        ep.finish(0.0)


def test_nameless_tools_and_orphan_tool_results_are_refused_naming_the_field(tool_server: LiveServer) -> None:
    """A tool nobody could call, or a tool result answering no call, is a 4xx naming the field (OpenAI's
    rules; Anthropic's route in its own shape), and the episode records nothing."""
    orphan = [*GOOD_PROMPT, {"role": "tool", "tool_call_id": "call_nobody", "content": "5"}]
    with SwarmClient(tool_server.url) as client, client.episode("tool-rules") as ep:
        auth = {"Authorization": f"Bearer {ep.api_key}"}
        for body, param, reason in (
            (
                {"tools": [{"type": "function", "function": {"description": "no name"}}]},
                "tools",
                "not a tool name",
            ),
            (
                {"tools": [{"type": "function", "function": {"name": "two words"}}]},
                "tools",
                "not a tool name",
            ),
            ({"tools": [{"type": "retrieval"}]}, "tools", "only function tools"),
            ({"messages": orphan, "tools": TOOLS}, "messages", "matches none"),
        ):
            refused = httpx.post(
                f"{ep.base_url}/chat/completions",
                json={"model": ep.model, "messages": GOOD_PROMPT, **body},
                headers=auth,
            )
            error = refused.json()["error"]
            assert refused.status_code == 422 and reason in error["message"], error
            assert error["param"] == param, error
        anthropic = httpx.post(
            f"{tool_server.url}/v1/messages",
            json={
                "model": ep.model,
                "max_tokens": 4,
                "messages": [
                    {"role": "user", "content": "2 + 3?"},
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "5"}],
                    },
                ],
            },
            headers={"x-api-key": ep.api_key},
        )
        assert anthropic.status_code == 400 and anthropic.json()["type"] == "error", anthropic.text
        assert anthropic.json()["error"]["type"] == "invalid_request_error"
        assert "matches none" in anthropic.json()["error"]["message"]
        ep.finish(0.0)
        assert client.get_episode(ep.id).calls == []
