"""Learning check: the embedded model learns a short-answer format task in the server within 15 steps.

    python bench/learning.py [--steps 15] [--lr 3e-5]

Task: questions with the instruction "Answer in at most three words."; reward 1 when the reply has
at most three words, decaying linearly to 0 at 23 words (a format reward the 135M model can learn on a
CPU in minutes). GRPO with B=4 tasks × G=4 episodes per step, full fine-tuning, in-process server.
Prints the reward per step and the rise (mean of the last 3 steps − mean of the first 3).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from openai import AsyncOpenAI
from rich.console import Console
from rich.table import Table

from swarm.batch import BatchConfig, BatchPolicy
from swarm.client import AsyncSwarmClient
from swarm.config import SamplingDefaults, ServerConfig, TrainingConfig
from swarm.server.app import create_app
from swarm.train import TrainerConfig

QUESTIONS = [
    "What color is the sky on a clear day?",
    "Which animal says moo?",
    "What is the capital of France?",
    "What do bees make?",
    "What is frozen water called?",
    "Which planet do we live on?",
    "What do you use to write on paper?",
    "What fruit is yellow and curved?",
]


def reward(text: str) -> float:
    """1.0 for at most three words, falling linearly to 0.0 at 23 words."""
    words = len(text.split())
    return max(0.0, min(1.0, 1.0 - (words - 3) / 20))


async def episode(client: AsyncSwarmClient, task: int, seed: int) -> float:
    async with client.episode(f"q{task}") as ep:
        oa = AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=5)
        r = await oa.chat.completions.create(
            model=ep.model,
            messages=[{"role": "user", "content": QUESTIONS[task] + " Answer in at most three words."}],
            max_tokens=32,
            seed=seed,
        )
        value = reward(r.choices[0].message.content or "")
        await ep.finish(value)
        return value


async def drive(url: str, steps: int, tasks_per_step: int, group: int) -> None:
    async with AsyncSwarmClient(url) as client:
        seed = 0
        for step in range(steps):
            coros = []
            for t in range(tasks_per_step):
                task = (step * tasks_per_step + t) % len(QUESTIONS)
                for _ in range(group):
                    seed += 1
                    coros.append(episode(client, task, seed))
            await asyncio.gather(*coros)
            while (await client.status()).step < step + 1:
                await asyncio.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="learning-"))
    config = ServerConfig(
        run_dir=run_dir,
        port=0,
        sampling=SamplingDefaults(temperature=1.0),
        training=TrainingConfig(
            batch=BatchConfig(policy=BatchPolicy.TASKS, batch_size=args.tasks, group_size=args.group),
            trainer=TrainerConfig(lr=args.lr, micro_batch_size=8),
            checkpoint_every=1000,
        ),
    )
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.1)
    port = server.servers[0].sockets[0].getsockname()[1]
    started = time.time()
    asyncio.run(drive(f"http://127.0.0.1:{port}", args.steps, args.tasks, args.group))
    history = server.config.app.state.runtime.training.history  # type: ignore[union-attr]
    server.should_exit = True
    thread.join()
    table = Table(title=f"GRPO on a short-answer format task, embedded SmolLM2-135M, lr {args.lr}")
    for col in ("step", "reward mean", "reward std", "loss", "grad norm", "tokens", "step s"):
        table.add_column(col, justify="right")
    for m in history:
        table.add_row(str(m.step), f"{m.reward_mean:.3f}", f"{m.reward_std:.3f}", f"{m.loss:.4f}", f"{m.grad_norm:.3f}", str(m.tokens), f"{m.time_s.total_s:.1f}")
    console = Console()
    console.print(table)
    first = sum(m.reward_mean or 0 for m in history[:3]) / 3
    last = sum(m.reward_mean or 0 for m in history[-3:]) / 3
    console.print(f"mean reward first 3 steps {first:.3f} → last 3 steps {last:.3f}: rise {last - first:+.3f} "
                  f"({time.time() - started:.0f} s wall)")


if __name__ == "__main__":
    main()
