"""Bench: the ``vllm`` engine against the ``hf`` engine on one GPU, through the real swarm server (issue 15).

Everything runs in one process and one run, engine after engine (each loaded, measured, closed), with the
real embedded weights (SmolLM2-135M-Instruct, fp32) and the real app (`swarm.server.app.create_app`
under uvicorn on loopback, in a thread, as in ``bench/serve.py``).

**Throughput through the server.** ``c`` workers (``--concurrency``) each run episodes of one call
(begin, ``chat.completions`` over the async OpenAI SDK with temperature 1, a distinct seed and
``max_tokens=--tokens``, finish) for ``--rounds`` rounds after one untimed warm-up round. The workers
run in ``--client-processes`` processes apart from the server's (as clients on other machines would),
so the clients' own CPU (the SDK, httpx) never competes with the server for its GIL. Tokens/s =
completion tokens the server reports (``usage``) / wall seconds of the timed rounds. Completions end at
end-of-turn or at ``--tokens``; the prompt asks for a long story so most run to the limit.

**Server overhead (vllm).** The same workload at the highest concurrency, in steady state, three times
each way, interleaved: through the server (``c`` workers in the client processes run episodes back to
back), and as ``VLLMEngine.generate`` calls back to back on the prompt ids the server rendered (vLLM's
AsyncLLM plus the engine's thin bridge), in the bench process while the server idles. Each counts the
completion tokens of the calls that finish inside a ``--window``-second window after a 5 s warm-up.
Overhead = 1 − median server tokens/s ÷ median direct tokens/s. (A single synchronous burst would
charge the server's per-request work at the burst's start and end, when nothing else overlaps it, to
the server; RL rollouts run episodes back to back, as here.)

**One GRPO cycle (vllm).** A training server (full fine-tuning, fp32 AdamW on the GPU, ``episodes``
batch policy, ``--cycle-episodes`` per step in groups of 4 per task): wall seconds of the rollout (first
begin → last finish), of the step (last finish → the server's step counter moves), and the step's parts
(the trainer's own timings; the weight push and the memory vLLM frees are timed around the engine
calls). Memory freed = free GPU memory after ``release_memory`` − before it.

**Logprob drift.** For ``--drift-steps`` steps with lr 0 and as many with lr ``--lr``: the trainer's
``logprob_drift_mean``/``max`` (|recorded − recomputed| logprob per token, recorded by vLLM, recomputed
by the trainer's transformers forward at temperature 1). With lr 0 the weights never change, so the
drift must stay flat: it is the kernel difference, not staleness.

Usage (on a GPU machine with vLLM)::

    python bench/gpu_engine.py                       # ~6 minutes on an H200
    python bench/gpu_engine.py --engines vllm --concurrency 1,64 --json out.json
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
from openai import AsyncOpenAI
from rich.console import Console
from rich.table import Table
from serve import serve

from swarm.client import AsyncSwarmClient, SwarmClient
from swarm.config import ServerConfig, TrainingConfig
from swarm.engine import HFEngine, ModelSource, load_model, resolve_model
from swarm.engine.base import Engine, SamplingParams

STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
console = Console(width=None if sys.stdout.isatty() else 140)


def build_engine(kind: str, source: ModelSource, memory: float, device: str) -> Engine:
    if kind == "hf":
        model, tokenizer = load_model(source, dtype="float32", device=device)
        return HFEngine(model, tokenizer, source.name, max_batch_size=256)
    from swarm.engine.vllm import VLLMEngine

    return VLLMEngine(source, dtype="float32", device=device, gpu_memory_utilization=memory)


# -- throughput ----------------------------------------------------------------------------------------
def call_budget(tokens: int, seed: int | None, spread: float) -> int:
    """``max_tokens`` of one call: ``tokens``, or with ``spread`` > 0 a value in
    ``[tokens·(1 − spread), tokens]`` fixed by the call's seed (the same on the server and direct paths),
    so equal-length completions do not finish in cohorts."""
    if spread <= 0 or seed is None:
        return tokens
    low = max(1, int(tokens * (1 - spread)))
    return low + (seed * 2654435761) % (tokens - low + 1)


async def _story(
    sdk: AsyncOpenAI, episode: Any, tokens: int, seed: int | None = None, timing: list[float] | None = None
) -> int:
    """One story call in ``episode`` (temperature 1); the completion tokens the server reports. With
    ``timing``, appends the server's own account of the call (``Server-Timing``: engine and server ms)."""
    client = sdk.with_options(base_url=episode.base_url, api_key=episode.api_key)
    raw = await client.chat.completions.with_raw_response.create(
        model=episode.model,
        messages=STORY,  # type: ignore[arg-type]
        temperature=1.0,
        max_tokens=tokens,
        seed=seed,
    )
    if timing is not None:
        parts = dict(
            item.strip().split(";dur=") for item in raw.headers.get("server-timing", "").split(",") if item
        )
        timing.extend((float(parts.get("engine", "nan")), float(parts.get("server", "nan"))))
    reply = raw.parse()
    return reply.usage.completion_tokens if reply.usage else 0


