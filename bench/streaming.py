"""Bench: time to first token with ``stream=true``, against waiting for the whole answer.

One process loads the embedded model (SmolLM2-135M-Instruct, fp32, CPU) into one
:class:`~swarm.engine.hf.HFEngine` and serves it with the real app on loopback (`serve.serve`). For each
``--tokens`` value ``M`` the same chat prompt is sampled greedily (temperature 0, ``max_tokens=M``, so
both sides produce the same tokens, checked) two ways through the OpenAI SDK, interleaved (the order
alternates every repeat):

- *plain*: ``chat.completions.create``; the first token is usable when the whole answer arrives;
- *stream*: ``chat.completions.create(stream=True)``; first token = the first chunk with text.

Printed: median time to first text and to the full answer on each side, and the ratios. The stream
holds back nothing here (no stop strings), so its first text is the first decoded token. Targets: the
streamed first text arrives in under a quarter of the plain answer's time at ``M = 128``, and streaming
costs at most 5 % of the full-answer time (per-token events and decoding).

Usage::

    .venv/bin/python bench/streaming.py                  # about a minute on 2 cores
    .venv/bin/python bench/streaming.py --tokens 32 --tokens 256 --repeats 9
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import torch
import typer
from openai import OpenAI
from rich.table import Table
from serve import OVERHEAD_MESSAGES, console, serve

from swarm.client import SwarmClient
from swarm.engine import HFEngine, load_model, resolve_model

FIRST_TEXT_TARGET = 0.25
"""Largest allowed ratio of the streamed first text time to the plain answer time (at 128 tokens)."""
COST_TARGET = 0.05
"""Largest allowed extra full-answer time of streaming, relative to plain."""


@dataclass
class Row:
    max_tokens: int
    completion_tokens: int = 0
    plain_s: list[float] = field(default_factory=list)
    stream_first_s: list[float] = field(default_factory=list)
    stream_full_s: list[float] = field(default_factory=list)

    @property
    def first_ratio(self) -> float:
        return statistics.median(self.stream_first_s) / statistics.median(self.plain_s)

    @property
    def cost(self) -> float:
        """Median paired ``stream_full_i / plain_i - 1``."""
        return statistics.median(s / p - 1 for s, p in zip(self.stream_full_s, self.plain_s, strict=True))


def _plain(swarm: SwarmClient, max_tokens: int) -> tuple[float, str, int]:
    with swarm.episode("plain", kind="eval") as ep:
        oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
        t0 = time.perf_counter()
        reply = oa.chat.completions.create(
            model=ep.model,
            messages=OVERHEAD_MESSAGES,  # type: ignore[arg-type]
            temperature=0.0,
            max_tokens=max_tokens,
        )
        elapsed = time.perf_counter() - t0
        ep.finish(0.0)
    tokens = reply.usage.completion_tokens if reply.usage else 0
    return elapsed, reply.choices[0].message.content or "", tokens


def _streamed(swarm: SwarmClient, max_tokens: int) -> tuple[float, float, str]:
    with swarm.episode("stream", kind="eval") as ep:
        oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)
        t0 = time.perf_counter()
        first = None
        pieces = []
        for chunk in oa.chat.completions.create(
            model=ep.model,
            messages=OVERHEAD_MESSAGES,  # type: ignore[arg-type]
            temperature=0.0,
            max_tokens=max_tokens,
            stream=True,
        ):
            for choice in chunk.choices:
                if choice.delta.content:
                    first = time.perf_counter() - t0 if first is None else first
                    pieces.append(choice.delta.content)
        elapsed = time.perf_counter() - t0
        ep.finish(0.0)
    if first is None:
        raise RuntimeError("the stream carried no text")
    return first, elapsed, "".join(pieces)


def measure(url: str, max_tokens: int, repeats: int) -> Row:
    row = Row(max_tokens)
    with SwarmClient(url, client_id="bench-streaming") as swarm:
        _, reference, row.completion_tokens = _plain(swarm, max_tokens)  # warm-up
        for r in range(repeats):
            for side in ("plain", "stream") if r % 2 == 0 else ("stream", "plain"):
                if side == "plain":
                    elapsed, text, _ = _plain(swarm, max_tokens)
                    row.plain_s.append(elapsed)
                else:
                    first, elapsed, text = _streamed(swarm, max_tokens)
                    row.stream_first_s.append(first)
                    row.stream_full_s.append(elapsed)
                if text != reference:
                    raise RuntimeError(f"the {side} greedy answer differs from the first one")
    return row


def table(rows: list[Row]) -> Table:
    t = Table(title="stream=true vs plain: time to first text and to the full answer (medians)")
    for name in (
        "max_tokens",
        "tokens",
        "plain answer",
        "stream: first text",
        "stream: full",
        "first / plain",
        "cost",
    ):
        t.add_column(name, justify="right")
    for row in rows:
        t.add_row(
            str(row.max_tokens),
            str(row.completion_tokens),
            f"{statistics.median(row.plain_s):.3f} s",
            f"{statistics.median(row.stream_first_s):.3f} s",
            f"{statistics.median(row.stream_full_s):.3f} s",
            f"{row.first_ratio:.3f}",
            f"{row.cost:+.1%}",
        )
    return t


def main(
    tokens: Annotated[
        list[int] | None, typer.Option(help="max_tokens per row (repeatable; default 32, 128)")
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="interleaved repeats per row")] = 7,
    threads: Annotated[int | None, typer.Option(min=1, help="torch intra-op threads")] = None,
) -> None:
    if threads is not None:
        torch.set_num_threads(threads)
    source = resolve_model(None)
    model, tokenizer = load_model(source)
    engine = HFEngine(model, tokenizer, source.name)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, serve(engine, Path(tmp)) as url:
        for max_tokens in tokens or [32, 128]:
            rows.append(measure(url, max_tokens, repeats))
            console.print(f"max_tokens {max_tokens}: done")
    engine.close()
    console.print(table(rows))
    at_128 = [r for r in rows if r.max_tokens == 128]
    for row in at_128:
        verdict = "PASS" if row.first_ratio <= FIRST_TEXT_TARGET else "FAIL"
        console.print(
            f"first text / plain answer at 128 tokens: {row.first_ratio:.3f} (≤ {FIRST_TEXT_TARGET}) {verdict}"
        )
    worst = max(r.cost for r in rows)
    verdict = "PASS" if worst <= COST_TARGET else "FAIL"
    console.print(f"largest streaming cost: {worst:+.1%} (≤ {COST_TARGET:.0%}) {verdict}")


if __name__ == "__main__":
    typer.run(main)
