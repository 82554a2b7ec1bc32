"""Bench: LoRA on the ``vllm`` engine: push merged weights, or hot-load the adapter? (issue 15, item 3).

The trainer updates a peft LoRA adapter (rank 16, α 32, every Llama linear layer: the trainer's default)
on the real embedded weights. After each step the serving engine must sample from base + adapter. Two
ways, measured in one run on one GPU, one engine after the other:

- **merged** (what ``VLLMEngine.load_weights`` does): the merged weights ``W + (α/r)·B·A`` go to vLLM's
  worker over CUDA IPC handles, loaded in place; vLLM then samples a plain model (no adapter kernels).
- **hot-load**: the adapter is saved (``save_pretrained``, safetensors) and loaded into a vLLM engine
  started with ``enable_lora`` (``AsyncLLM.add_lora``, a new adapter id per policy version); every request
  carries the ``LoRARequest`` and vLLM applies the adapter per token (punica kernels).

Per way: the push time (median of ``--pushes``; the adapter's B matrices are perturbed before each, so
every push carries new weights), the first request after a push (which pays any lazy load), and
completion tokens/s with ``--concurrency`` requests of ``--tokens`` tokens in flight (median of 3).
Both ways must agree on what they serve: the greedy completion of one prompt after the last push is
compared token by token (the agreement is printed; kernels differ, so a late divergence can happen).

Usage (on a GPU machine with vLLM)::

    python bench/lora_push.py                        # ~2 minutes on an H200
    python bench/lora_push.py --dtype bfloat16 --json out.json
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from rich.console import Console
from rich.table import Table

from swarm.engine import load_model, resolve_model
from swarm.engine.base import SamplingParams
from swarm.train.config import LoraSettings

PROMPT = "Write a long story about a dragon who learns to bake bread."
console = Console(width=None if sys.stdout.isatty() else 140)


def lora_model(dtype: str) -> Any:
    """The embedded model on the GPU with the trainer's default LoRA adapter, B initialised non-zero."""
    from peft import LoraConfig, get_peft_model

    source = resolve_model(None)
    model, tokenizer = load_model(source, dtype=dtype, device="cuda")
    lora = LoraSettings()
    config = LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.target_modules), task_type="CAUSAL_LM"
    )
    peft_model = get_peft_model(model, config)
    perturb(peft_model, 0)
    return peft_model, tokenizer


def perturb(peft_model: Any, seed: int) -> None:
    """New adapter weights, as an optimizer step would give (B ~ N(0, 0.02²), seeded)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator, device="cuda") * 0.02)


def prompt_ids(tokenizer: Any) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def merged_way(peft_model: Any, ids: list[int], args: dict[str, Any]) -> dict[str, Any]:
    """Push merged weights into ``VLLMEngine`` (the engine the server runs)."""
    from swarm.engine.vllm import VLLMEngine

    engine = VLLMEngine(
        resolve_model(None), dtype=args["dtype"], device="cuda", gpu_memory_utilization=args["memory"]
    )
    try:
        pushes, firsts = [], []
        for version in range(1, args["pushes"] + 1):
            perturb(peft_model, version)
            torch.cuda.synchronize()
            started = time.perf_counter()
            engine.load_weights(peft_model, version)
            pushes.append(time.perf_counter() - started)
            started = time.perf_counter()
            asyncio.run(engine.generate(ids, SamplingParams(max_tokens=1, seed=version)))
            firsts.append(time.perf_counter() - started)

        async def burst() -> float:
            params = [SamplingParams(max_tokens=args["tokens"], seed=s) for s in range(args["concurrency"])]
            started = time.perf_counter()
            done = await asyncio.gather(*(engine.generate(ids, p) for p in params))
            return sum(len(c[0].ids) for c in done) / (time.perf_counter() - started)

        asyncio.run(burst())  # warm-up
        rates = [asyncio.run(burst()) for _ in range(3)]
        (greedy,) = asyncio.run(engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=64)))
        return {"push_s": pushes, "first_s": firsts, "tok_s": rates, "greedy": greedy.ids}
    finally:
        engine.close()
        torch.cuda.empty_cache()


async def hot_load_way(peft_model: Any, ids: list[int], args: dict[str, Any]) -> dict[str, Any]:
    """Save the adapter and ``add_lora`` it into a vLLM engine started with ``enable_lora``."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

    source = resolve_model(None)
    directory = str(source.directory)
    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=directory,
            dtype=args["dtype"],
            gpu_memory_utilization=args["memory"],
            enable_lora=True,
            max_lora_rank=LoraSettings().r,
            max_loras=2,
            enable_prefix_caching=True,
            disable_log_stats=True,
        )
    )
    counter = iter(range(10**9))

    async def one(sampling: Any, adapter: Any) -> list[int]:
        final = None
        async for out in llm.generate(
            TokensPrompt(prompt_token_ids=ids), sampling, f"r{next(counter)}", lora_request=adapter
        ):
            final = out
        assert final is not None
        return list(final.outputs[0].token_ids)

    try:
        pushes, firsts = [], []
        adapter = None
        with tempfile.TemporaryDirectory() as tmp:
            for version in range(1, args["pushes"] + 1):
                perturb(peft_model, version)
                torch.cuda.synchronize()
                started = time.perf_counter()
                path = Path(tmp) / f"v{version}"
                peft_model.save_pretrained(str(path))
                adapter = LoRARequest(f"policy-v{version}", version, str(path))
                await llm.add_lora(adapter)
                if adapter.lora_int_id > 1:
                    await llm.remove_lora(version - 1)
                pushes.append(time.perf_counter() - started)
                started = time.perf_counter()
                await one(VllmSamplingParams(max_tokens=1, seed=version, detokenize=False), adapter)
                firsts.append(time.perf_counter() - started)

            async def burst() -> float:
                sampling = [
                    VllmSamplingParams(max_tokens=args["tokens"], seed=s, detokenize=False)
                    for s in range(args["concurrency"])
                ]
                started = time.perf_counter()
                done = await asyncio.gather(*(one(s, adapter) for s in sampling))
                return sum(len(d) for d in done) / (time.perf_counter() - started)

            await burst()  # warm-up
            rates = [await burst() for _ in range(3)]
            greedy = await one(VllmSamplingParams(temperature=0.0, max_tokens=64, detokenize=False), adapter)
        return {"push_s": pushes, "first_s": firsts, "tok_s": rates, "greedy": greedy}
    finally:
        llm.shutdown()
        torch.cuda.empty_cache()


