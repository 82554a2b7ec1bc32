"""The math agent with LangChain (``langchain_openai.ChatOpenAI``).

Workflow: ``swarm run examples/math_langchain.py --server URL --dataset examples/data/math.jsonl``.
Script: ``python examples/math_langchain.py --server URL --tasks 2``.
"""

from __future__ import annotations

from typing import Any

import math_common
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

from swarm.client import LLM, Result


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """The same agent as ``math_openai.py``, through a LangChain chat model."""
    chat = ChatOpenAI(
        base_url=llm.base_url,
        api_key=llm.api_key,  # type: ignore[arg-type]
        model=llm.model,
        max_tokens=math_common.MAX_TOKENS,  # type: ignore[call-arg]
        temperature=1.0,
        max_retries=0,
    )
    prompt = math_common.messages(task)
    reply = await chat.ainvoke([SystemMessage(prompt[0]["content"]), HumanMessage(prompt[1]["content"])])
    return math_common.score(str(reply.content), task)


if __name__ == "__main__":
    math_common.main(run, __doc__ or "")