async def _episode(
    swarm: AsyncSwarmClient,
    sdk: AsyncOpenAI,
    task: str,
    seed: int,
    tokens: int,
    times: list[float] | None = None,
    spread: float = 0.0,
) -> int:
    """One episode (begin, one story call, finish); with ``times``, appends the three calls' wall
    seconds (begin, chat, finish) as seen by the client, then the chat's engine and server-side
    seconds from its ``Server-Timing`` header."""
    t0 = time.perf_counter()
    episode = await swarm.begin(task, kind="eval")
    t1 = time.perf_counter()
    timing: list[float] = []
    used = await _story(sdk, episode, call_budget(tokens, seed, spread), seed, timing)
    t2 = time.perf_counter()
    await episode.finish(0.0)
    if times is not None:  # begin, chat, finish as the client saw them; the chat's engine and server ms
        times.extend((t1 - t0, t2 - t1, time.perf_counter() - t2, timing[0] / 1e3, timing[1] / 1e3))
    return used


async def _client_rounds(
    url: str, concurrency: int, rounds: int, tokens: int, first_seed: int, barrier: Any
) -> tuple[int, float, float]:
    """One client process's share: a warm-up round, the barrier, then ``rounds`` timed rounds."""
    sdk = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    async with sdk, AsyncSwarmClient(url, client_id=f"bench-{first_seed}") as swarm:
        seeds = iter(range(first_seed, first_seed + 10**5))

        async def round_() -> int:
            jobs = [_episode(swarm, sdk, f"t{i}", next(seeds), tokens) for i in range(concurrency)]
            return sum(await asyncio.gather(*jobs))

        await round_()  # warm-up
        barrier.wait()  # every process starts its timed rounds together
        started = time.time()
        produced = sum([await round_() for _ in range(rounds)])
        return produced, started, time.time()


async def _client_window(
    url: str,
    concurrency: int,
    tokens: int,
    first_seed: int,
    barrier: Any,
    warmup_s: float,
    window_s: float,
    spread: float = 0.0,
) -> tuple[int, list[list[float]]]:
    """One client process's share in steady state: ``concurrency`` workers run episodes back to back;
    the completion tokens of the calls that finish inside the window (after ``warmup_s``) are counted."""
    sdk = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    async with sdk, AsyncSwarmClient(url, client_id=f"bench-{first_seed}") as swarm:
        seeds = iter(range(first_seed, first_seed + 10**6))
        barrier.wait()
        opens = time.time() + warmup_s
        closes = opens + window_s
        counted = 0
        parts: list[list[float]] = []

        async def worker(i: int) -> None:
            nonlocal counted
            while time.time() < closes:
                times: list[float] = []
                used = await _episode(swarm, sdk, f"t{i}", next(seeds), tokens, times, spread)
                if opens <= time.time() <= closes:
                    counted += used
                    parts.append(times)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return counted, parts


def _client_window_process(*args: Any) -> tuple[int, list[list[float]]]:
    """`_client_window` run to completion in a client process (its arguments, in order)."""
    return asyncio.run(_client_window(*args))


def _client_process(
    url: str, concurrency: int, rounds: int, tokens: int, first_seed: int, barrier: Any
) -> tuple[int, float, float]:
    return asyncio.run(_client_rounds(url, concurrency, rounds, tokens, first_seed, barrier))