def main(
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16")] = "float32",
    pushes: Annotated[int, typer.Option(min=1)] = 5,
    concurrency: Annotated[int, typer.Option(min=1)] = 64,
    tokens: Annotated[int, typer.Option(min=1)] = 128,
    memory: Annotated[float, typer.Option(help="vLLM gpu_memory_utilization")] = 0.3,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    if not torch.cuda.is_available():
        raise typer.BadParameter("needs a CUDA GPU and vLLM (both ways run vLLM)")
    args = {"dtype": dtype, "pushes": pushes, "concurrency": concurrency, "tokens": tokens, "memory": memory}
    peft_model, tokenizer = lora_model(dtype)
    ids = prompt_ids(tokenizer)
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), **args}
    results["merged"] = merged_way(peft_model, ids, args)
    console.print("merged:", {k: v for k, v in results["merged"].items() if k != "greedy"})
    try:
        results["hot-load"] = asyncio.run(hot_load_way(peft_model, ids, args))
        console.print("hot-load:", {k: v for k, v in results["hot-load"].items() if k != "greedy"})
    except Exception as exc:  # a vLLM build without LoRA kernels for this dtype: that is the finding
        results["hot-load"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        console.print(f"hot-load failed: {results['hot-load']['error']}")
    report(results)
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2, default=str))


def report(results: dict[str, Any]) -> None:
    table = Table(title=f"LoRA on vLLM, {results['dtype']}, {results['gpu']}")
    table.add_column("measurement")
    for way in ("merged", "hot-load"):
        table.add_column(way, justify="right")
    rows = {way: results[way] for way in ("merged", "hot-load")}

    def cell(way: str, key: str, fmt: str) -> str:
        values = rows[way].get(key)
        return format(statistics.median(values), fmt) if values else rows[way].get("error", "-")[:40]

    table.add_row("push (s, median)", cell("merged", "push_s", ".3f"), cell("hot-load", "push_s", ".3f"))
    table.add_row(
        "first request after push (s)", cell("merged", "first_s", ".3f"), cell("hot-load", "first_s", ".3f")
    )
    table.add_row(
        f"tok/s at {results['concurrency']} concurrent",
        cell("merged", "tok_s", ",.0f"),
        cell("hot-load", "tok_s", ",.0f"),
    )
    merged, hot = rows["merged"].get("greedy"), rows["hot-load"].get("greedy")
    if merged and hot:
        same = next(
            (i for i, (a, b) in enumerate(zip(merged, hot, strict=False)) if a != b),
            min(len(merged), len(hot)),
        )
        table.add_row(
            "greedy tokens identical before first divergence", str(same), f"of {min(len(merged), len(hot))}"
        )
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
