"""The math agent over raw HTTP (``httpx``): the chat-completions wire format by hand.

Workflow: ``swarm run examples/math_http.py --server URL --dataset examples/data/math.jsonl``.
Script: ``python examples/math_http.py --server URL --tasks 2``.
"""

from __future__ import annotations

from typing import Any

import httpx
import math_common

from swarm.client import LLM, Result


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """POST ``{base_url}/chat/completions`` with the episode key as the bearer token."""
    # 600 s: the OpenAI SDK's default, which the other examples keep (a loaded CPU server can queue a call
    # behind a training step and a full batch for minutes; a shorter timeout turns that into retries).
    async with httpx.AsyncClient(timeout=600.0) as http:
        answer = await http.post(
            f"{llm.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {llm.api_key}"},
            json={
                "model": llm.model,
                "messages": math_common.messages(task),
                "max_tokens": math_common.MAX_TOKENS,
                "temperature": 1.0,
            },
        )
        answer.raise_for_status()  # 401/5xx become httpx.HTTPStatusError: the runner classifies them
    return math_common.score(answer.json()["choices"][0]["message"]["content"] or "", task)


if __name__ == "__main__":
    math_common.main(run, __doc__ or "")