@dataclass
class ClientProcesses:
    """Client processes apart from the server's, so clients' CPU (the OpenAI SDK parsing, httpx) never
    shares the server process's GIL: the measurement is the server's, as with clients on other machines."""

    processes: int
    pool: ProcessPoolExecutor = field(init=False)
    manager: Any = field(init=False)

    def __post_init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(self.processes, mp_context=context)
        self.manager = context.Manager()

    def close(self) -> None:
        self.pool.shutdown()
        self.manager.shutdown()

    def throughput(self, url: str, concurrency: int, rounds: int, tokens: int) -> float:
        """Completion tokens/s through the server with ``concurrency`` episodes in flight, spread over
        up to ``processes`` client processes (total tokens / (last end - first start))."""
        k = min(self.processes, concurrency)
        shares = [concurrency // k + (1 if i < concurrency % k else 0) for i in range(k)]
        barrier = self.manager.Barrier(k)
        jobs = [
            self.pool.submit(_client_process, url, share, rounds, tokens, (i + 1) * 10**5, barrier)
            for i, share in enumerate(shares)
        ]
        results = [job.result() for job in jobs]
        return sum(r[0] for r in results) / (max(r[2] for r in results) - min(r[1] for r in results))

    def steady(
        self, url: str, concurrency: int, tokens: int, warmup_s: float, window_s: float, spread: float = 0.0
    ) -> tuple[float, list[float]]:
        """Completion tokens/s through the server in steady state (`_client_window`), and the median
        wall seconds of an episode's begin, chat and finish calls as its clients saw them."""
        k = min(self.processes, concurrency)
        shares = [concurrency // k + (1 if i < concurrency % k else 0) for i in range(k)]
        barrier = self.manager.Barrier(k)
        jobs = [
            self.pool.submit(
                _client_window_process,
                url,
                share,
                tokens,
                (i + 1) * 10**6,
                barrier,
                warmup_s,
                window_s,
                spread,
            )
            for i, share in enumerate(shares)
        ]
        results = [job.result() for job in jobs]
        parts = [times for _, share in results for times in share]
        medians = [statistics.median(t[i] for t in parts) if parts else float("nan") for i in range(5)]
        return sum(used for used, _ in results) / window_s, medians


async def direct_steady(
    engine: Engine,
    prompt_ids: list[int],
    concurrency: int,
    tokens: int,
    warmup_s: float,
    window_s: float,
    spread: float = 0.0,
) -> tuple[float, float]:
    """Completion tokens/s of ``engine.generate`` alone in steady state: ``concurrency`` workers call it
    back to back on the same prompt; the tokens of calls that finish inside the window are counted.
    Also returns the median wall seconds of one call."""
    opens = time.time() + warmup_s
    closes = opens + window_s
    counted = 0
    walls: list[float] = []
    seeds = iter(range(10**7, 2 * 10**7))

    async def worker() -> None:
        nonlocal counted
        while time.time() < closes:
            started = time.perf_counter()
            seed = next(seeds)
            (completion,) = await engine.generate(
                prompt_ids, SamplingParams(max_tokens=call_budget(tokens, seed, spread), seed=seed)
            )
            if opens <= time.time() <= closes:
                counted += len(completion.ids)
                walls.append(time.perf_counter() - started)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return counted / window_s, statistics.median(walls) if walls else float("nan")


def rendered_prompt(url: str) -> list[int]:
    with SwarmClient(url, client_id="bench-prompt") as swarm, swarm.episode("prompt", kind="eval") as ep:
        from openai import OpenAI

        OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
            model=ep.model,
            messages=STORY,  # type: ignore[arg-type]
            max_tokens=1,
        )
        ep.finish(0.0)
        return list(swarm.get_episode(ep.id).calls[0].prompt_ids)


# -- training ------------------------------------------------------------------------------------------
@dataclass
class StepProbe:
    """Times the engine's step hooks (wrapped on the instance) and the memory they free."""

    push_s: list[float] = field(default_factory=list)
    freed_gib: list[float] = field(default_factory=list)

    def attach(self, engine: Any) -> None:
        release: Callable[[], None] = engine.release_memory
        load: Callable[..., None] = engine.load_weights

        def timed_release() -> None:
            before = _free_gpu_bytes()
            release()
            self.freed_gib.append((_free_gpu_bytes() - before) / 2**30)

        def timed_load(module: Any, policy_version: int) -> None:
            started = time.perf_counter()
            load(module, policy_version)
            self.push_s.append(time.perf_counter() - started)

        engine.release_memory = timed_release
        engine.load_weights = timed_load


async def rollout(url: str, episodes: int, tokens: int, tag: str) -> float:
    """``episodes`` episodes in groups of 4 (rewarded by length, so groups have signal); wall seconds."""
    sdk = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    async with sdk, AsyncSwarmClient(url, client_id=f"bench-train-{tag}") as swarm:

        async def one(i: int) -> None:
            async with swarm.episode(f"{tag}-task{i // 4}") as episode:
                await episode.finish(await _story(sdk, episode, tokens) / tokens)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(episodes)))
        return time.perf_counter() - started


