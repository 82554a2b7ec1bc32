"""Bench: what the swarm server's HTTP + tracking path costs, and how batching scales (issue 2, item 6).

One process loads the embedded model (SmolLM2-135M-Instruct, fp32, CPU) into one
:class:`~swarm.engine.hf.HFEngine` and serves it with the real app (:func:`~swarm.server.app.create_app`
under uvicorn on loopback, in a thread, as ``swarm serve`` does minus the process boundary). The
clients run in the main thread, so both sides of each comparison use the very same engine object.

**Overhead.** For each ``--overhead-tokens`` value ``M`` the same chat prompt is sampled greedily
(temperature 0, ``max_tokens=M``) two ways, interleaved (the order alternates every repeat):

- *direct*: ``engine.generate_sync(prompt_ids, params)`` with the prompt ids the server rendered;
- *HTTP*: ``openai.OpenAI(...).chat.completions.create`` with the key of a fresh episode: HTTP,
  validation, key lookup, chat-template rendering, sampling, the token-level call record and the
  OpenAI response. Episode begin and finish (pool commit) are timed separately, not in the call.

Greedy decoding makes both completions the same tokens (checked), so the difference is the serving
path. On a shared machine the engine's own time for identical work swings by tens of percent with
other processes' load, which drowns a 5 % difference in wall times. So the overhead is measured as the
time each call spends *outside* the engine batch that sampled it (wall time minus the batch time the
engine reports: ``Completion.generate_s`` directly, ``CallRecord.generate_s`` over HTTP), HTTP minus
direct (medians; the direct side's outside time is the batch window and thread hand-off), relative
to the direct median wall time. Target: ≤ 5 %. The paired wall-time ratio (median of
``http_i / direct_i - 1``, order alternating) is shown too; it includes the load noise.

**Throughput.** ``c`` workers (``--concurrency``) each run ``--rounds`` episodes of one call
(begin, chat with temperature 1, a distinct seed and ``max_tokens=--throughput-tokens``, finish) over
the async OpenAI SDK, after one untimed warm-up round (so the rows show steady state, not the cold
start where the first batch leaves with whoever arrived in the first batch window). Tokens/s =
completion tokens reported by the server (``usage``) / wall time of the timed rounds. The engine
batches concurrent requests statically, so the rows per batch are shown.
Target: 16 concurrent ≥ 4× the tokens/s of 1.

Usage::

    .venv/bin/python bench/serve.py                                # a few minutes on 2 cores
    .venv/bin/python bench/serve.py --repeats 3 --rounds 2 --overhead-tokens 16 --throughput-tokens 16
    .venv/bin/python bench/serve.py --json results.json             # also write the numbers
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
import typer
import uvicorn
from openai import AsyncOpenAI, OpenAI
from rich.console import Console
from rich.table import Table

from swarm.client import AsyncSwarmClient, SwarmClient
from swarm.config import ServerConfig
from swarm.engine import HFEngine, load_model, resolve_model
from swarm.engine.base import Engine, SamplingParams
from swarm.server.app import create_app
from swarm.server.http_protocol import http_protocol

OVERHEAD_TARGET = 0.05
"""Largest allowed relative per-call overhead of HTTP + tracking over the engine."""
SPEEDUP_TARGET = 4.0
"""Smallest allowed tokens/s ratio of the highest concurrency to concurrency 1."""

OVERHEAD_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain in a few paragraphs how a bicycle stays upright."},
]
STORY_MESSAGES = [
    {
        "role": "user",
        "content": "Write a long story about a dragon who learns to bake bread. Use many chapters.",
    }
]

console = Console(width=None if sys.stdout.isatty() else 120)


@contextlib.contextmanager
def serve(engine: Engine | None, run_dir: Path, config: ServerConfig | None = None) -> Iterator[str]:
    """Run the swarm app over ``engine`` with uvicorn on a free loopback port; yields the root URL.

    ``config`` defaults to a training server in ``run_dir`` (``config.run_dir`` wins when given);
    ``engine=None`` lets the server load the configured model itself (its trainer then shares it)."""
    app = create_app(config or ServerConfig(run_dir=run_dir, port=0), engine=engine)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", timeout_keep_alive=300, http=http_protocol()
        )
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the bench server failed to start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# -- overhead ------------------------------------------------------------------------------------------
@dataclass
class OverheadRow:
    max_tokens: int
    completion_tokens: int
    direct_s: list[float]
    """Wall seconds of ``engine.generate_sync`` per repeat."""
    direct_engine_s: list[float]
    """Seconds of the engine batch inside each direct call."""
    http_s: list[float]
    """Wall seconds of the SDK's ``chat.completions.create`` per repeat."""
    http_engine_s: list[float]
    """Seconds of the engine batch inside each HTTP call (from the call record)."""
    begin_finish_s: list[float]
    """Seconds of episode begin + finish around each HTTP call (not in ``http_s``)."""

    @property
    def overhead_s(self) -> float:
        """Median seconds per call outside the engine batch, HTTP minus direct."""
        http = statistics.median(w - e for w, e in zip(self.http_s, self.http_engine_s, strict=True))
        direct = statistics.median(w - e for w, e in zip(self.direct_s, self.direct_engine_s, strict=True))
        return http - direct

    @property
    def overhead(self) -> float:
        """:attr:`overhead_s` relative to the median direct call."""
        return self.overhead_s / statistics.median(self.direct_s)

    @property
    def wall_ratio(self) -> float:
        """Median over repeats of ``http_i / direct_i - 1`` (paired; includes load noise)."""
        return statistics.median(h / d - 1.0 for h, d in zip(self.http_s, self.direct_s, strict=True))


