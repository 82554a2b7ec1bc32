"""Tool calls end to end: parsed into OpenAI ``tool_calls``, spliced on the next turn, malformed ones as text.

A tiny random model cannot be asked to call a tool, so the fixture teaches one: a 2-layer model of the
embedded architecture is fitted (teacher forcing, a few hundred Adam steps) to answer two fixed prompts
with a well-formed and a malformed tool call. Everything else is the real server, tokenizer and template.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI

from swarm.client import SwarmClient
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.tracking.render import PromptRenderer
from tests.conftest import LiveServer, build_tiny_model, make_server

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
GOOD_PROMPT = [{"role": "user", "content": "Add 2 and 3 with the tool."}]
BAD_PROMPT = [{"role": "user", "content": "Add them, badly."}]
GOOD_REPLY = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
BAD_REPLY = '<tool_call>\n{"name": "add", "arguments": {"a": 2,\n</tool_call><|im_end|>'


def fit(model: Any, pairs: list[tuple[list[int], list[int]]], steps: int = 400) -> None:
    """Teacher-force ``completion`` after ``prompt`` for every pair until greedy decoding reproduces it."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = torch.zeros(())
        for prompt, completion in pairs:
            ids = torch.tensor([prompt + completion])
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
            loss = loss + torch.nn.functional.cross_entropy(logits, torch.tensor(completion))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.02:  # far below any competing token: greedy decoding reproduces every pair
            break
    model.eval()


@pytest.fixture(scope="module")
def tool_server(
    tmp_path_factory: pytest.TempPathFactory, embedded_source: Any, tokenizer: Any
) -> Iterator[LiveServer]:
    renderer = PromptRenderer(tokenizer)
    pairs = []
    for prompt, reply in ((GOOD_PROMPT, GOOD_REPLY), (BAD_PROMPT, BAD_REPLY)):
        prompt_ids = renderer.render(prompt, TOOLS).prompt_ids
        pairs.append((prompt_ids, tokenizer.encode(reply, add_special_tokens=False)))
    model = build_tiny_model(embedded_source, seed=3)
    fit(model, pairs)
    engine = HFEngine(model, tokenizer, "tool-model")
    live = make_server(Path(tmp_path_factory.mktemp("tools")), engine, training=TrainingConfig(enabled=False))
    yield live
    live.stop()
    engine.close()


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
