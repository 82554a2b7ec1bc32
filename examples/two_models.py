"""Two models, two servers: a planner (server A) writes a plan, an executor (server B) answers.

One rollout opens an episode on each server (:class:`swarm.client.MultiEpisode` under the runner) and
finishes each with its own reward, or aborts both. With several ``--server NAME=URL`` options the
runner passes ``llm`` as a dict and accepts ``{name: reward}`` back::

    swarm run examples/two_models.py --server planner=http://127.0.0.1:8000 \\
        --server executor=http://127.0.0.1:8001 --dataset examples/data/math.jsonl
    python examples/two_models.py --planner http://127.0.0.1:8000 --executor http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse
from typing import Any

import math_common

from swarm.client import LLM, Result, run_workflow

PLAN = "Explain in one short sentence how to solve this, without giving the result: {question}"


async def _ask(llm: LLM, messages: list[dict[str, str]]) -> str:
    async with llm.openai(max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=llm.model, messages=messages, max_tokens=math_common.MAX_TOKENS, temperature=1.0
        )
    return str(reply.choices[0].message.content or "")


async def run(task: dict[str, Any], llm: dict[str, LLM]) -> dict[str, Result]:
    """Planner then executor; the executor is scored, the planner gets the same reward (it helped)."""
    plan = await _ask(llm["planner"], [{"role": "user", "content": PLAN.format(question=task["question"])}])
    messages = math_common.messages(task)
    messages[1]["content"] += f"\nHint: {plan}"
    result = math_common.score(await _ask(llm["executor"], messages), task)
    return {
        "planner": Result(reward=result.reward, metrics={"plan_chars": float(len(plan))}),
        "executor": result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--planner", required=True, help="server of the planner model")
    parser.add_argument("--executor", required=True, help="server of the executor model")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=math_common.MAX_TOKENS)
    args = parser.parse_args()
    math_common.MAX_TOKENS = args.max_tokens
    summary = run_workflow(
        run,
        {"planner": args.planner, "executor": args.executor},
        math_common.DATA,
        max_tasks=args.tasks,
        group_size=args.group_size,
        client_id="two_models",
    )
    print(f"finished={summary.finished} reward_mean={summary.train_reward_mean:.3f}")


if __name__ == "__main__":
    main()
