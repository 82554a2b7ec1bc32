"""Benchmark: does sending only what changed pay on the weight path? (issue 37, item 2)

    python bench/weight_delta.py [--steps 3] [--threads 2] [--json out.json]   # 2-core CPU: ~190 s
    python bench/weight_delta.py --device cuda --threads 8        # encode/decode timed on the GPU

Real GRPO on the embedded SmolLM2-135M-Instruct with our ``TorchTrainer``: each step samples a fresh
batch of real episodes with the current weights (``HFEngine``, the short-answer task of
``bench/learning.py``, ``--tasks`` × ``--group`` at temperature 1, its reward, GRPO advantages) and
makes one AdamW update on them (float32 master weights). Arms: full fine-tuning at lr 1e-6 and 1e-5
(``TrainerConfig``'s default), and LoRA r16 at lr 2e-4 (what ``a3r`` starts).

After every step the weights the engine would receive (``served_weights``: LoRA merged as
``W + (α/r)·B·A``) are cast to the engine's dtype (bf16, vLLM's on the GPU; fp16; fp32, an fp32 engine)
and compared bit for bit with the previous step's cast. Per arm, step and dtype:

* **changed tensors / elements**: the share of tensors with any changed element, of elements changed.
  A float32 update smaller than half a bf16 ulp of the weight does not change its bf16 cast: the
  effect behind "RL finetunes small subnetworks" (Mukherjee et al. 2025, arXiv:2505.11711: 5–30 % of
  the parameters change over a whole RL run in bf16; per step far fewer).
* **bytes** of a sync: dense (every tensor, 2 B an element, what the direct path sends now) · changed
  tensors only · sparse ``int32`` indices + values (6 B a changed element) · sparse bitmap (1 bit an
  element + 2 B a changed one) · an fp8-e4m3 delta (1 B an element + a per-tensor scale; lossy: the
  share of the changed elements it reproduces exactly is reported). A dense bf16 delta is 2 B an element, as
  many bytes as the weights themselves, and lossy on top: it can never pay, so it has no column.
* **encode / decode seconds** on ``--device`` (bf16 only; the fastest of ``--repeats`` passes, one
  tensor at a time): encode compares the new cast with the previous copy, finds the changed elements
  and gathers their values; decode scatters them into the engine's copy (checked equal to the new cast).
* **break-even link bandwidth**: sparse beats dense when ``bytes saved / bandwidth > encode + decode``,
  i.e. below ``bandwidth* = bytes saved / (encode + decode)``. Both scale with the parameter count, so
  ``bandwidth*`` does not depend on the model's size; the table also scales the 135M measurement to the
  issue's 1.5B shape (1.386 B parameters) on typical links (assumed bandwidths, labelled as such).

The CUDA-IPC push on one GPU moves no bytes (the engine maps the trainer's buffers): there only the
NCCL path across GPUs or nodes could gain.

Measured 2026-12-05 (2-core CPU shared with other jobs, 2 threads, 3 steps, 190 s; bench/README.md has
the tables): elements changed a step in bf16 · fp16 · fp32, sparse bytes / dense (bf16), break-even:

=============================  ========================  ==================  ================
arm                            changed bf16·fp16·fp32     idx+val · bitmap    break-even (idx)
=============================  ========================  ==================  ================
full FT lr 1e-6                2.0 % · 4.5 % · 99.5 %     0.059 · 0.082       1.74 GB/s
full FT lr 1e-5                3.6 % · 16.4 % · 99.9 %    0.107 · 0.098       1.29 GB/s
LoRA r16 lr 2e-4 (merged)      6.5 % · 27.2 % · 78.9 %    0.194 · 0.127       1.03 GB/s
=============================  ========================  ==================  ================

Encode + decode cost 1.1–1.6 s per billion parameters on this CPU, so a sparse sync pays only on links
slower than ≈ 1–1.7 GB/s; LoRA's adapters alone are 0.036 of the merged bytes.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from learning import QUESTIONS, reward
from rich.console import Console
from rich.table import Table

from swarm.engine import HFEngine
from swarm.engine.base import SamplingParams
from swarm.engine.vllm import served_weights
from swarm.tracking.records import Sample
from swarm.train import LoraSettings, TorchTrainer, TrainerConfig
from swarm.train.losses import grpo_advantages

SHAPE_1P5B = 1.386e9
"""Parameters of the issue's Qwen2.5-1.5B-shaped model (bench/multi_gpu.py)."""

