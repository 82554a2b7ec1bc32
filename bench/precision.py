"""Benchmark: mixed precision (bf16 autocast) against float32 for sampling and GRPO updates (embedded model).

    python bench/precision.py [--repeats 3] [--threads 2]

Rows, all on the real embedded SmolLM2-135M-Instruct through our own parts (``HFEngine``, ``TorchTrainer``):

* **sample**: one engine batch of ``--batch`` prompts × ``--prompt`` tokens, ``--new`` new tokens each
  (prefill + decode, what a round of multi-turn agents costs).
* **update**: one ``TorchTrainer.step`` on ``--batch`` sequences of ``--seq`` tokens whose last ``--scored`` are
  trained (forward + backward + clip + AdamW), micro-batch 4.

Columns: float32 (weights and compute); bf16 autocast over float32 weights (full fine-tuning keeps float32 master
weights); bf16 weights + bf16 autocast (LoRA only: frozen base in bf16, float32 adapters). Median seconds of
``--repeats`` after one warm-up, and the speed-up against float32 measured side by side in the same process.
``logprob |Δ|`` is the largest difference of a greedy sample's logprobs from the float32 engine's.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

from swarm.engine import HFEngine, load_model, resolve_model
from swarm.engine.base import SamplingParams
from swarm.precision import MixedPrecision, fast_bf16
from swarm.tracking.records import Sample
from swarm.train import LoraSettings, TorchTrainer, TrainerConfig


def _median(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _samples(n: int, length: int, scored: int, vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(10, vocab, (length,), generator=g).tolist()
        mask = [0] * (length - scored) + [1] * scored
        out.append(
            Sample(
                episode_id=f"e{i}",
                index=0,
                input_ids=ids,
                loss_mask=mask,
                behaviour_logprobs=[-3.0 if m else 0.0 for m in mask],
                call_ids=[0] * length,
                calls=[0],
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--new", type=int, default=24)
    parser.add_argument("--seq", type=int, default=500)
    parser.add_argument("--scored", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    source = resolve_model(None)
    fp32, tokenizer = load_model(source)
    bf16, _ = load_model(source, dtype="bfloat16")
    vocab = int(fp32.config.vocab_size)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, vocab, (args.prompt,), generator=g).tolist() for _ in range(args.batch)]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.new)

    def sample_time(model: torch.nn.Module, precision: MixedPrecision) -> tuple[float, list[float]]:
        engine = HFEngine(model, tokenizer, "bench", batch_window_s=0.0, mixed_precision=precision)
        try:

            def batch() -> list[list[float]]:
                futures = [engine.submit(p, greedy) for p in prompts]
                return [f.result()[0].logprobs for f in futures]

            seconds = _median(batch, args.repeats)
            logprobs = batch()
            # A row that ends early (end-of-turn) shortens the batch: report seconds per --new tokens.
            return seconds * args.new / max(len(lp) for lp in logprobs), logprobs[0]
        finally:
            engine.close()

    def update_time(model: torch.nn.Module, lora: bool, precision: MixedPrecision) -> float:
        config = TrainerConfig(
            lr=1e-5, micro_batch_size=4, lora=LoraSettings(r=16, alpha=32) if lora else None
        )
        trainer = TorchTrainer(copy.deepcopy(model), config, pad_token_id=0, mixed_precision=precision)
        samples = _samples(args.batch, args.seq, args.scored, vocab)
        advantages = [1.0 if i % 2 else -1.0 for i in range(args.batch)]
        return _median(lambda: trainer.step(samples, advantages), args.repeats)

    rows: list[tuple[str, float, float, float | None, str]] = []
    ref_s, ref_lp = sample_time(fp32, MixedPrecision.NO)
    auto_s, auto_lp = sample_time(fp32, MixedPrecision.BF16)
    pure_s, pure_lp = sample_time(bf16, MixedPrecision.BF16)
    n = min(len(ref_lp), len(auto_lp), len(pure_lp))
    delta = max(abs(a - b) for a, b in zip(ref_lp[:n], pure_lp[:n], strict=True))
    rows.append((f"sample {args.batch}×({args.prompt}+{args.new})", ref_s, auto_s, pure_s, f"{delta:.3f}"))
    for lora in (False, True):
        ref = update_time(fp32, lora, MixedPrecision.NO)
        auto = update_time(fp32, lora, MixedPrecision.BF16)
        pure = update_time(bf16, lora, MixedPrecision.BF16) if lora else None
        rows.append(
            (f"update {'LoRA r16' if lora else 'full FT'} {args.batch}×{args.seq}", ref, auto, pure, "")
        )

    table = Table(
        title=f"bf16 mixed precision vs float32, SmolLM2-135M, {args.threads} threads, "
        f"fast bf16 on this CPU: {fast_bf16('cpu')} (median of {args.repeats}, seconds)"
    )
    for col in (
        "work",
        "float32",
        "bf16 autocast",
        "speed-up",
        "bf16 weights+autocast",
        "speed-up",
        "logprob |Δ|",
    ):
        table.add_column(col, justify="right")
    for name, ref, auto, pure, note in rows:
        table.add_row(
            name,
            f"{ref:.2f}",
            f"{auto:.2f}",
            f"{ref / auto:.2f}×",
            "—" if pure is None else f"{pure:.2f}",
            "—" if pure is None else f"{ref / pure:.2f}×",
            note,
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
