"""The real embedded SmolLM2-135M-Instruct end to end (one model load per session)."""

from __future__ import annotations

from typing import Any

import torch
from openai import OpenAI

from swarm.client import SwarmClient
from tests.server.test_openai_compat import recompute_logprobs


def test_embedded_model_answers_and_records_exact_logprobs(embedded_server: Any, embedded: Any) -> None:
    with SwarmClient(embedded_server.url) as client:
        with client.episode("embedded") as ep:
            oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
            reply = oa.chat.completions.create(
                model=ep.model,
                messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                max_tokens=24,
                temperature=0,
                logprobs=True,
            )
            ep.finish(1.0)
        (call,) = client.get_episode(ep.id).calls
    text = reply.choices[0].message.content
    assert "Paris" in text  # the real weights, not a random model
    assert embedded.tokenizer.decode(call.completion_ids, skip_special_tokens=True).strip() == text.strip()
    ref = recompute_logprobs(embedded.model, call.prompt_ids, call.completion_ids)
    assert torch.allclose(ref, torch.tensor(call.logprobs), atol=1e-4)
