"""Synchronous vs asynchronous training on an agentic workload with a long tail, side by side.

    python bench/async_training.py [--steps 6] [--concurrency 16] [--max-staleness 1]
    # on a GPU: verl's FSDP actor and vLLM (bench/README.md, "async_training.py"), one 600 s call
    python bench/async_training.py --trainer verl --engine vllm --device cuda --json $OUT/async_verl.json
    # or one mode per call, the second compared with the first's file
    python bench/async_training.py --mode sync --trainer verl --engine vllm --device cuda --json sync.json
    python bench/async_training.py --mode async --against sync.json --trainer verl --engine vllm --device cuda

Each mode starts its own ``swarm serve`` (default: the embedded model, ``--model`` for another; a3r's
settings: LoRA r16 (``--lora-rank``), dtype and mixed precision ``auto``, ``--tis-cap 2``, B=4 tasks ×
G=4 per step; ``--trainer``, ``--engine``, ``--device`` and the verl options are passed through) and runs
the same tasks through the real runner (``swarm.client.Runner``, ``--concurrency`` episodes at once). An
episode is a short conversation of 1–3 calls with a simulated tool wait before each call: mostly 0–1 s,
but one task in five waits 6 s (a slow tool, a long search), the long tail that makes a synchronous
server drain.

Synchronous (``max_staleness`` unset): when a batch is ready the server refuses new episodes and waits
for the open ones before it trains. Asynchronous (``--max-staleness K``): it trains at once and keeps
admitting episodes; calls that arrive during the update wait for it; open episodes that fall more than
K policy versions behind are aborted and the runner re-runs them.

Prints one row per mode: wall time for the steps (from the server being ready to the last step),
throughput (trained episodes per minute of that wall time), seconds per update, time spent draining,
open episodes aborted (drain timeout or staleness), mean/max staleness of trained episodes (policy
version updated − version of the episode's oldest call), and the reward of the first and last steps,
then the throughput ratio async / sync (anchors: AReaL 2.77×, verl 2.35–2.67×). The reward is the
format task of ``bench/learning.py`` (right answer, said briefly). Each mode stops at ``--budget``
seconds (start-up included) and reports the steps it has (``complete`` false).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import QUESTIONS, reward
from multi_gpu import MULTICAST_OFF, kill_leftovers, stop

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


@dataclass(frozen=True)
class Serving:
    """How each mode's ``swarm serve`` runs: the passthrough flags (``swarm serve --help``)."""

    model: str | None = None
    trainer: str = "torch"
    engine: str = "hf"
    device: str = "cpu"
    lora_rank: int = 16
    dtype: str = "auto"
    mixed_precision: str = "auto"
    lr: float = 2e-4
    trainer_gpus: int = 1
    weight_sync: str = "gather"
    gpu_memory_utilization: float = 0.3
    threads: int | None = None

    def argv(self, run_dir: Path, port: int, max_staleness: int | None) -> list[str]:
        """``swarm serve``'s command line for one mode."""
        args = [
            sys.executable, "-m", "swarm.cli", "serve", "--port", str(port), "--run-dir", str(run_dir),
            "--trainer", self.trainer, "--engine", self.engine, "--device", self.device,
            "--lora-rank", str(self.lora_rank), "--lr", str(self.lr), "--dtype", self.dtype,
            "--mixed-precision", self.mixed_precision,
            "--tis-cap", "2", "--batch-policy", "tasks", "--batch-size", str(B), "--group-size", str(G),
            "--checkpoint-every", "1000",
        ]  # fmt: skip
        if self.model is not None:
            args += ["--model", self.model]
        if self.trainer == "verl":
            args += ["--trainer-gpus", str(self.trainer_gpus)]
            if self.weight_sync != "gather":
                args += ["--verl-weight-sync", self.weight_sync]
        if self.engine == "vllm":
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        if max_staleness is not None:
            args += ["--max-staleness", str(max_staleness)]
        return args

    def describe(self) -> str:
        lora = f"LoRA r{self.lora_rank}" if self.lora_rank else "all weights"
        model = self.model or "embedded SmolLM2-135M"
        return f"--trainer {self.trainer} --engine {self.engine} --device {self.device}, {model}, {lora}"


