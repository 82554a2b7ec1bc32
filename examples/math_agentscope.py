"""The math agent with AgentScope (an ``agentscope.agent.Agent`` over its ``OpenAIChatModel``).

AgentScope 2's agent adds a runtime-state reminder (the time) to every reasoning step by default; it
is switched off here so that the agent sends exactly the prompt of the other math examples (the
framework comparison in ``bench/frameworks.py`` then differs only in the framework).

Workflow: ``swarm run examples/math_agentscope.py --server URL --dataset examples/data/math.jsonl``.
Script: ``python examples/math_agentscope.py --server URL --tasks 2``.
"""

from __future__ import annotations

from typing import Any

import math_common
from agentscope.agent import Agent, InjectionConfig
from agentscope.credential import OpenAICredential
from agentscope.message import Msg, TextBlock
from agentscope.model import OpenAIChatModel

from swarm.client import LLM, Result


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """One question, one agent reply, reward from :func:`math_common.score`."""
    model = OpenAIChatModel(
        OpenAICredential(api_key=llm.api_key, base_url=llm.base_url),
        llm.model,
        parameters=OpenAIChatModel.Parameters(max_tokens=math_common.MAX_TOKENS, temperature=1.0),
        stream=False,
        max_retries=0,
    )
    agent = Agent(  # a fresh agent per episode: its state (memory) is this episode's conversation
        name="calculator",
        system_prompt=math_common.SYSTEM,
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    try:
        reply = await agent.reply(Msg(name="user", role="user", content=[TextBlock(text=task["question"])]))
    finally:
        await model.client.close()
    text = "".join(block.text for block in reply.content if isinstance(block, TextBlock))
    return math_common.score(text, task)


if __name__ == "__main__":
    math_common.main(run, __doc__ or "")
