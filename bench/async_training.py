"""Synchronous vs asynchronous training on an agentic workload with a long tail, side by side.

    python bench/async_training.py [--steps 6] [--concurrency 16] [--max-staleness 1]

Each mode starts its own ``swarm serve`` on the embedded model (a3r's settings: LoRA r16, dtype and
mixed precision ``auto``, ``--tis-cap 2``, B=4 tasks × G=4 per step) and runs the same tasks through
the real runner (``swarm.client.Runner``, ``--concurrency`` episodes at once). An episode is a short
conversation of 1–3 calls with a simulated tool wait before each call: mostly 0–1 s, but one task in
five waits 6 s (a slow tool, a long search), the long tail that makes a synchronous server drain.

Synchronous (``max_staleness`` unset): when a batch is ready the server refuses new episodes and waits
for the open ones before it trains. Asynchronous (``--max-staleness K``): it trains at once and keeps
admitting episodes; calls that arrive during the update wait for it; open episodes that fall more than
K policy versions behind are aborted and the runner re-runs them.

Prints one row per mode: wall time for the steps, seconds per update, time spent draining, open
episodes aborted (drain timeout or staleness), mean/max staleness of trained episodes (policy version
updated − version of the episode's oldest call), and the reward of the first and last steps, then
the speed-up. The reward is the format task of
``bench/learning.py`` (right answer, said briefly).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import QUESTIONS, reward

from swarm.client import AsyncSwarmClient, Runner, RunnerConfig, TaskSet

B, G = 4, 4


def tasks(steps: int, seed: int = 0) -> list[dict[str, Any]]:
    """``steps · B`` tasks (each run G times); the same list for both modes."""
    rng = random.Random(seed)
    out = []
    for i in range(steps * B):
        turns = rng.randint(1, 3)
        waits = [6.0 if rng.random() < 0.2 else rng.uniform(0.0, 1.0) for _ in range(turns)]
        out.append({"id": f"t{i}", "q": i % len(QUESTIONS), "waits": waits})
    return out


async def workflow(task: dict[str, Any], llm: Any) -> float:
    question, answer = QUESTIONS[task["q"]]
    client = llm.openai(max_retries=2, timeout=600)
    messages = [{"role": "user", "content": question + " Answer in at most three words."}]
    text = ""
    for wait in task["waits"]:
        await asyncio.sleep(wait)  # a tool call
        reply = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=24)
        text = reply.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Once more."}]
    return reward(text, answer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(run_dir: Path, port: int, max_staleness: int | None) -> subprocess.Popen[bytes]:
    args = [
        sys.executable, "-m", "swarm.cli", "serve", "--port", str(port), "--run-dir", str(run_dir),
        "--lora-rank", "16", "--lr", "2e-4", "--dtype", "auto", "--mixed-precision", "auto",
        "--tis-cap", "2", "--batch-policy", "tasks", "--batch-size", str(B), "--group-size", str(G),
        "--checkpoint-every", "1000",
    ]  # fmt: skip
    if max_staleness is not None:
        args += ["--max-staleness", str(max_staleness)]
    log = (run_dir / "serve.log").open("wb")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"swarm serve exited; see {run_dir / 'serve.log'}")
        try:
            if httpx.get(f"{url}/api/v1/status", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit("swarm serve did not start in 300 s")


def run_mode(steps: int, concurrency: int, max_staleness: int | None) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="async-bench-"))
    port = free_port()
    process = serve(run_dir, port, max_staleness)
    url = f"http://127.0.0.1:{port}"
    try:

        async def go() -> Any:
            client = AsyncSwarmClient(url, client_id="bench", retry=Runner.default_retry())
            try:
                runner = Runner(
                    workflow,
                    {"default": client},
                    TaskSet(tasks(steps)),
                    RunnerConfig(group_size=G, concurrency=concurrency, infra_retries=5),
                    console=Console(file=io.StringIO()),
                    show_progress=False,
                )
                return await runner.run()
            finally:
                await client.aclose()

        started = time.monotonic()
        summary = asyncio.run(go())
        deadline = time.monotonic() + 600
        while httpx.get(f"{url}/api/v1/status").json()["step"] < steps and time.monotonic() < deadline:
            time.sleep(0.2)
        wall = time.monotonic() - started
        metrics = httpx.get(f"{url}/api/v1/metrics").json()
    finally:
        process.terminate()
        process.wait(timeout=60)
    rewards = [m["reward_mean"] for m in metrics if m["reward_mean"] is not None]
    return {
        "mode": "synchronous" if max_staleness is None else f"async K={max_staleness}",
        "steps": len(metrics),
        "wall_s": wall,
        "step_s": statistics.median(m["time_s"]["total_s"] for m in metrics) if metrics else float("nan"),
        "drain_s": sum(m["drain_s"] for m in metrics),
        "aborted": sum(m["drain_aborted"] + m.get("stale_aborted", 0) for m in metrics),
        "staleness_mean": statistics.fmean(m["staleness_mean"] for m in metrics) if metrics else 0.0,
        "staleness_max": max((m["staleness_max"] for m in metrics), default=0),
        "infra": summary.infra_failures,
        "reward_first": rewards[0] if rewards else float("nan"),
        "reward_last": rewards[-1] if rewards else float("nan"),
        "run_dir": str(run_dir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    console = Console(width=200)
    rows = []
    for k in (None, args.max_staleness):
        console.print(f"running {'synchronous' if k is None else f'asynchronous K={k}'} …")
        rows.append(run_mode(args.steps, args.concurrency, k))
    table = Table(
        title=f"{args.steps} GRPO steps (B={B}×G={G}, LoRA r16, embedded SmolLM2-135M), "
        f"{args.concurrency} episodes at once, 1–3 calls per episode with tool waits (20% take 6 s)"
    )
    columns = {
        "mode": "{}",
        "steps": "{}",
        "wall_s": "{:.0f}",
        "step_s": "{:.1f}",
        "drain_s": "{:.0f}",
        "aborted": "{}",
        "infra": "{}",
        "staleness_mean": "{:.2f}",
        "staleness_max": "{}",
        "reward_first": "{:.3f}",
        "reward_last": "{:.3f}",
    }
    headers = {
        "wall_s": "wall s",
        "step_s": "update s (median)",
        "drain_s": "drain s (total)",
        "aborted": "aborted open (drain/stale)",
        "infra": "runner re-runs",
        "staleness_mean": "staleness mean",
        "staleness_max": "staleness max",
        "reward_first": "reward step 1",
        "reward_last": "reward last step",
    }
    for key in columns:
        table.add_column(headers.get(key, key), justify="right")
    for row in rows:
        table.add_row(*(fmt.format(row[key]) for key, fmt in columns.items()))
    console.print(table)
    sync, asyn = rows
    console.print(f"asynchronous / synchronous wall time: {asyn['wall_s'] / sync['wall_s']:.2f}× "
                  f"(speed-up {sync['wall_s'] / asyn['wall_s']:.2f}×)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
