"""Benchmark: what a checkpoint costs, LoRA adapters vs full fine-tuning (why LoRA servers checkpoint
every step by default and full fine-tuning every 5).

For the embedded SmolLM2-135M, a trainer (`swarm.train.TorchTrainer`) takes one GRPO step on a small
random batch (so AdamW's state exists), then `swarm.server.checkpoints.save_checkpoint` writes the
checkpoint the server would write (weights or adapters, optimizer state, step, tokenizer) ``--repeats``
times into a fresh run dir. Reported per mode: median and min/max seconds per checkpoint, its size on
disk, the median step time, and the checkpoint's cost as a share of one step.

Run: ``.venv/bin/python bench/checkpoint.py`` (≈ 1 min on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SEED = 0


def _samples(seqs: int, prompt: int, completion: int) -> tuple[list[Any], list[float]]:
    import torch

    from swarm.tracking.records import Sample

    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(1, 49152, (seqs, prompt + completion), generator=g)
    samples = [
        Sample(
            episode_id=f"e{i}",
            index=0,
            input_ids=ids[i].tolist(),
            loss_mask=[0] * prompt + [1] * completion,
            behaviour_logprobs=[0.0] * prompt + [-10.0] * completion,
            call_ids=[0] * (prompt + completion),
            calls=[0],
        )
        for i in range(seqs)
    ]
    return samples, [1.0 if i % 2 == 0 else -1.0 for i in range(seqs)]


def measure(lora: bool, repeats: int, steps: int) -> dict[str, float]:
    import torch

    from swarm.engine import load_model, resolve_model
    from swarm.server.checkpoints import save_checkpoint
    from swarm.train import LoraSettings, TorchTrainer, TrainerConfig

    torch.manual_seed(SEED)
    model, tokenizer = load_model(resolve_model(None))
    settings = LoraSettings(r=16, alpha=32) if lora else None
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-5, micro_batch_size=4, lora=settings), pad_token_id=0)
    samples, advantages = _samples(4, 64, 32)
    step_s = []
    for _ in range(steps):
        started = time.perf_counter()
        trainer.step(samples, advantages)
        step_s.append(time.perf_counter() - started)
    run_dir = Path(tempfile.mkdtemp(prefix="swarm-ckpt-"))
    try:
        save_s, size = [], 0
        for i in range(repeats):
            started = time.perf_counter()
            path = save_checkpoint(run_dir, i + 1, trainer.model, tokenizer, trainer.state_dict(), keep=2)
            save_s.append(time.perf_counter() - started)
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "save_median_s": statistics.median(save_s),
        "save_min_s": min(save_s),
        "save_max_s": max(save_s),
        "size_mb": size / 1e6,
        "step_median_s": statistics.median(step_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="checkpoints written per mode")
    parser.add_argument("--steps", type=int, default=3, help="trainer steps timed per mode")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    results = {name: measure(name == "LoRA r16", args.repeats, args.steps) for name in ("full", "LoRA r16")}
    table = Table(title=f"checkpoint cost, SmolLM2-135M, median of {args.repeats} (min-max)")
    for column in ("mode", "checkpoint s", "size MB", "step s (median)", "checkpoint / step"):
        table.add_column(column, justify="right")
    for name, r in results.items():
        table.add_row(
            name,
            f"{r['save_median_s']:.3f} ({r['save_min_s']:.3f}-{r['save_max_s']:.3f})",
            f"{r['size_mb']:.1f}",
            f"{r['step_median_s']:.2f}",
            f"{r['save_median_s'] / r['step_median_s']:.1%}",
        )
    full, lora = results["full"], results["LoRA r16"]
    table.caption = (
        f"LoRA checkpoint is {full['save_median_s'] / lora['save_median_s']:.0f}x faster and "
        f"{full['size_mb'] / lora['size_mb']:.0f}x smaller than full fine-tuning's"
    )
    Console().print(table)


if __name__ == "__main__":
    main()