LINKS: list[tuple[str, float]] = [
    ("NVLink 4 (H100/H200, one direction)", 450e9),
    ("PCIe 5 x16", 50e9),
    ("InfiniBand NDR 400 Gb/s (one NIC)", 50e9),
    ("100 GbE", 12.5e9),
    ("25 GbE", 3.1e9),
    ("10 GbE", 1.25e9),
    ("1 Gb/s (WAN)", 0.125e9),
]
"""Typical link bandwidths in bytes/s: assumptions (nominal rates), not measured here."""

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
"""The engine dtypes compared: bf16 (vLLM's default on the GPU, timed), fp16, and fp32 (the trainer's own
master weights, what an fp32 engine receives)."""


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit pattern as a same-sized integer view (a bitwise comparison: -0.0 ≠ 0.0, NaN = NaN)."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@dataclass(frozen=True)
class Arm:
    """One training setting: a name, the learning rate and the LoRA rank (0: full fine-tuning)."""

    name: str
    lr: float
    lora_rank: int = 0


ARMS = (
    Arm("full FT lr 1e-6", 1e-6),
    Arm("full FT lr 1e-5 (swarm default)", 1e-5),
    Arm("LoRA r16 lr 2e-4 (a3r default)", 2e-4, 16),
)


@dataclass
class Settings:
    """What one run measures."""

    steps: int = 3
    tasks: int = 4
    group: int = 4
    max_tokens: int = 24
    threads: int = 2
    repeats: int = 3
    """Timed encode/decode passes per step (the fastest counts)."""
    device: str = "cpu"
    """Where encode/decode are timed (training and sampling stay on the CPU)."""
    arms: Sequence[Arm] = field(default_factory=lambda: ARMS)


@dataclass
class Row:
    """One arm's one step in one dtype (sizes in bytes, times in seconds)."""

    arm: str
    step: int
    dtype: str
    reward_mean: float
    tensors: int
    tensors_changed: int
    elements: int
    elements_changed: int
    dense_bytes: int
    changed_tensor_bytes: int
    sparse_index_bytes: int
    sparse_bitmap_bytes: int
    fp8_delta_bytes: int
    fp8_exact: float
    """Share of all elements an fp8 delta reproduces exactly (the unchanged ones always)."""
    fp8_exact_changed: float
    """Share of the changed elements it reproduces exactly."""
    encode_index_s: float | None = None
    decode_index_s: float | None = None
    encode_bitmap_s: float | None = None
    decode_bitmap_s: float | None = None
    adapter_elements: int | None = None
    adapter_elements_changed: int | None = None


def episodes(
    model: torch.nn.Module, tokenizer: Any, settings: Settings, seed: int
) -> tuple[list[Sample], list[float], float]:
    """A batch of real episodes sampled with ``model``: ``tasks`` questions × ``group`` completions at
    temperature 1, their behaviour logprobs, learning.py's reward and GRPO advantages per group.

    Returns (samples, advantages, mean reward)."""
    engine = HFEngine(model, tokenizer, "bench", batch_window_s=0.0)
    try:
        futures = []
        for t in range(settings.tasks):
            question, answer = QUESTIONS[(seed * settings.tasks + t) % len(QUESTIONS)]
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": question + " Answer in at most three words."}],
                tokenize=False,
                add_generation_prompt=True,
            )
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            params = SamplingParams(
                temperature=1.0, max_tokens=settings.max_tokens, n=settings.group, seed=seed * 100 + t
            )
            futures.append((prompt, answer, engine.submit(prompt, params)))
        samples: list[Sample] = []
        advantages: list[float] = []
        rewards: list[float] = []
        for t, (prompt, answer, future) in enumerate(futures):
            group = future.result()
            r_G = torch.tensor([reward(c.text, answer) for c in group])
            rewards += r_G.tolist()
            advantages += grpo_advantages(r_G).tolist()
            for j, c in enumerate(group):
                n = len(prompt) + len(c.ids)
                samples.append(
                    Sample(
                        episode_id=f"s{seed}t{t}g{j}",
                        index=0,
                        input_ids=prompt + c.ids,
                        loss_mask=[0] * len(prompt) + [1] * len(c.ids),
                        behaviour_logprobs=[0.0] * len(prompt) + list(c.logprobs),
                        call_ids=[0] * n,
                        calls=[0],
                    )
                )
        return samples, advantages, sum(rewards) / len(rewards)
    finally:
        engine.close()