def wait_for_step(url: str, step: int, timeout_s: float = 600) -> float:
    started = time.perf_counter()
    with SwarmClient(url, client_id="bench-wait") as swarm:
        while swarm.status().step < step:
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"step {step} did not finish in {timeout_s} s")
            time.sleep(0.02)
    return time.perf_counter() - started


def _free_gpu_bytes() -> int:
    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0


def training_config(run_dir: Path, episodes: int, lr: float, device: str) -> ServerConfig:
    training = TrainingConfig.model_validate(
        {
            "batch": {"policy": "episodes", "batch_size": episodes // 4, "group_size": 4},
            "trainer": {"lr": lr, "micro_batch_size": 16},
            "checkpoint_every": 1000,
        }
    )
    return ServerConfig(run_dir=run_dir, port=0, device=device, training=training)


def measure_overhead(
    clients: ClientProcesses,
    engine: Engine,
    url: str,
    prompt: list[int],
    top: int,
    tokens: int,
    window: float,
    pairs: int,
    spread: float = 0.0,
) -> dict[str, Any]:
    """Server vs direct tokens/s at ``top`` concurrent, ``pairs`` steady-state windows each way, the
    order alternating (direct first on even pairs); overhead = 1 - median server / median direct."""
    http: list[float] = []
    direct: list[float] = []
    direct_call: list[float] = []
    episode_parts: list[list[float]] = []
    for r in range(pairs):
        for side in ("direct", "http") if r % 2 == 0 else ("http", "direct"):
            if side == "direct":
                rate, call = asyncio.run(direct_steady(engine, prompt, top, tokens, 5.0, window, spread))
                direct.append(rate)
                direct_call.append(call)
            else:
                rate, parts = clients.steady(url, top, tokens, 5.0, window, spread)
                http.append(rate)
                episode_parts.append(parts)
    mid_http, mid_direct = statistics.median(http), statistics.median(direct)
    return {
        # median wall ms of one direct call, and of an episode's begin / chat / finish through the server
        "direct_call_ms": 1e3 * statistics.median(direct_call),
        "episode_ms": [1e3 * statistics.median(p[i] for p in episode_parts) for i in range(3)],
        # the chat call's median engine and server-side ms from its Server-Timing header
        "chat_server_timing_ms": [1e3 * statistics.median(p[i] for p in episode_parts) for i in (3, 4)],
        "concurrency": top,
        "server_tok_s": mid_http,
        "direct_tok_s": mid_direct,
        "overhead": (1 - mid_http / mid_direct) if mid_direct > 0 else float("nan"),
        "pair_overheads": [1 - h / d if d > 0 else float("nan") for h, d in zip(http, direct, strict=True)],
        "server_runs": http,
        "direct_runs": direct,
        "window_s": window,
    }


# -- main ----------------------------------------------------------------------------------------------
def main(
    engines: Annotated[str, typer.Option(help="comma-separated: hf, vllm")] = "hf,vllm",
    concurrency: Annotated[str, typer.Option(help="comma-separated episode concurrencies")] = "1,16,64,256",
    rounds: Annotated[int, typer.Option(min=1)] = 2,
    repeats: Annotated[
        int, typer.Option(min=1, help="throughput measurements per level (the table shows their median)")
    ] = 1,
    tokens: Annotated[int, typer.Option(min=1, help="max_tokens per call")] = 128,
    cycle_episodes: Annotated[int, typer.Option(min=4)] = 64,
    drift_steps: Annotated[int, typer.Option(min=0)] = 5,
    drift_episodes: Annotated[int, typer.Option(min=4)] = 16,
    lr: Annotated[float, typer.Option(help="lr of the drift run with lr > 0")] = 1e-5,
    memory: Annotated[float, typer.Option(help="vLLM gpu_memory_utilization")] = 0.3,
    device: Annotated[
        str, typer.Option(help="engines' and trainer's device (cpu: a quick smoke run)")
    ] = "cuda",
    train_engine: Annotated[str, typer.Option(help="engine of the GRPO-cycle and drift runs")] = "vllm",
    window: Annotated[
        float, typer.Option(min=1.0, help="seconds of each steady-state overhead window (after 5 s warm-up)")
    ] = 20.0,
    pairs: Annotated[int, typer.Option(min=1, help="overhead windows each way (interleaved)")] = 3,
    tokens_spread: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.9,
            help="overhead runs only: each call's max_tokens drawn in [tokens·(1 − spread), tokens] from its seed",
        ),
    ] = 0.0,
    overhead_at: Annotated[
        str, typer.Option(help="comma-separated concurrencies of the overhead runs (default: the highest)")
    ] = "",
    switch_intervals: Annotated[
        str,
        typer.Option(
            help="comma-separated sys.setswitchinterval values (s) of the server's process to measure the "
            "overhead under (default: Python's 0.005 only)"
        ),
    ] = "",
    client_processes: Annotated[
        int, typer.Option(min=1, help="processes the concurrent clients are spread over")
    ] = 8,
    train: Annotated[
        bool,
        typer.Option(
            help="run the GRPO-cycle and drift runs after the overhead (--no-train: throughput and overhead only)"
        ),
    ] = True,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise typer.BadParameter("no CUDA GPU here (--device cpu runs a quick smoke run of the hf engine)")
    intervals = (
        [float(v) for v in switch_intervals.split(",")] if switch_intervals else [sys.getswitchinterval()]
    )
    source = resolve_model(None)
    levels = [int(c) for c in concurrency.split(",")]
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else device
    results: dict[str, Any] = {
        "gpu": gpu,
        "tokens": tokens,
        "client_processes": client_processes,
    }
    results["throughput"] = {}  # engine -> concurrency -> median tok/s over the repeats
    results["throughput_runs"] = {}  # engine -> concurrency -> tok/s of each repeat
    clients = ClientProcesses(client_processes)
    try:
        for kind in engines.split(","):
            engine = build_engine(kind, source, memory, device)
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    config = ServerConfig(run_dir=Path(tmp), port=0, training=TrainingConfig(enabled=False))
                    with serve(engine, config.run_dir, config) as url:
                        rows = {}
                        for c in levels:
                            runs = [clients.throughput(url, c, rounds, tokens) for _ in range(repeats)]
                            rows[c] = statistics.median(runs)
                            results["throughput_runs"].setdefault(kind, {})[c] = runs
                            shown = ", ".join(f"{r:,.0f}" for r in runs)
                            console.print(f"{kind} through the server, {c} concurrent: {shown} tok/s")
                        results["throughput"][kind] = rows
                        if kind == train_engine:
                            prompt = rendered_prompt(url)
                            at = [int(c) for c in overhead_at.split(",")] if overhead_at else [max(levels)]
                            default_interval = sys.getswitchinterval()
                            for top in at:
                                for interval in intervals:
                                    sys.setswitchinterval(interval)
                                    row = measure_overhead(
                                        clients,
                                        engine,
                                        url,
                                        prompt,
                                        top,
                                        tokens,
                                        window,
                                        pairs,
                                        tokens_spread,
                                    )
                                    row["switch_interval_s"] = interval
                                    row["tokens_spread"] = tokens_spread
                                    results.setdefault("overheads", []).append(row)
                                    console.print(row)
                            sys.setswitchinterval(default_interval)
                            results["overhead"] = results["overheads"][-1]
                if kind == train_engine and train:
                    results["cycle"], results["drift"] = train_runs(
                        engine, cycle_episodes, drift_steps, drift_episodes, lr, tokens, device
                    )
            finally:
                engine.close()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    finally:
        clients.close()
    report(results)
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2, default=str))