def serve(
    serving: Serving, run_dir: Path, port: int, max_staleness: int | None, deadline: float
) -> subprocess.Popen[bytes]:
    """Start ``swarm serve`` in a session of its own (Ray and vLLM processes under it) and wait until
    it answers; ``deadline`` is ``time.monotonic()``'s.

    Raises:
        SystemExit: it exited, or did not answer before ``deadline``.
    """
    log = (run_dir / "serve.log").open("wb")
    process = subprocess.Popen(
        serving.argv(run_dir, port, max_staleness),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **MULTICAST_OFF},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"swarm serve exited; see {run_dir / 'serve.log'}")
        try:
            if httpx.get(f"{url}/api/v1/status", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    shut_down(process)
    raise SystemExit(f"swarm serve did not answer within --budget; see {run_dir / 'serve.log'}")


def shut_down(process: subprocess.Popen[bytes]) -> None:
    """Stop the server's session (SIGKILL after 20 s: the budget leaves no more), and whatever of it
    outlived the server (Ray's workers hold GPU memory the next mode's server needs)."""
    stop(process, 20)
    kill_leftovers(process.pid)


def run_mode(
    serving: Serving, steps: int, concurrency: int, max_staleness: int | None, budget_s: float
) -> dict[str, Any]:
    """One mode: a server, the runner over ``steps · B`` tasks, until ``steps`` steps or ``budget_s``."""
    begun = time.monotonic()
    deadline = begun + budget_s
    run_dir = Path(tempfile.mkdtemp(prefix="async-bench-"))
    port = free_port()
    process = serve(serving, run_dir, port, max_staleness, deadline)
    url = f"http://127.0.0.1:{port}"
    ready_s = time.monotonic() - begun
    infra = 0
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
                return await asyncio.wait_for(runner.run(), timeout=max(1.0, deadline - time.monotonic()))
            finally:
                await client.aclose()

        started, started_at = time.monotonic(), time.time()
        with contextlib.suppress(TimeoutError):  # the budget: report the steps there are
            infra = asyncio.run(go()).infra_failures
        while httpx.get(f"{url}/api/v1/status").json()["step"] < steps and time.monotonic() < deadline:
            time.sleep(0.2)
        wall = time.monotonic() - started
        metrics = httpx.get(f"{url}/api/v1/metrics").json()[:steps]
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line]
        ends = [e["time"] for e in events if e["kind"] == "train.step" and e["data"]["step"] <= steps]
        if metrics and len(ends) == len(metrics):  # the wall time ends with the last step counted
            wall = max(ends) - started_at
    finally:
        shut_down(process)
    rewards = [m["reward_mean"] for m in metrics if m["reward_mean"] is not None]
    episodes = sum(m["episodes"] for m in metrics)
    return {
        "mode": "synchronous" if max_staleness is None else f"async K={max_staleness}",
        "max_staleness": max_staleness,
        "serving": asdict(serving),
        "complete": len(metrics) >= steps,
        "steps": len(metrics),
        "server_ready_s": ready_s,
        "wall_s": wall,
        "episodes": episodes,
        "tokens": sum(m["tokens"] for m in metrics),
        "episodes_per_min": 60 * episodes / wall if wall > 0 else float("nan"),
        "step_s": statistics.median(m["time_s"]["total_s"] for m in metrics) if metrics else float("nan"),
        "drain_s": sum(m["drain_s"] for m in metrics),
        "aborted": sum(m["drain_aborted"] + m.get("stale_aborted", 0) for m in metrics),
        "staleness_mean": statistics.fmean(m["staleness_mean"] for m in metrics) if metrics else 0.0,
        "staleness_max": max((m["staleness_max"] for m in metrics), default=0),
        "infra": infra,
        "reward_first": rewards[0] if rewards else float("nan"),
        "reward_last": rewards[-1] if rewards else float("nan"),
        "run_dir": str(run_dir),
    }


