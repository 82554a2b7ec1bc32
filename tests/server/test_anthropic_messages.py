"""``POST /v1/messages`` driven by the official ``anthropic`` SDK against real servers on loopback.

Plain text on the shared tiny-model server; tools on the tiny model taught to answer one prompt with
a tool call (``tool_server``, tests/server/conftest.py), so the 2-turn tool loop can be compared token for
token with the same loop through the OpenAI SDK.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest
from openai import OpenAI

from swarm.client import SwarmClient
from tests.conftest import LiveServer
from tests.server.conftest import GOOD_PROMPT, TOOLS

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]


def _root(base_url: str) -> str:
    return base_url.removesuffix("/v1")


def test_sync_sdk_records_the_message_token_exactly(server: LiveServer, tokenizer: Any) -> None:
    with SwarmClient(server.url) as client:
        with client.episode("anthropic-sync") as ep:
            sdk = anthropic.Anthropic(base_url=_root(ep.base_url), api_key=ep.api_key, max_retries=0)
            reply = sdk.messages.create(
                model=ep.model,
                system="Be brief.",
                messages=QUESTION,
                max_tokens=12,
                extra_body={"temperature": 1.0},
            )
            ep.finish(1.0)
        view = client.get_episode(ep.id)
    (call,) = view.calls
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text == call.text
    assert reply.stop_reason == ("max_tokens" if call.finish_reason == "length" else "end_turn")
    assert reply.usage.input_tokens == len(call.prompt_ids)
    assert reply.usage.output_tokens == len(call.completion_ids)
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *QUESTION], add_generation_prompt=True, tokenize=False
    )
    assert tokenizer.decode(call.prompt_ids, skip_special_tokens=False) == expected


def test_bearer_key_stop_sequences_and_agent_from_metadata(server: LiveServer) -> None:
    with SwarmClient(server.url) as client:
        with client.episode("anthropic-bearer") as ep:
            sdk = anthropic.Anthropic(base_url=_root(ep.base_url), auth_token=ep.api_key, max_retries=0)
            free = sdk.messages.create(
                model=ep.model, messages=QUESTION, max_tokens=8, extra_body={"temperature": 0}
            )
            text = free.content[0].text
            assert len(text) > 1
            stop = text[1:3] if len(text) >= 3 else text[1:]
            cut = sdk.messages.create(
                model=ep.model,
                messages=QUESTION,
                max_tokens=8,
                extra_body={"temperature": 0},
                stop_sequences=[stop],
                metadata={"user_id": "judge"},
            )
            ep.finish(0.0)
        view = client.get_episode(ep.id)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.find(stop)]
    assert [c.agent for c in view.calls] == ["default", "judge"]


async def test_async_sdk_and_streaming(server: LiveServer) -> None:
    from swarm.client import AsyncSwarmClient

    async with AsyncSwarmClient(server.url) as client:
        async with client.episode("anthropic-async") as ep:
            sdk = anthropic.AsyncAnthropic(base_url=_root(ep.base_url), api_key=ep.api_key, max_retries=0)
            plain = await sdk.messages.create(model=ep.model, messages=QUESTION, max_tokens=6)
            async with sdk.messages.stream(model=ep.model, messages=QUESTION, max_tokens=10) as stream:
                pieces = [piece async for piece in stream.text_stream]
                final = await stream.get_final_message()
            await ep.finish(1.0)
        view = await client.get_episode(ep.id)
    first, streamed = view.calls
    assert plain.content[0].text == first.text
    assert "".join(pieces) == final.content[0].text == streamed.text
    assert final.usage.output_tokens == len(streamed.completion_ids)
    assert final.usage.input_tokens == len(streamed.prompt_ids)
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_stream_event_sequence_on_the_wire(server: LiveServer) -> None:
    with SwarmClient(server.url) as client, client.episode("anthropic-sse") as ep:
        body = {"model": ep.model, "messages": QUESTION, "max_tokens": 5, "stream": True}
        headers = {"x-api-key": ep.api_key, "anthropic-version": "2023-06-01"}
        with httpx.stream("POST", f"{server.url}/v1/messages", json=body, headers=headers) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        ep.finish(0.0)
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    payloads = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [p["type"] for p in payloads] == names
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) <= {"content_block_delta"}
    assert payloads[-2]["usage"]["output_tokens"] == 5 and payloads[-2]["delta"]["stop_reason"] in (
        "max_tokens",
        "end_turn",
    )


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"top_k": 5}, "top_k"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"tool_choice": {"type": "any"}, "tools": ANTHROPIC_TOOLS}, "tool_choice.type"),
        ({"container": "c1"}, "container"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}],
                    }
                ]
            },
            "image",
        ),
    ],
)
def test_unsupported_fields_are_refused_in_anthropic_shape(
    server: LiveServer, extra: dict[str, Any], field: str
) -> None:
    with SwarmClient(server.url) as client, client.episode("anthropic-refused") as ep:
        sdk = anthropic.Anthropic(base_url=_root(ep.base_url), api_key=ep.api_key, max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as caught:  # extra_body: as any client sends them
            sdk.messages.create(model=ep.model, messages=QUESTION, max_tokens=4, extra_body=extra)
        ep.finish(0.0)
        assert client.get_episode(ep.id).calls == []
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and field in body["error"]["message"]


def test_wrong_key_and_wrong_model_are_anthropic_errors(server: LiveServer) -> None:
    sdk = anthropic.Anthropic(base_url=server.url, api_key="ep-nonsense", max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError) as caught:  # a wrong key: 403, as Anthropic's
        sdk.messages.create(model="x", messages=QUESTION, max_tokens=4)
    assert caught.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    absent = httpx.post(
        f"{server.url}/v1/messages", json={"model": "x", "messages": QUESTION, "max_tokens": 4}
    )
    assert absent.status_code == 401  # none at all: 401
    assert absent.json()["error"]["type"] == "authentication_error"
    with SwarmClient(server.url) as client, client.episode("anthropic-model") as ep:
        sdk = anthropic.Anthropic(base_url=_root(ep.base_url), api_key=ep.api_key, max_retries=0)
        with pytest.raises(anthropic.NotFoundError) as missing:
            sdk.messages.create(model="claude-sonnet-4-5", messages=QUESTION, max_tokens=4)
        ep.finish(0.0)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


# -- tools ---------------------------------------------------------------------------------------------------
def _anthropic_loop(sdk: anthropic.Anthropic, model: str, *, stream: bool) -> list[Any]:
    """Two turns: the tool call, then the answer after the tool's result (the SDK's tool loop)."""
    messages: list[dict[str, Any]] = list(GOOD_PROMPT)
    replies = []
    for max_tokens in (40, 5):
        args: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
            "max_tokens": max_tokens,
            "extra_body": {"temperature": 0},
        }
        if stream:
            with sdk.messages.stream(**args) as s:
                reply = s.get_final_message()
        else:
            reply = sdk.messages.create(**args)
        replies.append(reply)
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            break
        messages.append({"role": "assistant", "content": reply.content})  # the SDK's own blocks
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "5"} for u in uses],
            }
        )
    return replies


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop_merges_exactly_like_the_openai_path(tool_server: LiveServer, stream: bool) -> None:
    with SwarmClient(tool_server.url) as client:
        with client.episode("anthropic-tools") as ep:
            sdk = anthropic.Anthropic(base_url=_root(ep.base_url), api_key=ep.api_key, max_retries=0)
            first, second = _anthropic_loop(sdk, ep.model, stream=stream)
            ep.finish(1.0)
        anthropic_view = client.get_episode(ep.id)
        with client.episode("openai-tools") as ep:
            oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
            one = oa.chat.completions.create(
                model=ep.model, messages=GOOD_PROMPT, tools=TOOLS, temperature=0, max_tokens=40
            )
            (call,) = one.choices[0].message.tool_calls or []
            messages = [
                *GOOD_PROMPT,
                one.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "5"},
            ]
            oa.chat.completions.create(
                model=ep.model, messages=messages, tools=TOOLS, temperature=0, max_tokens=5
            )
            ep.finish(1.0)
        openai_view = client.get_episode(ep.id)
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "add" and use.input == {"a": 2, "b": 3}
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # the same tokens were recorded, spliced and merged as through chat completions
    a_calls, o_calls = anthropic_view.calls, openai_view.calls
    assert [(c.prompt_ids, c.completion_ids) for c in a_calls] == [
        (c.prompt_ids, c.completion_ids) for c in o_calls
    ]
    assert a_calls[1].splices == 1 and a_calls[1].splice_mismatches == 0
    assert anthropic_view.merge.samples == 1 and anthropic_view.merge.merge_ratio == 2.0
    (a_sample,), (o_sample,) = anthropic_view.samples, openai_view.samples
    assert a_sample.input_ids == o_sample.input_ids and a_sample.loss_mask == o_sample.loss_mask
    assert a_sample.behaviour_logprobs == o_sample.behaviour_logprobs


def test_streamed_tool_use_arrives_as_input_json_delta(tool_server: LiveServer) -> None:
    with SwarmClient(tool_server.url) as client, client.episode("anthropic-tool-sse") as ep:
        body = {
            "model": ep.model,
            "messages": GOOD_PROMPT,
            "tools": ANTHROPIC_TOOLS,
            "max_tokens": 40,
            "temperature": 0,
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{tool_server.url}/v1/messages", json=body, headers={"x-api-key": ep.api_key}
        ) as r:
            payloads = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        ep.finish(0.0)
    starts = [p for p in payloads if p["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["tool_use"]
    assert starts[0]["content_block"]["input"] == {}
    deltas = [p["delta"] for p in payloads if p["type"] == "content_block_delta"]
    assert [d["type"] for d in deltas] == ["input_json_delta"]
    assert json.loads(deltas[0]["partial_json"]) == {"a": 2, "b": 3}
    assert payloads[-2]["delta"]["stop_reason"] == "tool_use"


def test_count_tokens_is_the_prompt_length_the_message_then_has(server: LiveServer) -> None:
    with SwarmClient(server.url) as client:
        with client.episode("anthropic-count") as ep:
            sdk = anthropic.Anthropic(base_url=_root(ep.base_url), api_key=ep.api_key, max_retries=0)
            counted = sdk.messages.count_tokens(model=ep.model, system="Be brief.", messages=QUESTION)
            reply = sdk.messages.create(model=ep.model, system="Be brief.", messages=QUESTION, max_tokens=2)
            ep.finish(0.0)
        (call,) = client.get_episode(ep.id).calls  # counting records nothing
    assert counted.input_tokens == reply.usage.input_tokens == len(call.prompt_ids)
