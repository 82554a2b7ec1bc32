"""The math agent with the OpenAI SDK (``openai.AsyncOpenAI``).

Workflow: ``swarm run examples/math_openai.py --server URL --dataset examples/data/math.jsonl``.
Script: ``python examples/math_openai.py --server URL --tasks 2``.
"""

from __future__ import annotations

from typing import Any

import math_common
from openai import AsyncOpenAI

from swarm.client import LLM, Result


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """One question, one completion, reward from :func:`math_common.score`."""
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client:
        response = await client.chat.completions.create(
            model=llm.model,
            messages=math_common.messages(task),  # type: ignore[arg-type]
            max_tokens=math_common.MAX_TOKENS,
            temperature=1.0,
        )
    return math_common.score(response.choices[0].message.content or "", task)


if __name__ == "__main__":
    math_common.main(run, __doc__ or "")