COLUMNS = {
    "mode": ("mode", "{}"),
    "steps": ("steps", "{}"),
    "wall_s": ("wall s", "{:.0f}"),
    "episodes_per_min": ("episodes/min", "{:.1f}"),
    "step_s": ("update s (median)", "{:.1f}"),
    "drain_s": ("drain s (total)", "{:.0f}"),
    "aborted": ("aborted open (drain/stale)", "{}"),
    "infra": ("runner re-runs", "{}"),
    "staleness_mean": ("staleness mean", "{:.2f}"),
    "staleness_max": ("staleness max", "{}"),
    "reward_first": ("reward step 1", "{:.3f}"),
    "reward_last": ("reward last step", "{:.3f}"),
}


def report(rows: list[dict[str, Any]], title: str, console: Console) -> None:
    """The table, and with a synchronous and an asynchronous row the throughput ratio."""
    table = Table(title=title)
    for header, _ in COLUMNS.values():
        table.add_column(header, justify="right")
    for row in rows:
        mark = "" if row["complete"] else " (incomplete)"
        table.add_row(
            *(fmt.format(row[key]) + (mark if key == "mode" else "") for key, (_, fmt) in COLUMNS.items())
        )
    console.print(table)
    sync = [r for r in rows if r["max_staleness"] is None]
    asyn = [r for r in rows if r["max_staleness"] is not None]
    if sync and asyn:
        ratio = asyn[0]["episodes_per_min"] / sync[0]["episodes_per_min"]
        console.print(
            f"throughput async / sync: {ratio:.2f}× ({asyn[0]['episodes_per_min']:.1f} vs "
            f"{sync[0]['episodes_per_min']:.1f} trained episodes/min; anchors: AReaL 2.77×, verl 2.35–2.67×)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--mode", choices=("both", "sync", "async"), default="both")
    parser.add_argument("--against", type=Path, help="an earlier --json (the other mode) to compare with")
    parser.add_argument("--budget", type=float, default=280.0, help="seconds per mode, start-up included")
    parser.add_argument("--model", help="swarm serve --model (default: the embedded model)")
    parser.add_argument("--trainer", choices=("torch", "verl"), default="torch")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lora-rank", type=int, default=16, help="0: all weights")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--mixed-precision", default="auto")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--trainer-gpus", type=int, default=1, help="verl: GPUs of the FSDP actor")
    parser.add_argument("--weight-sync", choices=("gather", "direct"), default="gather", help="verl")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vllm")
    parser.add_argument("--threads", type=int, help="swarm serve --threads (CPU)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if args.trainer == "verl" and args.device == "cpu":
        parser.error("--trainer verl needs CUDA GPUs (--device cuda); the CPU smoke run is --trainer torch")
    if args.engine == "vllm" and args.device == "cpu":
        parser.error("--engine vllm needs --device cuda")
    serving = Serving(
        model=args.model, trainer=args.trainer, engine=args.engine, device=args.device,
        lora_rank=args.lora_rank, dtype=args.dtype, mixed_precision=args.mixed_precision, lr=args.lr,
        trainer_gpus=args.trainer_gpus, weight_sync=args.weight_sync,
        gpu_memory_utilization=args.gpu_memory_utilization, threads=args.threads,
    )  # fmt: skip
    earlier: list[dict[str, Any]] = json.loads(args.against.read_text()) if args.against else []
    modes = {"both": (None, args.max_staleness), "sync": (None,), "async": (args.max_staleness,)}[args.mode]
    console = Console(width=200)
    rows = []
    for k in modes:
        console.print(
            f"running {'synchronous' if k is None else f'asynchronous K={k}'} ({serving.describe()}) …"
        )
        rows.append(run_mode(serving, args.steps, args.concurrency, k, args.budget))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    report(
        earlier + rows,
        f"{args.steps} GRPO steps (B={B}×G={G}, {serving.describe()}), {args.concurrency} episodes at "
        f"once, 1–3 calls per episode with tool waits (20% take 6 s)",
        console,
    )


if __name__ == "__main__":
    main()