def train_runs(
    engine: Engine,
    cycle_episodes: int,
    drift_steps: int,
    drift_episodes: int,
    lr: float,
    tokens: int,
    device: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    probe = StepProbe()
    probe.attach(engine)
    cycle: dict[str, Any] = {}
    drift: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with serve(
            engine, Path(tmp), training_config(Path(tmp) / "cycle", cycle_episodes, 1e-5, device)
        ) as url:
            roll_s = asyncio.run(rollout(url, cycle_episodes, tokens, "cycle"))
            step_s = wait_for_step(url, 1)
            with SwarmClient(url, client_id="bench-metrics") as swarm:
                row = swarm.metrics()[-1]
            cycle = {
                "episodes": cycle_episodes,
                "rollout_s": roll_s,
                "step_s": step_s,
                "trainer_s": row.time_s.model_dump(),
                "push_s": probe.push_s[-1],
                "freed_gib": probe.freed_gib[-1],
            }
            console.print(cycle)
        for name, rate in (("lr0", 0.0), (f"lr{lr:g}", lr)):
            with serve(
                engine, Path(tmp), training_config(Path(tmp) / name, drift_episodes, rate, device)
            ) as url:
                for step in range(1, drift_steps + 1):
                    asyncio.run(rollout(url, drift_episodes, tokens, f"{name}-{step}"))
                    wait_for_step(url, step)
                with SwarmClient(url, client_id="bench-metrics") as swarm:
                    rows = swarm.metrics()
                drift[name] = {
                    "mean": [r.logprob_drift_mean for r in rows],
                    "max": [r.logprob_drift_max for r in rows],
                }
                console.print(name, drift[name])
    cycle["push_s_all"] = probe.push_s
    return cycle, drift


def report(results: dict[str, Any]) -> None:
    table = Table(title=f"GPU engines on {results['gpu']} (max_tokens {results['tokens']})")
    table.add_column("measurement")
    table.add_column("value", justify="right")
    through, runs = results["throughput"], results["throughput_runs"]
    for kind, rows in through.items():
        for c, tok_s in rows.items():
            each = runs[kind][c]
            label = f"{kind} through the server, {c} concurrent (tok/s" + (
                f", median of {len(each)}: {min(each):,.0f}–{max(each):,.0f})" if len(each) > 1 else ")"
            )
            table.add_row(label, f"{tok_s:,.0f}")
    if "hf" in through and "vllm" in through:
        for c in through["vllm"]:
            if c in through["hf"]:
                low = min(runs["vllm"][c]) / max(runs["hf"][c])
                high = max(runs["vllm"][c]) / min(runs["hf"][c])
                spread = f" (runs allow {low:.1f}–{high:.1f}×)" if low != high else ""
                table.add_row(
                    f"vllm / hf at {c} concurrent, medians{spread}",
                    f"{through['vllm'][c] / through['hf'][c]:.1f}×",
                )
    for o in results.get("overheads", []):
        pairs = " ".join(f"{100 * p:+.1f}" for p in o["pair_overheads"])
        begin, chat, finish = o["episode_ms"]
        engine_ms, server_ms = o.get("chat_server_timing_ms", [float("nan")] * 2)
        table.add_row(
            f"server overhead vs engine.generate at {o['concurrency']}, switch interval "
            f"{1e3 * o['switch_interval_s']:g} ms"
            + (f", max_tokens spread {o['tokens_spread']:g}" if o.get("tokens_spread") else "")
            + f", steady state (pairs: {pairs} %; "
            f"median ms: direct call {o['direct_call_ms']:.0f}, episode begin {begin:.0f} · chat {chat:.0f}"
            f" · finish {finish:.0f}; in the chat, server-side: engine {engine_ms:.0f} · the rest {server_ms:.0f})",
            f"{100 * o['overhead']:+.1f} %",
        )
    if "cycle" in results:
        c = results["cycle"]
        table.add_row(f"GRPO cycle, {c['episodes']} episodes: rollout (s)", f"{c['rollout_s']:.2f}")
        table.add_row("… step incl. push (s)", f"{c['step_s']:.2f}")
        table.add_row("… weight push (s)", f"{c['push_s']:.3f}")
        table.add_row("… KV cache memory freed during the step (GiB)", f"{c['freed_gib']:.1f}")
    for name, d in results.get("drift", {}).items():
        table.add_row(f"logprob drift mean per step, {name}", " ".join(f"{v:.2e}" for v in d["mean"]))
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
