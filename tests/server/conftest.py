"""Server-test fixtures: a tiny model taught to call a tool (shared by the OpenAI and Anthropic tool tests).

A tiny random model cannot be asked to call a tool, so the fixture teaches one: a 2-layer model of the
embedded architecture is fitted (teacher forcing, a few hundred Adam steps) to answer two fixed prompts
with a well-formed and a malformed tool call. Everything else is the real server, tokenizer and template.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

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


@pytest.fixture(scope="session")
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
