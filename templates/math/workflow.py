"""Math workflow: one question, one completion, reward 1 when the boxed answer is right.

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
    "max_completion_chars": 20000,
    "max_tokens": 1024,
    "temperature": 1.0,
}
# </params>

PROMPT = "{problem}\n\nSolve the problem step by step, then write only the final answer inside \\boxed{{}}."


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """Ask the model one problem and score its final answer.

    Args:
        task: ``{"id", "problem", "answer", ...}``.
        llm: The episode's endpoint.

    Returns:
        ``Result`` with reward 0/1 and metrics ``correct``, ``format_ok`` (one final answer found),
        ``truncated`` (stopped by ``max_tokens``) and ``completion_chars``.
    """
    async with llm.openai() as client:
        response = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": PROMPT.format(problem=task["problem"])}],
            max_tokens=PARAMS["max_tokens"],
            temperature=PARAMS["temperature"],
        )
    choice = response.choices[0]
    text = choice.message.content or ""
    reward = _reward.reward(text, str(task["answer"]), max_completion_chars=PARAMS["max_completion_chars"])
    extraction = _reward.extract_final_answer(text, max_completion_chars=PARAMS["max_completion_chars"])
    return Result(
        reward=reward,
        metrics={
            "correct": reward,
            "format_ok": float(extraction.status == _reward.AnswerStatus.OK),
            "truncated": float(choice.finish_reason == "length"),
            "completion_chars": float(len(text)),
        },
    )