def _http_call(
    swarm: SwarmClient, base: OpenAI, max_tokens: int
) -> tuple[float, float, float, list[int], list[int]]:
    """One greedy call in a fresh episode: (call s, engine s, begin + finish s, prompt, completion ids)."""
    t0 = time.perf_counter()
    episode = swarm.begin(f"overhead-{max_tokens}", kind="eval")
    t1 = time.perf_counter()
    client = base.with_options(base_url=episode.base_url, api_key=episode.api_key)
    t2 = time.perf_counter()
    reply = client.chat.completions.create(
        model=episode.model,
        messages=OVERHEAD_MESSAGES,  # type: ignore[arg-type]
        temperature=0.0,
        max_tokens=max_tokens,
    )
    t3 = time.perf_counter()
    episode.finish(0.0)
    t4 = time.perf_counter()
    call = swarm.get_episode(episode.id).calls[0]
    if reply.usage is None or reply.usage.completion_tokens != len(call.completion_ids):
        raise RuntimeError("the reported usage does not match the recorded call")
    return t3 - t2, call.generate_s, (t1 - t0) + (t4 - t3), call.prompt_ids, call.completion_ids


def measure_overhead(engine: HFEngine, url: str, max_tokens: int, repeats: int) -> OverheadRow:
    """Interleaved greedy calls, direct and over HTTP, with identical prompts and completions."""
    base = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with base, SwarmClient(url, client_id="bench-serve") as swarm:
        *_, prompt_ids, reference = _http_call(swarm, base, max_tokens)  # warm-up; the prompt ids
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        if engine.generate_sync(prompt_ids, params)[0].ids != reference:
            raise RuntimeError("greedy completions differ between the engine and the server")
        row = OverheadRow(max_tokens, len(reference), [], [], [], [], [])
        for r in range(repeats):
            for side in ("direct", "http") if r % 2 == 0 else ("http", "direct"):
                if side == "direct":
                    t0 = time.perf_counter()
                    completion = engine.generate_sync(prompt_ids, params)[0]
                    row.direct_s.append(time.perf_counter() - t0)
                    row.direct_engine_s.append(completion.generate_s)
                    ids = completion.ids
                else:
                    call_s, engine_s, begin_finish_s, _, ids = _http_call(swarm, base, max_tokens)
                    row.http_s.append(call_s)
                    row.http_engine_s.append(engine_s)
                    row.begin_finish_s.append(begin_finish_s)
                if ids != reference:
                    raise RuntimeError(f"the {side} greedy completion changed between repeats")
        return row


