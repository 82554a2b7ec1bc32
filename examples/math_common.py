"""Shared by the math examples: the prompt, the reward and the script entry point.

The math examples (OpenAI SDK, LangChain, AgentScope, raw HTTP) are the same agent: one user message, one
completion, reward 1.0 when the last integer in the reply equals the answer. Each file is a workflow
for ``swarm run`` and also a script::

    swarm run examples/math_openai.py --server http://127.0.0.1:8000 --dataset examples/data/math.jsonl
    python examples/math_openai.py --server http://127.0.0.1:8000 --tasks 2 --group-size 2
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from swarm.client import Result, run_workflow

DATA = Path(__file__).parent / "data" / "math.jsonl"
SYSTEM = "You are a careful calculator. Reply with the final number only."
MAX_TOKENS = 48
"""Completion cap of every example call (scripts take --max-tokens)."""
_INTEGER = re.compile(r"-?\d+")


def messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """The chat for one task: a system line and the question."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]


def score(text: str, task: dict[str, Any]) -> Result:
    """Reward 1.0 when the reply's last integer is the answer; metric ``has_number`` for format."""
    numbers = _INTEGER.findall(text or "")
    correct = bool(numbers) and numbers[-1] == str(task["answer"])
    return Result(
        reward=1.0 if correct else 0.0,
        metrics={"has_number": float(bool(numbers)), "chars": float(len(text or ""))},
    )


def main(run: Callable[[dict[str, Any], Any], Awaitable[Result]], about: str) -> None:
    """Script entry: run the workflow on the first tasks of ``data/math.jsonl`` against a server."""
    global MAX_TOKENS
    parser = argparse.ArgumentParser(description=about)
    parser.add_argument("--server", required=True, help="swarm server root, e.g. http://127.0.0.1:8000")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--state-dir", type=Path, default=None, help="resume file folder (default: none)")
    args = parser.parse_args()
    MAX_TOKENS = args.max_tokens
    summary = run_workflow(
        run,
        args.server,
        DATA,
        max_tasks=args.tasks,
        group_size=args.group_size,
        concurrency=args.concurrency,
        state_dir=args.state_dir,
        client_id=Path(sys.argv[0]).stem,  # the example's name: math_openai, math_http, ...
    )
    print(
        f"finished={summary.finished} agent_failures={summary.agent_failures} "
        f"infra_failures={summary.infra_failures} reward_mean={summary.train_reward_mean:.3f}"
    )