def served(trainer: TorchTrainer) -> Iterator[tuple[str, torch.Tensor]]:
    """What the engine receives after a step (``served_weights`` of the sampling model), tied tensors
    once."""
    seen: set[int] = set()
    for name, tensor in served_weights(trainer.sampling_model):
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        yield name, tensor


def adapters(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    """The LoRA adapter tensors (A, B) as float32 copies: what an adapter push would send."""
    return {
        n: p.detach().clone()
        for n, p in trainer.model.named_parameters()
        if ".lora_" in n and p.requires_grad
    }


def _best_s(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """The fastest of ``repeats`` runs of ``fn`` (the first warms up; other jobs sharing the cores only
    ever add time)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return min(times)


def encode_index(prev: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Changed elements of ``new`` against ``prev`` (same shape, 16-bit float) as ``int32`` flat
    indices, shape (K,), and their values, shape (K,), in ``new``'s dtype."""
    mask = bits(new) != bits(prev)
    index = mask.view(-1).nonzero().squeeze(1)
    return index.to(torch.int32), new.view(-1)[index]


def decode_index(engine: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """Scatter ``values`` into ``engine`` (in place) at the flat ``index``."""
    engine.view(-1)[index.long()] = values


BIT_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128)


def encode_bitmap(prev: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Changed elements as a packed bitmap (1 bit an element, ``uint8``, shape (⌈N/8⌉,)) and their values
    in order, shape (K,)."""
    mask = (bits(new) != bits(prev)).view(-1)
    values = new.view(-1)[mask]
    padded = torch.nn.functional.pad(mask.to(torch.uint8), (0, -mask.numel() % 8))
    weights = torch.tensor(BIT_WEIGHTS, dtype=torch.uint8, device=mask.device)
    return (padded.view(-1, 8) * weights).sum(1, dtype=torch.uint8), values


def decode_bitmap(engine: torch.Tensor, bits: torch.Tensor, values: torch.Tensor) -> None:
    """Write ``values`` into ``engine`` (in place) where the bitmap is set."""
    flat = engine.view(-1)
    weights = torch.tensor(BIT_WEIGHTS, dtype=torch.uint8, device=bits.device)
    mask = (bits.unsqueeze(1) & weights).bool().view(-1)[: flat.numel()]
    flat.masked_scatter_(mask, values)


def fp8_delta_exact(prev: torch.Tensor, new: torch.Tensor) -> int:
    """Elements an fp8-e4m3 delta (per-tensor scale = max |Δ| / 448) added to ``prev`` reproduces
    exactly in ``new``'s dtype."""
    delta = new.float() - prev.float()
    scale = float(delta.abs().max()) / 448.0
    if scale == 0.0:
        return new.numel()
    q = (delta / scale).to(torch.float8_e4m3fn)
    recon = (prev.float() + q.float() * scale).to(new.dtype)
    return int((bits(recon) == bits(new)).sum())


def compare(
    prev: dict[str, torch.Tensor],
    new: dict[str, torch.Tensor],
    timed: bool,
    repeats: int,
    device: str = "cpu",
) -> dict[str, Any]:
    """Counts, bytes and (``timed``) encode/decode seconds on ``device`` of syncing ``new`` onto
    ``prev``."""
    out: dict[str, Any] = {
        "tensors": len(new),
        "tensors_changed": 0,
        "elements": 0,
        "elements_changed": 0,
        "changed_tensor_bytes": 0,
        "fp8_exact_elements": 0,
    }
    for name, tensor in new.items():
        old = prev[name]
        changed = int((bits(tensor) != bits(old)).sum())
        out["elements"] += tensor.numel()
        out["elements_changed"] += changed
        out["fp8_exact_elements"] += fp8_delta_exact(old, tensor)
        if changed:
            out["tensors_changed"] += 1
            out["changed_tensor_bytes"] += tensor.numel() * tensor.element_size()
    n, k = out["elements"], out["elements_changed"]
    size = next(iter(new.values())).element_size()
    out["dense_bytes"] = size * n
    out["sparse_index_bytes"] = (4 + size) * k
    out["sparse_bitmap_bytes"] = sum((t.numel() + 7) // 8 for t in new.values()) + size * k
    out["fp8_delta_bytes"] = n + 4 * len(new)
    if timed:
        where = torch.device(device)
        prev = {n: t.to(where) for n, t in prev.items()}
        new = {n: t.to(where) for n, t in new.items()}
        for kind, encode, decode in (
            ("index", encode_index, decode_index),
            ("bitmap", encode_bitmap, decode_bitmap),
        ):
            encoded = {name: encode(prev[name], t) for name, t in new.items()}
            out[f"encode_{kind}_s"] = _best_s(
                lambda enc=encode: [enc(prev[n], t) for n, t in new.items()],  # type: ignore[misc]
                repeats,
                where,
            )
            engines = {name: prev[name].clone() for name in new}

            def apply(
                dec: Any = decode,
                engines: dict[str, torch.Tensor] = engines,
                encoded: dict[str, Any] = encoded,
            ) -> None:
                for name, (a, b) in encoded.items():
                    dec(engines[name], a, b)

            out[f"decode_{kind}_s"] = _best_s(apply, repeats, where)
            for name, t in new.items():  # the decoded engine copy is the new cast, bit for bit
                if not torch.equal(bits(engines[name]), bits(t)):
                    raise AssertionError(f"{kind} decode of {name} differs from the new cast")
    return out


def run_arm(model: torch.nn.Module, tokenizer: Any, arm: Arm, settings: Settings) -> list[Row]:
    """Train one arm for ``settings.steps`` steps on fresh real episodes; a row per step and dtype."""
    torch.manual_seed(0)  # LoRA's A initialisation
    lora = LoraSettings(r=arm.lora_rank, alpha=2 * arm.lora_rank) if arm.lora_rank else None
    config = TrainerConfig(lr=arm.lr, micro_batch_size=settings.tasks * settings.group, lora=lora)
    trainer = TorchTrainer(copy.deepcopy(model), config, pad_token_id=tokenizer.pad_token_id or 0)

    def casts() -> dict[str, dict[str, torch.Tensor]]:
        weights = dict(served(trainer))
        return {d: {n: t.to(dt, copy=True) for n, t in weights.items()} for d, dt in DTYPES.items()}

    prev = casts()
    prev_adapters = adapters(trainer) if lora else {}
    rows: list[Row] = []
    for step in range(1, settings.steps + 1):
        samples, advantages, reward_mean = episodes(trainer.sampling_model, tokenizer, settings, step)
        trainer.step(samples, advantages)
        trainer.sync_sampling_model()
        new = casts()
        new_adapters = adapters(trainer) if lora else {}
        for dtype in DTYPES:
            c = compare(prev[dtype], new[dtype], dtype == "bf16", settings.repeats, settings.device)
            row = Row(
                arm=arm.name,
                step=step,
                dtype=dtype,
                reward_mean=reward_mean,
                tensors=c["tensors"],
                tensors_changed=c["tensors_changed"],
                elements=c["elements"],
                elements_changed=c["elements_changed"],
                dense_bytes=c["dense_bytes"],
                changed_tensor_bytes=c["changed_tensor_bytes"],
                sparse_index_bytes=c["sparse_index_bytes"],
                sparse_bitmap_bytes=c["sparse_bitmap_bytes"],
                fp8_delta_bytes=c["fp8_delta_bytes"],
                fp8_exact=c["fp8_exact_elements"] / c["elements"],
                fp8_exact_changed=(c["fp8_exact_elements"] - c["elements"] + c["elements_changed"])
                / max(1, c["elements_changed"]),
                encode_index_s=c.get("encode_index_s"),
                decode_index_s=c.get("decode_index_s"),
                encode_bitmap_s=c.get("encode_bitmap_s"),
                decode_bitmap_s=c.get("decode_bitmap_s"),
            )
            if lora:
                row.adapter_elements = sum(t.numel() for t in new_adapters.values())
                row.adapter_elements_changed = sum(
                    int((new_adapters[n].to(DTYPES[dtype]) != prev_adapters[n].to(DTYPES[dtype])).sum())
                    for n in new_adapters
                )
            rows.append(row)
        prev, prev_adapters = new, new_adapters
    return rows


def break_even(row: Row, kind: str) -> float | None:
    """Bandwidth (bytes/s) below which the ``kind`` sparse encoding beats dense; ``None``: never."""
    saved = row.dense_bytes - getattr(row, f"sparse_{kind}_bytes")
    seconds = (getattr(row, f"encode_{kind}_s") or 0.0) + (getattr(row, f"decode_{kind}_s") or 0.0)
    if saved <= 0:
        return None
    return saved / seconds if seconds > 0 else float("inf")


def run(model: torch.nn.Module, tokenizer: Any, settings: Settings) -> list[Row]:
    """Every arm of ``settings`` on ``model`` (float32, never modified: each arm trains a copy)."""
    torch.set_num_threads(settings.threads)
    rows: list[Row] = []
    for arm in settings.arms:
        rows += run_arm(model, tokenizer, arm, settings)
    return rows


def _gb(n: float) -> str:
    return f"{n / 1e9:.3f}"


def _rate(bw: float | None) -> str:
    if bw is None:
        return "never"
    return "∞" if bw == float("inf") else f"{bw / 1e9:.2f} GB/s"


def summary(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Per arm (bf16, the engine's dtype, steps ≥ 1 pooled): shares, byte ratios, the break-even
    bandwidth of each sparse encoding and what a sync of the 1.5B shape would take on each link."""
    out = []
    for arm in dict.fromkeys(r.arm for r in rows):
        mine = [r for r in rows if r.arm == arm and r.dtype == "bf16"]
        n = sum(r.elements for r in mine)
        dense = sum(r.dense_bytes for r in mine)
        entry: dict[str, Any] = {
            "arm": arm,
            "steps": len(mine),
            "elements_changed": sum(r.elements_changed for r in mine) / n,
            "elements_changed_by_dtype": {
                d: sum(r.elements_changed for r in rows if r.arm == arm and r.dtype == d) / n for d in DTYPES
            },
            "tensors_changed": sum(r.tensors_changed for r in mine) / sum(r.tensors for r in mine),
            "ratio_changed_tensors": sum(r.changed_tensor_bytes for r in mine) / dense,
            "ratio_sparse_index": sum(r.sparse_index_bytes for r in mine) / dense,
            "ratio_sparse_bitmap": sum(r.sparse_bitmap_bytes for r in mine) / dense,
            "ratio_fp8_delta": sum(r.fp8_delta_bytes for r in mine) / dense,
            "fp8_exact": statistics.mean(r.fp8_exact for r in mine),
            "fp8_exact_changed": statistics.mean(r.fp8_exact_changed for r in mine),
        }
        if mine[0].adapter_elements is not None:
            entry["adapter_elements_changed"] = sum(r.adapter_elements_changed or 0 for r in mine) / sum(
                r.adapter_elements or 0 for r in mine
            )
            entry["adapter_bytes_bf16"] = 2 * (mine[0].adapter_elements or 0)
            entry["ratio_adapters"] = entry["adapter_bytes_bf16"] / mine[0].dense_bytes
        for kind in ("index", "bitmap"):
            # per parameter, the median over the steps (robust to a step that shared the cores)
            enc = statistics.median(getattr(r, f"encode_{kind}_s") / r.elements for r in mine)
            dec = statistics.median(getattr(r, f"decode_{kind}_s") / r.elements for r in mine)
            saved = (dense - sum(getattr(r, f"sparse_{kind}_bytes") for r in mine)) / n
            entry[f"encode_{kind}_s_per_gparam"] = enc * 1e9
            entry[f"decode_{kind}_s_per_gparam"] = dec * 1e9
            entry[f"break_even_{kind}_bytes_per_s"] = saved / (enc + dec) if saved > 0 else None
        links = []
        for link, bw in LINKS:
            dense_s = 2 * SHAPE_1P5B / bw
            best_s = min(
                SHAPE_1P5B
                * (
                    2 * entry[f"ratio_sparse_{kind}"] / bw
                    + (entry[f"encode_{kind}_s_per_gparam"] + entry[f"decode_{kind}_s_per_gparam"]) / 1e9
                )
                for kind in ("index", "bitmap")
            )
            bytes_only_s = min(
                2 * SHAPE_1P5B * entry[f"ratio_sparse_{kind}"] / bw for kind in ("index", "bitmap")
            )
            links.append(
                {
                    "link": link,
                    "bytes_per_s": bw,
                    "dense_s": dense_s,
                    "sparse_bytes_only_s": bytes_only_s,
                    "sparse_s": best_s,
                }
            )
        entry["links_1p5b"] = links
        out.append(entry)
    return out


def report(rows: Sequence[Row], settings: Settings, console: Console) -> dict[str, Any]:
    """Print the per-step table, the per-arm summary and the 1.5B-on-links table; returns what
    ``--json`` writes."""
    table = Table(
        title=f"Weight sync deltas after real GRPO steps, {settings.tasks}×{settings.group} episodes a step, "
        f"{settings.threads} threads (bytes in GB; encode/decode seconds on {settings.device})"
    )
    for col in (
        "arm",
        "step",
        "dtype",
        "reward",
        "tensors chg",
        "elements chg",
        "dense",
        "chg tensors",
        "idx+val",
        "bitmap+val",
        "fp8 Δ (chg exact)",
        "enc/dec idx s",
        "enc/dec bitmap s",
        "break-even idx · bitmap",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        timed = r.encode_index_s is not None
        table.add_row(
            r.arm,
            str(r.step),
            r.dtype,
            f"{r.reward_mean:.3f}",
            f"{r.tensors_changed}/{r.tensors}",
            f"{r.elements_changed / r.elements:.2%}",
            _gb(r.dense_bytes),
            _gb(r.changed_tensor_bytes),
            _gb(r.sparse_index_bytes),
            _gb(r.sparse_bitmap_bytes),
            f"{_gb(r.fp8_delta_bytes)} ({r.fp8_exact_changed:.1%})",
            f"{r.encode_index_s:.3f}/{r.decode_index_s:.3f}" if timed else "",
            f"{r.encode_bitmap_s:.3f}/{r.decode_bitmap_s:.3f}" if timed else "",
            f"{_rate(break_even(r, 'index'))} · {_rate(break_even(r, 'bitmap'))}" if timed else "",
        )
    console.print(table)
    arms = summary(rows)
    ratios = Table(title="Per arm, bf16 (the engine's dtype), all steps: bytes as a share of the dense sync")
    for col in (
        "arm",
        "elements chg bf16 · fp16 · fp32",
        "tensors chg",
        "chg tensors",
        "idx+val",
        "bitmap+val",
        "fp8 Δ (chg exact)",
        "adapters only",
        "enc+dec s / Gparam idx · bitmap",
        "break-even idx · bitmap",
    ):
        ratios.add_column(col, justify="right")
    for a in arms:
        ratios.add_row(
            a["arm"],
            " · ".join(f"{v:.2%}" for v in a["elements_changed_by_dtype"].values()),
            f"{a['tensors_changed']:.1%}",
            f"{a['ratio_changed_tensors']:.3f}",
            f"{a['ratio_sparse_index']:.3f}",
            f"{a['ratio_sparse_bitmap']:.3f}",
            f"{a['ratio_fp8_delta']:.3f} ({a['fp8_exact_changed']:.1%})",
            f"{a['ratio_adapters']:.4f} ({a['adapter_elements_changed']:.1%} chg)"
            if "ratio_adapters" in a
            else "",
            f"{a['encode_index_s_per_gparam'] + a['decode_index_s_per_gparam']:.2f} · "
            f"{a['encode_bitmap_s_per_gparam'] + a['decode_bitmap_s_per_gparam']:.2f}",
            f"{_rate(a['break_even_index_bytes_per_s'])} · {_rate(a['break_even_bitmap_bytes_per_s'])}",
        )
    console.print(ratios)
    links = Table(
        title=f"One bf16 sync of the 1.5B shape ({SHAPE_1P5B / 1e9:.3f} B params, this run's shares and "
        f"per-parameter {settings.device} encode+decode scaled up), seconds: dense · the better sparse "
        "encoding's bytes alone · with encode+decode. Link bandwidths are ASSUMED nominal rates"
    )
    links.add_column("link (assumed GB/s)")
    links.add_column("dense s", justify="right")
    for a in arms:
        links.add_column(f"{a['arm']}: bytes only · with enc+dec", justify="right")
    for i, (link, bw) in enumerate(LINKS):
        cells = [f"{link} ({bw / 1e9:g})", f"{2 * SHAPE_1P5B / bw:.3f}"]
        for a in arms:
            e = a["links_1p5b"][i]
            verdict = "wins" if e["sparse_s"] < e["dense_s"] else "loses"
            cells.append(f"{e['sparse_bytes_only_s']:.3f} · {e['sparse_s']:.2f} ({verdict})")
        links.add_row(*cells)
    console.print(links)
    return {"settings": asdict(settings), "rows": [asdict(r) for r in rows], "arms": arms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="where encode/decode are timed (cpu, cuda)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and summary here")
    args = parser.parse_args()
    from swarm.engine import load_model, resolve_model

    settings = Settings(
        steps=args.steps,
        tasks=args.tasks,
        group=args.group,
        max_tokens=args.max_tokens,
        threads=args.threads,
        repeats=args.repeats,
        device=args.device,
    )
    model, tokenizer = load_model(resolve_model(None))
    started = time.perf_counter()
    rows = run(model, tokenizer, settings)
    console = Console(width=220)
    result = report(rows, settings, console)
    result["wall_s"] = time.perf_counter() - started
    console.print(f"{result['wall_s']:.0f} s wall")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
