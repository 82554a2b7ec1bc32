"""Cocktail training: two clients with different task families feed one server; its quotas set the mix.

The server admits a train episode of family f only while ``count_f + 1 ≤ share_f · (N + 1) + slack``
over the episodes admitted since its last training step; a client over its share gets
``429 + Retry-After`` and its :class:`~swarm.client.AsyncSwarmClient` waits exactly that long and tries
again (busy answers do not use up retry attempts). So the trained batches follow the configured
shares, however fast each client is. Here the ``count`` client runs 4× the concurrency of the
``math`` client, and the quotas still give math 75 % of each batch::

    swarm serve --port 8000 &
    python examples/cocktail.py --server http://127.0.0.1:8000 --math-share 0.75

The same with two shells and ``swarm run``: ``PATCH /api/v1/config {"quotas": {...}}`` once, then
``swarm run examples/math_openai.py --dataset examples/data/math.jsonl --family math`` and
``swarm run examples/math_openai.py --dataset examples/data/count.jsonl --family count``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import math_common
import math_openai

from swarm.client import AsyncSwarmClient, Runner, RunnerConfig, RunSummary, SwarmClient, TaskSet

DATA = Path(__file__).parent / "data"


async def cocktail(
    url: str, tasks: int, group_size: int, client_token: str | None = None
) -> dict[str, RunSummary]:
    """Run the math client (concurrency 2) and the count client (concurrency 8) together."""
    plans = {"math": ("math.jsonl", 2), "count": ("count.jsonl", 8)}
    runners = []
    clients = []
    for family, (data, concurrency) in plans.items():
        client = AsyncSwarmClient(
            url, client_id=f"cocktail-{family}", client_token=client_token, retry=Runner.default_retry()
        )
        clients.append(client)
        config = RunnerConfig(
            group_size=group_size,
            concurrency=concurrency,
            max_tasks=tasks,
            family=family,
            client_id=f"cocktail-{family}",
        )
        runners.append(Runner(math_openai.run, {"default": client}, TaskSet(DATA / data), config))
    try:
        summaries = await asyncio.gather(*(r.run() for r in runners))
    finally:
        for client in clients:
            await client.aclose()
    return dict(zip(plans, summaries, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", required=True)
    parser.add_argument("--math-share", type=float, default=0.75)
    parser.add_argument("--tasks", type=int, default=8, help="tasks per client")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--admin-token", default=os.environ.get("SWARM_ADMIN_TOKEN"))
    parser.add_argument("--client-token", default=os.environ.get("SWARM_CLIENT_TOKEN"))
    parser.add_argument("--max-tokens", type=int, default=math_common.MAX_TOKENS)
    args = parser.parse_args()
    math_common.MAX_TOKENS = args.max_tokens
    with SwarmClient(args.server, admin_token=args.admin_token) as admin:
        admin.patch_config(quotas={"math": args.math_share, "count": round(1 - args.math_share, 6)})
    for family, summary in asyncio.run(
        cocktail(args.server, args.tasks, args.group_size, args.client_token)
    ).items():
        print(f"{family}: finished={summary.finished} reward_mean={summary.train_reward_mean:.3f}")


if __name__ == "__main__":
    main()
