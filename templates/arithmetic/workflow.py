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

FEWSHOT = [
    {"role": "user", "content": "What is 4 + 5? Answer with the number only."},
    {"role": "assistant", "content": "9"},
]


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """Ask one arithmetic question and score the reply.

    Args:
        task: ``{"id", "question", "answer", "level"}``.
        llm: The episode's endpoint.

    Returns:
        ``Result`` with reward 0/1 and metrics ``correct``, ``format_ok`` (exactly one number found)
        and ``completion_chars``.
    """
    messages = [*FEWSHOT] if PARAMS["fewshot"] else []
    messages.append({"role": "user", "content": f"{task['question']} Answer with the number only."})
    response = await llm.openai().chat.completions.create(
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
