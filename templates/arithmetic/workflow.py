"""Arithmetic workflow: one question, a bare-number reply, reward 1 when it is right.

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
    "fewshot": True,
    "max_tokens": 16,
    "temperature": 1.0,
}
# </params>

FEWSHOT_QA = (("What is 4 + 5?", "9"), ("What is 2 + 1?", "3"), ("What is 6 + 0?", "6"))
"""Solved examples shown first when ``fewshot`` is on (three beat one for SmolLM2-135M: 0.25 vs 0.19
mean level-1 reward on the same 32 tasks)."""
SUFFIX = " Answer with the number only."


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """Ask one arithmetic question and score the reply.

    Args:
        task: ``{"id", "question", "answer", "level"}``.
        llm: The episode's endpoint.

    Returns:
        ``Result`` with reward 0/1 and metrics ``correct``, ``format_ok`` (exactly one number found)
        and ``completion_chars``.
    """
    messages = []
    if PARAMS["fewshot"]:
        for question, answer in FEWSHOT_QA:
            messages.append({"role": "user", "content": question + SUFFIX})
            messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": task["question"] + SUFFIX})
    async with llm.openai() as client:
        response = await client.chat.completions.create(
            model=llm.model,
            messages=messages,
            max_tokens=PARAMS["max_tokens"],
            temperature=PARAMS["temperature"],
        )
    text = response.choices[0].message.content or ""
    reward = _reward.reward(text, str(task["answer"]))
    extraction = _reward.extract_short_number(text, max_completion_chars=_reward.MAX_COMPLETION_CHARS)
    return Result(
        reward=reward,
        metrics={
            "correct": reward,
            "format_ok": float(extraction.status == _reward.AnswerStatus.OK),
            "completion_chars": float(len(text)),
        },
    )
