"""A research stage as LoRA tenants of one server against one server per run (issue 36).

    python bench/tenants.py                                   # B ∈ {1,2,4,8} × 2 seeds × 4 steps, CPU
    python bench/tenants.py --values 1,2 --seeds 1 --steps 2  # a quick check
    python bench/tenants.py --engine vllm --device cuda       # the H200 (bf16 weights both ways)
    python bench/tenants.py --modes overlap,tenants,servers   # also tenants with --tenant-overlap (hf)

The coarse stage of the min-stable-batch study on arithmetic: one run per (B, seed), GRPO with B tasks ×
G episodes per step, LoRA, ``--steps`` steps. Two ways, same seeds (request seeds and the LoRA init seed):

- ``servers``: one ``swarm serve`` per run, one run after another (what a study does without tenants);
- ``tenants``: one ``swarm serve --tenants N``, every run a tenant (``POST /api/v1/tenants``), all driven
  at once.

Both ways serve the same weights dtype (``--dtype``): float32 on hf (``swarm serve``'s default), bfloat16
on vLLM, whose LoRA kernels take bf16 or fp16 weights only, so the comparison stays like for like.

Each wall time includes starting its server(s). Prints both, their ratio (the aim: ≥ 5× on the H200,
≥ 1.5× on 2 CPU cores) and each configuration's mean reward at the last step per seed, which should agree
between the two ways within the seeds' spread (the exact equality of a tenant's update with a one-policy
update on a fixed batch is a test: tests/server/test_tenants.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from openai import AsyncOpenAI
from rich.console import Console
from rich.table import Table

from swarm.client import AsyncSwarmClient

ADMIN = secrets.token_urlsafe(16)


@dataclass(frozen=True)
class Run:
    """One configuration and seed of the stage."""

    batch_size: int
    seed: int

    @property
    def id(self) -> str:
        return f"b{self.batch_size}-s{self.seed}"


def problem(run: Run, step: int, task: int) -> tuple[str, int]:
    """The arithmetic question of a task (the same for both ways) and its answer."""
    rng = random.Random(f"{run.seed}:{step}:{task}")
    a, b = rng.randint(2, 49), rng.randint(2, 49)
    return f"What is {a} + {b}? Answer with the number only.", a + b


def reward(text: str, answer: int) -> float:
    """1 when the reply says the answer (any of its numbers), 0.2 for a reply of only a number, else 0."""
    if answer in [int(n) for n in re.findall(r"-?\d+", text)]:
        return 1.0
    return 0.2 if text.strip().isdigit() else 0.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(run_dir: Path, flags: Sequence[str]) -> tuple[subprocess.Popen[bytes], str]:
    """``swarm serve`` as a child process; returns once it answers."""
    port = _port()
    cmd = [sys.executable, "-m", "swarm.cli", "serve", "--port", str(port), "--run-dir", str(run_dir), *flags]
    env = {**os.environ, "SWARM_ADMIN_TOKEN": ADMIN}
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"swarm serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/api/v1/status", timeout=1).status_code in (200, 401):
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("swarm serve did not answer in 600 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def episode(
    client: AsyncSwarmClient, run: Run, tenant: str | None, step: int, task: int, k: int
) -> float:
    question, answer = problem(run, step, task)
    async with client.episode(f"{run.id}-{step}-{task}", tenant=tenant) as ep:
        async with AsyncOpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=5) as oa:
            r = await oa.chat.completions.create(
                model=ep.model,
                messages=[{"role": "user", "content": question}],
                max_tokens=16,
                seed=(run.seed * 1_000_003 + step * 10_007 + task * 101 + k) % 2**31,
            )
        value = reward(r.choices[0].message.content or "", answer)
        await ep.finish(value)
        return value


async def drive(url: str, run: Run, tenant: str | None, steps: int, group: int) -> list[float]:
    """Roll out ``steps`` batches of one run and wait for each update; returns the mean reward per step."""
    means = []
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with (
        AsyncSwarmClient(url, admin_token=ADMIN, client_token=ADMIN) as client,
        httpx.AsyncClient(base_url=url, headers=headers) as http,
    ):
        for step in range(steps):
            coros = [
                episode(client, run, tenant, step, t, k) for t in range(run.batch_size) for k in range(group)
            ]
            means.append(statistics.fmean(await asyncio.gather(*coros)))
            while True:
                if tenant is None:
                    done = (await client.status()).step
                else:
                    done = (await http.get(f"/api/v1/tenants/{tenant}")).json()["step"]
                if done >= step + 1:
                    break
                await asyncio.sleep(0.2)
    return means


def common_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--lora-rank", str(args.lora_rank), "--lr", str(args.lr), "--group-size", str(args.group)]
    flags += ["--batch-policy", "tasks", "--engine", args.engine, "--device", args.device]
    flags += ["--dtype", args.dtype]  # both ways alike (`DEFAULT_DTYPE`)
    flags += ["--checkpoint-every", "1000", *args.serve_flag]
    return flags + (["--model", args.model] if args.model else [])


def by_servers(
    runs: Sequence[Run], args: argparse.Namespace, root: Path
) -> tuple[float, dict[str, list[float]]]:
    started = time.perf_counter()
    out = {}
    for run in runs:
        flags = [*common_flags(args), "--batch-size", str(run.batch_size)]
        began = time.perf_counter()
        proc, url = serve(root / f"server-{run.id}", flags)
        up = time.perf_counter() - began
        try:
            out[run.id] = asyncio.run(drive(url, run, None, args.steps, args.group))
        finally:
            stop(proc)
        took = time.perf_counter() - began
        print(
            f"servers {run.id}: {took:.1f} s (server up in {up:.1f} s), {time.perf_counter() - started:.1f} s so far"
        )
    return time.perf_counter() - started, out


def by_tenants(
    runs: Sequence[Run], args: argparse.Namespace, root: Path, *, overlap: bool = False
) -> tuple[float, dict[str, list[float]]]:
    """Every run a tenant of one server; ``overlap``: ``--tenant-overlap`` (hf samples during steps)."""
    started = time.perf_counter()
    flags = [*common_flags(args), "--tenants", str(len(runs)), *(["--tenant-overlap"] if overlap else [])]
    proc, url = serve(root / ("overlap" if overlap else "tenants"), flags)
    print(f"tenants: server up in {time.perf_counter() - started:.1f} s")
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=600) as http:
            for run in runs:
                body = {"id": run.id, "batch_size": run.batch_size, "seed": run.seed}
                http.post("/api/v1/tenants", json=body).raise_for_status()

        async def every() -> list[list[float]]:
            return await asyncio.gather(*(drive(url, run, run.id, args.steps, args.group) for run in runs))

        out = dict(zip([r.id for r in runs], asyncio.run(every()), strict=True))
    finally:
        stop(proc)
    return time.perf_counter() - started, out


DEFAULT_DTYPE = {"hf": "float32", "vllm": "bfloat16"}
"""``--dtype`` by engine when not given: vLLM's LoRA (tenant) kernels need bf16 or fp16 weights."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The bench's options; ``dtype`` resolved by engine (`DEFAULT_DTYPE`) when not given."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--values", default="1,2,4,8", help="batch sizes B")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--engine", default="hf")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16", "auto"],
        default=None,
        help="weights of every server, both ways (default: float32 on hf, bfloat16 on vllm)",
    )
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--modes",
        default="tenants,servers",
        help="ways to run the stage, in order: tenants, overlap (tenants with --tenant-overlap), servers",
    )
    parser.add_argument(
        "--serve-flag",
        action="append",
        default=[],
        help="one more `swarm serve` argument for every server, e.g. --serve-flag=--gpu-memory-utilization=0.2",
    )
    args = parser.parse_args(argv)
    if args.dtype is None:
        args.dtype = DEFAULT_DTYPE.get(args.engine, "float32")
    return args