# -- throughput ----------------------------------------------------------------------------------------
@dataclass
class ThroughputRow:
    concurrency: int
    calls: int
    tokens: int
    full_length: int
    wall_s: float
    batches: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def rows_per_batch(self) -> float:
        return self.calls / max(self.batches, 1)


async def _worker(
    swarm: AsyncSwarmClient, base: AsyncOpenAI, worker: int, concurrency: int, rounds: int, max_tokens: int
) -> list[int]:
    tokens = []
    for r in range(rounds):
        episode = await swarm.begin(f"throughput-c{concurrency}-w{worker}-r{r}", kind="eval")
        client = base.with_options(base_url=episode.base_url, api_key=episode.api_key)
        reply = await client.chat.completions.create(
            model=episode.model,
            messages=STORY_MESSAGES,  # type: ignore[arg-type]
            temperature=1.0,
            max_tokens=max_tokens,
            seed=(concurrency * 1000 + worker) * 1000 + r,
        )
        await episode.finish(0.0)
        assert reply.usage is not None
        tokens.append(reply.usage.completion_tokens)
    return tokens


async def _throughput(url: str, concurrency: int, rounds: int, max_tokens: int) -> list[int]:
    # One OpenAI client whose connection pool every episode shares (``with_options`` swaps the key):
    # building an SDK client per episode costs tens of ms of CPU in this process, which the server shares.
    base = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    async with base, AsyncSwarmClient(url, client_id=f"bench-serve-c{concurrency}") as swarm:
        per_worker = await asyncio.gather(
            *(_worker(swarm, base, w, concurrency, rounds, max_tokens) for w in range(concurrency))
        )
    return [t for tokens in per_worker for t in tokens]


def measure_throughput(
    engine: HFEngine, url: str, concurrency: int, rounds: int, max_tokens: int
) -> ThroughputRow:
    asyncio.run(_throughput(url, concurrency, 1, max_tokens))  # warm-up: past the cold start
    batches = engine.batches
    t0 = time.perf_counter()
    tokens = asyncio.run(_throughput(url, concurrency, rounds, max_tokens))
    wall = time.perf_counter() - t0
    return ThroughputRow(
        concurrency=concurrency,
        calls=len(tokens),
        tokens=sum(tokens),
        full_length=sum(t == max_tokens for t in tokens),
        wall_s=wall,
        batches=engine.batches - batches,
    )


# -- report --------------------------------------------------------------------------------------------
def _verdict(ok: bool) -> str:
    return "[green]PASS[/green]" if ok else "[red]FAIL[/red]"


def overhead_table(rows: list[OverheadRow]) -> Table:
    table = Table(
        title=f"Per-call overhead of HTTP + tracking vs the engine (target ≤ {OVERHEAD_TARGET:.0%})"
    )
    columns = (
        "max_tokens",
        "tokens",
        "direct (s)",
        "HTTP (s)",
        "overhead (ms)",
        "overhead",
        "wall ratio",
        "begin+finish (ms)",
        "verdict",
    )
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(
            str(row.max_tokens),
            str(row.completion_tokens),
            f"{statistics.median(row.direct_s):.3f}",
            f"{statistics.median(row.http_s):.3f}",
            f"{row.overhead_s * 1e3:.1f}",
            f"{row.overhead:+.2%}",
            f"{row.wall_ratio:+.1%}",
            f"{statistics.median(row.begin_finish_s) * 1e3:.1f}",
            _verdict(row.overhead <= OVERHEAD_TARGET),
        )
    return table


