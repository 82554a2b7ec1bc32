"""Benchmark: what a checkpoint costs, LoRA adapters vs full fine-tuning, and what checkpointing every
step adds to a full fine-tuning step: the background path the server takes vs no checkpoint vs the old
blocking write.

For the embedded SmolLM2-135M, a trainer (`swarm.train.TorchTrainer`) takes one GRPO step on a small
random batch (so AdamW's state exists), then `swarm.server.checkpoints.save_checkpoint` writes the
checkpoint the server would write (weights or adapters, optimizer state, step, tokenizer) ``--repeats``
times into a fresh run dir. Reported per mode: median and min/max seconds per checkpoint, its size on
disk, the median step time, and the checkpoint's cost as a share of one step.

Step overhead (full fine-tuning, ``--rounds`` rounds, each step on ``--batch`` random sequences of
``--seq-len`` tokens, the last third trained): each round runs ``--block`` consecutive steps of each
path, in a shuffled order, on one trainer: ``none`` (the step only), ``blocking`` (the step, then
`save_checkpoint`, the server's path before issue 35) and ``background`` (the step, then
`CheckpointWriter.checkpoint`, the server's path: journal the step; if the previous write has ended,
snapshot to CPU memory and start the write in a thread, else skip the snapshot, never waiting). A
path's time per step is the step plus what the training thread spent on the checkpoint; a background
block ends by waiting for its last write (uncounted: in a server that write overlaps sampling and the
following steps). Reported: medians per path, the median of the paired per-round differences against
``none``, and for the background path the synchronous cost of a step that snapshotted and of one that
skipped, and how many steps skipped.

``--device cuda --model DIR --batch 16 --seq-len 1024`` runs the overhead on a GPU with a step of a few
seconds (1.5B shape: see bench/README.md §checkpoint.py).

Run: ``.venv/bin/python bench/checkpoint.py`` (≈ 1 min on 2 CPU cores; the overhead rounds more).
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


PATHS = ("none", "blocking", "background")


def _journal_batch(samples: list[Any], advantages: list[Any]) -> Any:
    """The `StepBatch` the server would journal for ``samples`` (one episode per sample, one group)."""
    from swarm.batch import Batch
    from swarm.server.step_batch import StepBatch
    from swarm.tracking.merge import MergeStats

    ids = [s.episode_id for s in samples]
    batch = Batch(episode_ids=ids, groups={"t": ids}, rewards=dict.fromkeys(ids, 1.0), reason="bench")
    return StepBatch(batch, samples, advantages, MergeStats(), [0] * len(ids))


def measure_overhead(
    rounds: int,
    block: int,
    model_dir: str | None,
    device: str,
    dtype: str,
    *,
    batch_size: int = 4,
    seq_len: int = 96,
    keep: int = 2,
) -> dict[str, Any]:
    """Seconds per full fine-tuning step on each of `PATHS`, paired by round (see the module docstring)."""
    import random

    import torch

    from swarm.engine import load_model, resolve_model
    from swarm.server.checkpoints import CheckpointWriter, save_checkpoint
    from swarm.server.events import EventLog
    from swarm.train import TorchTrainer, TrainerConfig

    torch.manual_seed(SEED)
    source = resolve_model(model_dir)
    model, tokenizer = load_model(source, dtype=dtype, device=device)
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-5, micro_batch_size=4), pad_token_id=0)
    prompt = 2 * seq_len // 3
    samples, advantages = _samples(batch_size, prompt, seq_len - prompt)
    batch = _journal_batch(samples, advantages)
    run_dir = Path(tempfile.mkdtemp(prefix="swarm-ckpt-overhead-"))
    writer = CheckpointWriter(run_dir, trainer.model, tokenizer, events=EventLog(run_dir / "events.jsonl"))
    trainer.step(samples, advantages)  # warm-up: AdamW's state exists from here on
    times: dict[str, list[list[float]]] = {path: [] for path in PATHS}
    snapshot_s: list[float] = []  # background, a step that snapshotted: journal + snapshot + thread start
    skipped_s: list[float] = []  # background, a step whose snapshot was skipped: its journal entry
    step_s: list[float] = []  # every path: the trainer's step alone
    order = random.Random(SEED)
    try:
        for _ in range(rounds):
            for path in order.sample(PATHS, len(PATHS)):
                block_s = []
                for _ in range(block):
                    started = time.perf_counter()
                    trainer.step(samples, advantages)
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    step_s.append(time.perf_counter() - started)
                    if path == "blocking":
                        save_checkpoint(
                            run_dir, trainer.step_count, trainer.model, tokenizer, trainer.state_dict(), keep
                        )
                    elif path == "background":
                        owed = len(writer.owed)
                        spent = writer.checkpoint(trainer, batch, policy="bench", keep=keep)
                        (skipped_s if len(writer.owed) > owed else snapshot_s).append(spent)
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    block_s.append(time.perf_counter() - started)
                writer.wait()
                times[path].append(block_s)
    finally:
        writer.wait()
        shutil.rmtree(run_dir, ignore_errors=True)
    flat = {path: [t for block_s in times[path] for t in block_s] for path in PATHS}
    rounds_median = {path: [statistics.median(b) for b in times[path]] for path in PATHS}
    return {
        "model": source.name,
        "median": {path: statistics.median(flat[path]) for path in PATHS},
        "paired": {
            path: statistics.median(
                r - n for r, n in zip(rounds_median[path], rounds_median["none"], strict=True)
            )
            for path in PATHS
        },
        "steps": {path: len(flat[path]) for path in PATHS},
        "step_s": statistics.median(step_s),
        "snapshot_s": statistics.median(snapshot_s),
        "skipped_s": statistics.median(skipped_s) if skipped_s else None,
        "skipped": len(skipped_s),
        "batch": f"{batch_size} × {seq_len} tokens",
    }


def _overhead_table(r: dict[str, Any], rounds: int, block: int) -> Any:
    from rich.table import Table

    table = Table(
        title=f"step time with a checkpoint every step, {r['model']}, {rounds} rounds × {block} steps, "
        f"batch {r['batch']}"
    )
    for column in ("path", "s per step (median)", "extra s (paired median)", "extra / step"):
        table.add_column(column, justify="right")
    none = r["median"]["none"]
    for path in PATHS:
        extra = r["paired"][path]
        table.add_row(path, f"{r['median'][path]:.3f}", f"{extra:+.3f}", f"{extra / none:+.1%}")
    skipped = "-" if r["skipped_s"] is None else f"{r['skipped_s']:.3f} s"
    table.caption = (
        f"the trainer's step alone {r['step_s']:.3f} s (median); background, medians: journal + snapshot "
        f"{r['snapshot_s']:.3f} s (a step after the previous write ended), journal only {skipped} (a step "
        f"during a write: {r['skipped']} of {r['steps']['background']} steps skipped their snapshot)"
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="checkpoints written per mode")
    parser.add_argument("--steps", type=int, default=3, help="trainer steps timed per mode")
    parser.add_argument("--rounds", type=int, default=3, help="step-overhead rounds (0: skip)")
    parser.add_argument("--block", type=int, default=2, help="consecutive steps per path in a round")
    parser.add_argument("--overhead-only", action="store_true", help="skip the LoRA vs full table")
    parser.add_argument("--model", default=None, help="Hugging Face directory (default: the embedded model)")
    parser.add_argument("--device", default="cpu", help="torch device of the overhead rounds")
    parser.add_argument("--dtype", default="float32", help="weights' dtype in the overhead rounds")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step in the overhead rounds")
    parser.add_argument("--seq-len", type=int, default=96, help="tokens per sequence in the overhead rounds")
    parser.add_argument(
        "--keep",
        type=int,
        default=2,
        help="checkpoints kept in the overhead rounds (1: least disk; at 1.5B each is 16.6 GB)",
    )
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    if args.rounds:
        overhead = measure_overhead(
            args.rounds,
            args.block,
            args.model,
            args.device,
            args.dtype,
            batch_size=args.batch,
            seq_len=args.seq_len,
            keep=args.keep,
        )
        Console().print(_overhead_table(overhead, args.rounds, args.block))
    if args.overhead_only:
        return
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
