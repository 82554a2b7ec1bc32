"""Two models trained together on werewolves: the werewolves team on one server, the village on another.

    python bench/werewolves_teams.py [--steps 3] [--group 4] [--lora-rank 16] [--lr 2e-4]

Non-shared parameters (docs/ARCHITECTURE.md §Multi-server finish): two in-process swarm servers, each
with its own copy of the embedded SmolLM2-135M (LoRA), training GRPO with B=1 task × G games per step.
The rendered werewolves template (default 5-player game, 2 days) runs with ``llm`` = {"werewolves": A,
"village": B}; trainable agents are the werewolf (on A) and the seer, witch and hunter (on B); the
villager plays on B untrained. Every game is one multi-server episode finished atomically. Prints, per
step and server, the reward, the trained (loss-mask) tokens and the werewolves' win rate of the step's
games, then the first/last-step change with the game count (a short run: the uncertainty is large).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from rich.console import Console
from rich.table import Table

from swarm.batch import BatchConfig, BatchPolicy
from swarm.client import AsyncSwarmClient, Runner, RunnerConfig, TaskSet, load_workflow
from swarm.config import ServerConfig, TrainingConfig
from swarm.server.app import create_app
from swarm.train import LoraSettings, TrainerConfig
from templates import render

TRAINED = ["werewolf_1", "seer_1", "witch_1", "hunter_1"]


def start(config: ServerConfig) -> tuple[uvicorn.Server, threading.Thread, str]:
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.1)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}"


COLUMNS = (
    "step", "server", "samples", "loss tokens", "reward mean ± std", "invalid / game", "werewolves won",
    "grad norm", "step s",
)  # fmt: skip


def step_rows(servers: dict[str, Any], step: int) -> list[tuple[str, ...]]:
    """One row per server for policy version ``step``: its batch and the games it trained on."""
    rows = []
    for team, (server, _, _) in servers.items():
        runtime = server.config.app.state.runtime
        episodes = [
            e for e in runtime.pool.recent(100_000) if e.client_id == "bench" and e.trained_step == step
        ]
        for m in (m for m in runtime.training.history if m.step == step):
            won = [e.metrics.get("werewolves_won", 0.0) for e in episodes]
            invalid = [e.metrics.get("invalid_actions", 0.0) for e in episodes]
            rows.append(
                (
                    str(m.step),
                    team,
                    str(m.samples),
                    str(m.tokens),
                    f"{m.reward_mean or 0.0:.3f} ± {m.reward_std or 0.0:.3f}",
                    f"{statistics.fmean(invalid):.2f}" if invalid else "-",
                    f"{sum(won):.0f} of {len(won)}" if won else "-",
                    f"{m.grad_norm:.3f}",
                    f"{m.time_s.total_s:.0f}",
                )
            )
    return rows


async def drive(
    workflow: Any, servers: dict[str, Any], tasks: Path, steps: int, group: int, console: Console
) -> list[tuple[str, ...]]:
    """One task (G games) per step; wait for both servers' update before the next; print each step's rows
    as soon as both servers have it (a run stopped early keeps what it printed)."""
    clients = {
        team: AsyncSwarmClient(url, client_id="bench", retry=Runner.default_retry())
        for team, (_, _, url) in servers.items()
    }
    rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    done: list[tuple[str, ...]] = []
    try:
        for step in range(steps):
            started = time.time()
            config = RunnerConfig(
                group_size=group, concurrency=group, trainable_agents=TRAINED, client_id="bench"
            )
            one = TaskSet(rows[step : step + 1])
            await Runner(workflow, clients, one, config, show_progress=False).run()
            played = time.time() - started
            for client in clients.values():
                while (await client.status()).step < step + 1:
                    await asyncio.sleep(0.5)
            new = step_rows(servers, step + 1)
            done += new
            console.print(
                f"step {step + 1}: games {played:.0f} s, step done at {time.time() - started:.0f} s; "
                + " | ".join(" · ".join(f"{c}={v}" for c, v in zip(COLUMNS, row, strict=True)) for row in new)
            )
    finally:
        for client in clients.values():
            await client.aclose()
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-4)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="werewolves-teams-"))
    rendered = render("werewolves", {"n_tasks": args.steps, "train_roles": "all"}, root / "game")
    lora = LoraSettings(r=args.lora_rank, alpha=2 * args.lora_rank) if args.lora_rank else None
    servers = {}
    for team in ("werewolves", "village"):
        config = ServerConfig(
            run_dir=root / team,
            port=0,
            training=TrainingConfig(
                batch=BatchConfig(policy=BatchPolicy.TASKS, batch_size=1, group_size=args.group),
                trainer=TrainerConfig(lr=args.lr, micro_batch_size=4, lora=lora),
                checkpoint_every=1000,
            ),
        )
        servers[team] = start(config)
    started = time.time()
    console = Console()
    console.print(f"run dir {root}")
    done = asyncio.run(
        drive(
            load_workflow(str(rendered.workflow)),
            servers,
            rendered.folder / "tasks.jsonl",
            args.steps,
            args.group,
            console,
        )
    )
    wall = time.time() - started
    table = Table(
        title=f"werewolves, two embedded SmolLM2-135M (LoRA r={args.lora_rank}, lr {args.lr}), G={args.group}"
    )
    for col in COLUMNS:
        table.add_column(col, justify="right")
    for row in done:
        table.add_row(*row)
    for server, thread, _ in servers.values():
        server.should_exit = True
        thread.join()
    console.print(table)
    console.print(
        f"{args.steps} steps, {args.steps * args.group} games, {wall:.0f} s wall (2 servers, 1 process)"
    )


if __name__ == "__main__":
    main()
