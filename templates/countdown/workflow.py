"""Countdown workflow: one puzzle, one reply with an expression in <answer></answer>.

Contract (swarm/client/workflow.py): ``async def run(task, llm) -> Result``; only the OpenAI
chat-completions API is used. ``task`` is a row written by ``data.py``.
"""

from __future__ import annotations

from typing import Any

from swarm.client.workflow import LLM, Result
from templates._loader import import_sibling

_reward = import_sibling(__name__, __file__, "reward")

# <params> (rendered by templates.render; edit values here or re-render)
PARAMS: dict[str, Any] = {
    "format_reward": 0.1,
    "max_tokens": 256,
    "temperature": 1.0,
}
# </params>

PROMPT = (
    "Using the numbers {numbers}, each exactly once, and the operations + - * / with parentheses, "
    "write an expression equal to {target}. Think briefly, then give only the expression inside "
    "<answer></answer>, for example <answer>(1 + 2) * 3</answer>."
)


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """Ask one countdown puzzle and score the reply.

    Args:
        task: ``{"id", "numbers", "target", "solution"}``.
        llm: The episode's endpoint.

    Returns:
        ``Result`` with reward in {0, format_reward, 1} and metrics ``correct``, ``format_ok`` (an
        answer expression was found) and ``completion_chars``.
    """
    numbers = ", ".join(str(n) for n in task["numbers"])
    async with llm.openai() as client:
        response = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": PROMPT.format(numbers=numbers, target=task["target"])}],
            max_tokens=PARAMS["max_tokens"],
            temperature=PARAMS["temperature"],
        )
    text = response.choices[0].message.content or ""
    reward = _reward.reward(text, task["numbers"], task["target"], format_reward=PARAMS["format_reward"])
    return Result(
        reward=reward,
        metrics={
            "correct": float(reward == 1.0),
            "format_ok": float(_reward.extract_expression(text) is not None),
            "completion_chars": float(len(text)),
        },
    )