def throughput_table(rows: list[ThroughputRow]) -> Table:
    base = rows[0].tokens_per_s
    top = max(rows, key=lambda r: r.concurrency)
    table = Table(
        title=f"Generated tokens/s over HTTP (target: {top.concurrency} concurrent ≥ {SPEEDUP_TARGET:g}× "
        f"concurrency {rows[0].concurrency})"
    )
    for col in (
        "concurrency",
        "calls",
        "tokens",
        "full length",
        "wall (s)",
        "tokens/s",
        "× c=1",
        "rows/batch",
        "verdict",
    ):
        table.add_column(col, justify="right")
    for row in rows:
        ratio = row.tokens_per_s / base
        table.add_row(
            str(row.concurrency),
            str(row.calls),
            str(row.tokens),
            f"{row.full_length}/{row.calls}",
            f"{row.wall_s:.1f}",
            f"{row.tokens_per_s:.1f}",
            f"{ratio:.2f}×",
            f"{row.rows_per_batch:.1f}",
            _verdict(ratio >= SPEEDUP_TARGET) if row is top and len(rows) > 1 else "",
        )
    return table


def main(
    overhead_tokens: Annotated[
        list[int] | None,
        typer.Option(help="max_tokens of the overhead rows (repeatable; default 32 and 128)"),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="interleaved repeats per overhead row")] = 7,
    concurrency: Annotated[
        list[int] | None,
        typer.Option(help="concurrent clients per throughput row (repeatable; default 1, 4 and 16)"),
    ] = None,
    rounds: Annotated[int, typer.Option(min=1, help="episodes per client per throughput row")] = 3,
    throughput_tokens: Annotated[int, typer.Option(min=1, help="max_tokens of throughput calls")] = 64,
    threads: Annotated[
        int | None, typer.Option(min=1, help="torch intra-op threads (default: torch's)")
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="also write the numbers here")] = None,
) -> None:
    """Measure the swarm server's per-call overhead and its batched throughput on the embedded model."""
    overhead_tokens = overhead_tokens or [32, 128]
    concurrency = sorted(concurrency or [1, 4, 16])
    if min(overhead_tokens) < 1 or min(concurrency) < 1:
        raise typer.BadParameter("--overhead-tokens and --concurrency values must be at least 1")
    if threads is not None:
        torch.set_num_threads(threads)
    source = resolve_model(None)
    model, tokenizer = load_model(source)
    engine = HFEngine(model, tokenizer, source.name)
    console.print(
        f"model {source.name} fp32 on CPU, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"batch window {engine.batch_window_s * 1e3:g} ms, max batch {engine.max_batch_size} rows"
    )
    overhead_rows: list[OverheadRow] = []
    throughput_rows: list[ThroughputRow] = []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="a3r-bench-serve-") as tmp,
            serve(engine, Path(tmp) / "run") as url,
        ):
            for max_tokens in overhead_tokens:
                row = measure_overhead(engine, url, max_tokens, repeats)
                overhead_rows.append(row)
                console.print(
                    f"overhead max_tokens={max_tokens}: {row.overhead_s * 1e3:.1f} ms = {row.overhead:+.2%} "
                    f"(wall ratio {row.wall_ratio:+.1%})"
                )
            for c in concurrency:
                trow = measure_throughput(engine, url, c, rounds, throughput_tokens)
                throughput_rows.append(trow)
                console.print(f"concurrency {c}: {trow.tokens_per_s:.1f} tokens/s")
    finally:
        engine.close()
    console.print(overhead_table(overhead_rows))
    console.print(throughput_table(throughput_rows))
    if json_path is not None:
        payload: dict[str, Any] = {
            "threads": torch.get_num_threads(),
            "overhead": [
                {**asdict(r), "overhead_s": r.overhead_s, "overhead": r.overhead, "wall_ratio": r.wall_ratio}
                for r in overhead_rows
            ],
            "throughput": [{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in throughput_rows],
        }
        json_path.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    typer.run(main)
