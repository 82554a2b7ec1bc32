"""Learning check: the embedded model learns a short-answer format task in the server within 15 steps.

    python bench/learning.py [--steps 15] [--lr 3e-5]
    python bench/learning.py --lora-rank 16 --lr 2e-4 --mixed-precision bf16   # LoRA on bf16 weights

Task: one-word-answer questions with the instruction "Answer in at most three words.". Reward
(:func:`reward`): 0.5 when the reply contains the answer word, plus up to 0.5 for brevity (full at
three words or fewer, falling linearly to 0 at 23 words; an empty reply earns nothing). A reply that is
short but wrong is capped at 0.5, so the optimum needs the right answer said briefly — a pure length
reward was hacked within 5 steps by short nonsense ("WOV", "zipper"). GRPO with B=4 tasks × G=4
episodes per step, full fine-tuning, in-process server. Prints the reward and the correct-answer rate
per step and the rise (mean of the last 3 steps − mean of the first 3).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import uvicorn
from openai import AsyncOpenAI
from rich.console import Console
from rich.table import Table

from swarm.batch import BatchConfig, BatchPolicy
from swarm.client import AsyncSwarmClient, Result
from swarm.config import SamplingDefaults, ServerConfig, TrainingConfig
from swarm.server.app import create_app
from swarm.train import LoraSettings, TrainerConfig

QUESTIONS = [
    ("What color is the sky on a clear day?", "blue"),
    ("Which animal says moo?", "cow"),
    ("What is the capital of France?", "paris"),
    ("What do bees make?", "honey"),
    ("What is frozen water called?", "ice"),
    ("Which planet do we live on?", "earth"),
    ("What is the opposite of hot?", "cold"),
    ("What fruit is yellow and curved?", "banana"),
]


def correct(text: str, answer: str) -> bool:
    return answer in text.lower()


def reward(text: str, answer: str) -> float:
    """0.5 for containing ``answer`` + up to 0.5 for brevity (≤ 3 words full, 0 at 23 words or empty)."""
    words = len(text.split())
    brevity = 0.0 if words == 0 else max(0.0, min(1.0, 1.0 - (words - 3) / 20))
    return 0.5 * correct(text, answer) + 0.5 * brevity


async def episode(client: AsyncSwarmClient, task: int, seed: int) -> tuple[float, float, int]:
    question, answer = QUESTIONS[task]
    async with client.episode(f"q{task}") as ep:
        oa = AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=5)
        r = await oa.chat.completions.create(
            model=ep.model,
            messages=[{"role": "user", "content": question + " Answer in at most three words."}],
            max_tokens=32,
            seed=seed,
        )
        text = r.choices[0].message.content or ""
        value = reward(text, answer)
        ok, words = float(correct(text, answer)), len(text.split())
        await ep.finish(Result(reward=value, metrics={"correct": ok, "words": words}))
        return value, ok, words


Row = TypeVar("Row")


async def drive(
    url: str,
    steps: int,
    tasks_per_step: int,
    group: int,
    first_seed: int = 0,
    *,
    play: Callable[[AsyncSwarmClient, int, int], Awaitable[Row]] = episode,  # type: ignore[assignment]
    n_tasks: int = len(QUESTIONS),
    after_step: Callable[[AsyncSwarmClient, int], Awaitable[None]] | None = None,
) -> list[list[Row]]:
    """Roll out one batch per step and wait for the update; returns each round's rows (``play``'s: by
    default (reward, correct, words) of this module's `episode`).

    ``play(client, task, seed)`` runs one episode of task ``(step * tasks_per_step + t) % n_tasks``;
    request seeds count up from ``first_seed + 1``; ``after_step(client, step)`` runs after update
    ``step`` (1-based) is done, before the next round (e.g. a held-out evaluation)."""
    rounds = []
    async with AsyncSwarmClient(url) as client:
        seed = first_seed
        for step in range(steps):
            coros = []
            for t in range(tasks_per_step):
                task = (step * tasks_per_step + t) % n_tasks
                for _ in range(group):
                    seed += 1
                    coros.append(play(client, task, seed))
            rounds.append(list(await asyncio.gather(*coros)))
            while (await client.status()).step < step + 1:
                await asyncio.sleep(0.2)
            if after_step is not None:
                await after_step(client, step + 1)
    return rounds


def recipe_config(
    run_dir: Path,
    *,
    lr: float = 3e-5,
    tasks: int = 4,
    group: int = 4,
    lora: LoraSettings | None = None,
    mixed_precision: str = "no",
) -> ServerConfig:
    """This check's training server: GRPO, ``tasks`` policy B = ``tasks`` × G = ``group``, sampling at
    temperature 1.0, full fine-tuning in float32 (or LoRA on bf16 base weights with mixed precision),
    no checkpoint before step 1000 (a caller that needs one asks for it)."""
    return ServerConfig(
        run_dir=run_dir,
        port=0,
        dtype="bfloat16" if lora and mixed_precision != "no" else "float32",
        mixed_precision=mixed_precision,
        sampling=SamplingDefaults(temperature=1.0),
        training=TrainingConfig(
            batch=BatchConfig(policy=BatchPolicy.TASKS, batch_size=tasks, group_size=group),
            trainer=TrainerConfig(lr=lr, micro_batch_size=8, lora=lora),
            checkpoint_every=1000,
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="0: full fine-tuning (float32 weights); >0 with bf16: bf16 base",
    )
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "auto"])
    args = parser.parse_args()
    lora = LoraSettings(r=args.lora_rank, alpha=2 * args.lora_rank) if args.lora_rank else None
    run_dir = Path(tempfile.mkdtemp(prefix="learning-"))
    config = recipe_config(
        run_dir,
        lr=args.lr,
        tasks=args.tasks,
        group=args.group,
        lora=lora,
        mixed_precision=args.mixed_precision,
    )
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.1)
    port = server.servers[0].sockets[0].getsockname()[1]
    started = time.time()
    rounds = asyncio.run(drive(f"http://127.0.0.1:{port}", args.steps, args.tasks, args.group))
    history = server.config.app.state.runtime.training.history  # type: ignore[union-attr]
    server.should_exit = True
    thread.join()
    what = f"LoRA r={args.lora_rank}" if lora else "full fine-tuning"
    table = Table(
        title=f"GRPO on a short-answer format task, embedded SmolLM2-135M, {what}, lr {args.lr}, "
        f"mixed precision {args.mixed_precision}"
    )
    for col in ("step", "reward mean", "reward std", "correct", "words", "loss", "grad norm", "step s"):
        table.add_column(col, justify="right")
    for m, batch in zip(history, rounds, strict=False):
        n = len(batch)
        table.add_row(
            str(m.step),
            f"{m.reward_mean:.3f}",
            f"{m.reward_std:.3f}",
            f"{sum(b[1] for b in batch) / n:.2f}",
            f"{sum(b[2] for b in batch) / n:.1f}",
            f"{m.loss:.4f}",
            f"{m.grad_norm:.3f}",
            f"{m.time_s.total_s:.1f}",
        )
    console = Console()
    console.print(table)
    first = sum(m.reward_mean or 0 for m in history[:3]) / 3
    last = sum(m.reward_mean or 0 for m in history[-3:]) / 3
    acc_first = sum(b[1] for batch in rounds[:3] for b in batch) / max(1, sum(len(b) for b in rounds[:3]))
    acc_last = sum(b[1] for batch in rounds[-3:] for b in batch) / max(1, sum(len(b) for b in rounds[-3:]))
    console.print(f"correct-answer rate first 3 steps {acc_first:.2f} → last 3 steps {acc_last:.2f}")
    console.print(
        f"mean reward first 3 steps {first:.3f} → last 3 steps {last:.3f}: rise {last - first:+.3f} "
        f"({time.time() - started:.0f} s wall)"
    )


if __name__ == "__main__":
    main()