def main() -> None:
    args = parse_args()
    runs = [Run(int(b), s) for b in args.values.split(",") for s in range(args.seeds)]
    root = Path(tempfile.mkdtemp(prefix="tenants-bench-"))
    results: dict[str, tuple[float, dict[str, list[float]]]] = {}
    for mode in args.modes.split(","):
        if mode == "servers":
            results[mode] = by_servers(runs, args, root)
        else:
            results[mode] = by_tenants(runs, args, root, overlap=mode == "overlap")
        print(f"{mode}: {results[mode][0]:.1f} s wall", flush=True)
    console = Console()
    table = Table(
        title=f"{len(runs)} runs × {args.steps} steps, G {args.group}, {args.engine} on {args.device}, {args.dtype}"
    )
    table.add_column("run")
    for mode in results:
        table.add_column(f"{mode}: reward per step")
    for run in runs:
        table.add_row(run.id, *(" ".join(f"{m:.2f}" for m in results[mode][1][run.id]) for mode in results))
    console.print(table)
    for mode, (wall, _) in results.items():
        console.print(f"{mode}: {wall:.1f} s wall")
    for mode in ("tenants", "overlap"):
        if {mode, "servers"} <= set(results):
            console.print(f"servers / {mode}: {results['servers'][0] / results[mode][0]:.2f}×")


if __name__ == "__main__":
    main()
