"""Held-out evaluation client, run as a subprocess: ``python -m a3r.swarmops.evaluate WORKFLOW --server URL ...``.

Each task of the dataset is attempted ``--samples`` times as ``kind=eval`` episodes (recorded by the
server, never trained), at most ``--concurrency`` at once, each within ``--episode-timeout`` seconds.
One JSON line per ended attempt goes to ``--out`` in the client runner's ``progress.jsonl`` format
(``kind``, ``round``, ``task_id``, ``member``, ``status``, ``reward``, ``time``), so
`a3r.study.analysis.read_progress` reads both. The workflow is the frozen evaluator copy of a study, not
the patchable training workflow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]


async def _evaluate(args: argparse.Namespace) -> int:
    from swarm.client import AsyncSwarmClient, TaskSet, load_workflow
    from swarm.client.workflow import Result

    run = load_workflow(args.workflow)
    tasks = list(TaskSet(args.dataset))[: args.max_tasks] if args.max_tasks else list(TaskSet(args.dataset))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    limiter = asyncio.Semaphore(args.concurrency)
    failures = 0

    token = os.environ.get("SWARM_CLIENT_TOKEN") or None  # a3r passes it in the environment
    async with AsyncSwarmClient(args.server, client_id=args.client_id, client_token=token) as client:
        with out.open("a", encoding="utf-8") as sink:

            async def attempt(task: Any, member: int) -> None:
                nonlocal failures
                record: dict[str, Any] = {
                    "kind": "eval",
                    "round": args.round,
                    "task_id": task.task_id,
                    "member": member,
                }
                async with limiter:
                    try:
                        async with client.episode(task.task_id, kind="eval") as ep:
                            output = await asyncio.wait_for(run(task.data, ep.llm), args.episode_timeout)
                            if isinstance(output, Result):
                                reward = output.reward
                            elif isinstance(output, int | float):
                                reward = float(output)
                            else:
                                raise TypeError("evaluation needs a single-server workflow (one reward)")
                            await ep.finish(reward)
                        record |= {"status": "finished", "reward": reward}
                    except Exception as exc:
                        failures += 1
                        record |= {
                            "status": "aborted",
                            "reward": None,
                            "error": f"{type(exc).__name__}: {exc}"[:500],
                        }
                record["time"] = time.time()
                sink.write(json.dumps(record) + "\n")
                sink.flush()

            await asyncio.gather(*(attempt(task, m) for task in tasks for m in range(args.samples)))
    print(json.dumps({"attempts": len(tasks) * args.samples, "failures": failures}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see module docstring); returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m a3r.swarmops.evaluate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("workflow")
    parser.add_argument("--server", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tasks", type=int, default=None)
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--episode-timeout", type=float, default=300.0)
    parser.add_argument("--client-id", default="a3r-eval")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.concurrency < 1:
        parser.error("--samples and --concurrency must be >= 1")
    return asyncio.run(_evaluate(args))


if __name__ == "__main__":
    sys.exit(main())
