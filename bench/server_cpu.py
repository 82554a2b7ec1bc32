"""Benchmark: the swarm server's CPU per episode on the hot path (begin → chat completion → finish).

What it measures: a real ``swarm serve`` process (a tiny random 2-layer model of SmolLM2's shape, so the
engine is cheap; ``--max-tokens`` 2 by default) is driven by ``--procs`` client processes running
``--concurrency`` episodes at a time in all, each episode ``AsyncSwarmClient.begin`` → one
``AsyncOpenAI`` chat completion with the episode's key (temperature 1, a distinct seed) →
``finish(reward)``, back to back, as RL rollouts run. The server's CPU time over a round of
``--episodes`` episodes is read from ``/proc``:

- **loop thread**: the server's main thread, which runs the event loop: HTTP parsing, FastAPI routing
  and dependencies, validation, chat-template rendering, the pool commit, the response and the access
  log. On a GPU host this is the thread vLLM's front end shares (``bench/gpu_engine.py``), so it is the
  number this benchmark is for (``schedstat``, nanoseconds);
- **process**: all threads (adds the engine's worker thread, i.e. the tiny model's forward passes).

``--code DIR`` (repeatable) serves the ``swarm/`` package of another checkout (``git worktree add
/tmp/old <commit>``), so an old and a new commit are measured in the same session on the same load:
all servers are started first, then rounds run interleaved (ABBA order) and the table shows medians
over ``--rounds`` rounds per server, and each server's ratio to the first. ``--server-arg`` passes
extra ``swarm serve`` flags to every server (e.g. ``--server-arg=--log-level=warning``).

Run: ``.venv/bin/python bench/server_cpu.py`` (≈ 2 min on 2 shared cores);
``.venv/bin/python bench/server_cpu.py --code /tmp/old --code . --rounds 5``;
``--profile DIR`` records every server with py-spy (``DIR/<label>.txt``, collapsed stacks, all rounds)
and prints each one's top frames by inclusive share of the loop thread's busy samples.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from control_plane import _cpu_seconds, _wait_ready  # bench/ is on the path when run as a script
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [
    {"role": "system", "content": "You are a storyteller."},
    {"role": "user", "content": "Write a long story about a dragon who learns to bake bread."},
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_tiny_model(directory: Path) -> None:
    """Save a random 2-layer Llama with SmolLM2's vocabulary and chat template (as the tests use)."""
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from swarm.engine import resolve_model
    from tests.conftest import build_tiny_model as build

    source = resolve_model(None)
    build(source).save_pretrained(directory)
    AutoTokenizer.from_pretrained(str(source.directory)).save_pretrained(directory)


# -- the client processes -------------------------------------------------------------------------------
async def _client_round(pool: list[tuple[Any, Any]], episodes: int, max_tokens: int, seeds: list[int]) -> int:
    """``episodes`` episodes over the agents of ``pool``, back to back; returns the completion tokens."""
    remaining = [episodes]
    tokens = [0]

    async def agent(swarm: Any, sdk: Any) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            seeds[0] += 1
            seed = seeds[0]
            ep = await swarm.begin(f"task-{seed % 64}", kind="eval")
            chat = sdk.with_options(base_url=ep.base_url, api_key=ep.api_key)
            answer = await chat.chat.completions.create(
                model=ep.model, messages=PROMPT, temperature=1.0, max_tokens=max_tokens, seed=seed
            )
            await ep.finish(0.5)
            tokens[0] += answer.usage.completion_tokens if answer.usage else 0

    await asyncio.gather(*(agent(swarm, sdk) for swarm, sdk in pool))
    return tokens[0]


def _client_proc(commands: Any, results: Any, index: int) -> None:
    """One client process: runs rounds on command, keeping its clients (and connections) per server."""
    from openai import AsyncOpenAI

    from swarm.client import AsyncSwarmClient, RetryPolicy

    async def main() -> None:
        pools: dict[str, list[tuple[Any, Any]]] = {}
        seeds = [index * 1_000_000]
        while True:
            command = await asyncio.to_thread(commands.get)
            if command is None:
                break
            url, workers, episodes, max_tokens, start_at = command
            if url not in pools:  # one agent = one swarm client + one SDK client, as separate runners
                pools[url] = [
                    (
                        AsyncSwarmClient(url, client_id=f"cpu-{index}-{w}", retry=RetryPolicy(attempts=3)),
                        AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=3, timeout=600),
                    )
                    for w in range(workers)
                ]
            await asyncio.sleep(max(0.0, start_at - time.time()))
            cpu0 = time.process_time()
            tokens = await _client_round(pools[url], episodes, max_tokens, seeds)
            results.put((index, time.time(), time.process_time() - cpu0, tokens))
        for pool in pools.values():
            for swarm, sdk in pool:
                await swarm.aclose()
                await sdk.close()

    asyncio.run(main())


# -- the server processes -------------------------------------------------------------------------------
def _thread_cpu_ns(pid: int, tid: int) -> int:
    """On-CPU nanoseconds of one thread (``/proc/<pid>/task/<tid>/schedstat``, first field)."""
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])


def _loaded(pid: int, *names: str) -> dict[str, bool]:
    """Whether the process has each extension module mapped (uvloop, httptools: what uvicorn uses)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {name: f"/{name}/" in maps for name in names}


@dataclass
class Server:
    """One ``swarm serve`` process serving the ``swarm/`` of ``code``."""

    label: str
    code: Path
    proc: subprocess.Popen[bytes]
    url: str
    run_dir: Path
    log: Path
    rounds: list[dict[str, float]] = field(default_factory=list)


def start_server(label: str, code: Path, model: Path, tmp: Path, extra: list[str]) -> Server:
    """Start ``swarm serve`` with the ``swarm/`` package of ``code`` first on the path (a symlink in a
    folder of its own, so nothing else of that checkout is imported)."""
    if not (code / "swarm" / "__init__.py").is_file():
        raise SystemExit(f"--code {code}: no swarm/ package there")
    shim = tmp / f"shim-{label}"
    shim.mkdir()
    (shim / "swarm").symlink_to((code / "swarm").resolve(), target_is_directory=True)
    port = _free_port()
    run_dir = tmp / f"run-{label}"
    cmd = [sys.executable, "-c", "from swarm.cli import main; main()", "serve", "--model", str(model)]
    cmd += ["--port", str(port), "--run-dir", str(run_dir), "--no-train", "--threads", "1", *extra]
    env = {**os.environ, "PYTHONPATH": str(shim)}
    log = tmp / f"server-{label}.log"  # the access log goes to stdout, as uvicorn writes it
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Server(label, code, proc, f"http://127.0.0.1:{port}", run_dir, log)


def wait_ready(server: Server) -> None:
    if server.proc.poll() is None:
        try:
            _wait_ready(server.url, server.proc, timeout_s=300.0)
            return
        except SystemExit:
            pass
    tail = server.log.read_text(errors="replace").splitlines()[-5:]
    raise SystemExit(f"server {server.label} did not start (exit code {server.proc.poll()}): {tail}")


def _finished(server: Server) -> int:
    return int(httpx.get(f"{server.url}/api/v1/status", timeout=30).json()["episodes"]["finished"])


def run_round(
    server: Server, commands: list[Any], results: Any, concurrency: int, episodes: int, max_tokens: int
) -> dict[str, float]:
    """One round of ``episodes`` episodes against ``server``; the server's CPU over the round."""
    procs = len(commands)
    workers = [concurrency // procs + (i < concurrency % procs) for i in range(procs)]
    shares = [episodes // procs + (i < episodes % procs) for i in range(procs)]
    before = _finished(server)
    start_at = time.time() + 0.5
    for queue, w, n in zip(commands, workers, shares, strict=True):
        queue.put((server.url, w, n, max_tokens, start_at))
    pid = server.proc.pid
    while time.time() < start_at - 0.05:
        time.sleep(0.01)
    loop0, proc0 = _thread_cpu_ns(pid, pid), _cpu_seconds(pid)
    done = [results.get(timeout=900) for _ in commands]
    loop1, proc1 = _thread_cpu_ns(pid, pid), _cpu_seconds(pid)
    wall = max(d[1] for d in done) - start_at
    stored = _finished(server) - before
    if stored != episodes:
        raise SystemExit(f"server {server.label}: {stored} episodes stored for {episodes} finished")
    return {
        "loop_ms": (loop1 - loop0) / 1e6 / episodes,
        "process_ms": (proc1 - proc0) * 1e3 / episodes,
        "client_ms": sum(d[2] for d in done) * 1e3 / episodes,
        "episodes_s": episodes / wall,
        "tokens": sum(d[3] for d in done) / episodes,
    }


# -- profiles ---------------------------------------------------------------------------------------------
_IDLE = (
    "select (selectors",
    "wait (threading",
    "_worker (concurrent",
    "poll",
    "epoll",
    "sleep",
    "get (queue",
)


def top_frames(collapsed: Path, count: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]], int]:
    """Inclusive and self shares of the busy samples of the server's main thread in a py-spy
    ``--format raw`` file (idle leaves, e.g. the event loop's ``select``, left out)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    busy = 0
    for line in collapsed.read_text().splitlines():
        stack, _, n_text = line.rpartition(" ")
        frames = stack.split(";")
        if "_bootstrap" in frames[0]:  # a worker thread (the engine's), not the event loop
            continue
        leaf = frames[-1]
        if any(k in leaf for k in _IDLE):
            continue
        n = int(n_text)
        busy += n
        for frame in set(frames[1:]):
            inclusive[frame] += n
        own[leaf] += n
    total = max(busy, 1)
    return (
        [(f, n / total) for f, n in inclusive.most_common(count)],
        [(f, n / total) for f, n in own.most_common(count)],
        busy,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--code", type=Path, action="append", help="checkout whose swarm/ to serve")
    parser.add_argument("--label", action="append", help="a name per --code (default: its folder)")
    parser.add_argument("--episodes", type=int, default=400, help="episodes per round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per server")
    parser.add_argument("--concurrency", type=int, default=32, help="episodes at a time, all processes")
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--max-tokens", type=int, default=2)
    parser.add_argument("--server-arg", action="append", default=[], help="extra `swarm serve` flag")
    parser.add_argument("--model", type=Path, help="model directory (default: a tiny one built here)")
    parser.add_argument("--profile", type=Path, help="py-spy collapsed stacks of each server, to this folder")
    parser.add_argument("--top", type=int, default=25, help="frames shown per profile")
    parser.add_argument("--py-spy", help="the py-spy executable (default: on PATH or beside python)")
    parser.add_argument("--lines", action="store_true", help="profile frames by line, not by function")
    parser.add_argument("--spy-arg", action="append", default=[], help="extra py-spy flag (e.g. --native)")
    args = parser.parse_args()
    codes = args.code or [ROOT]
    labels = args.label or [c.resolve().name for c in codes]
    if len(labels) != len(codes) or len(set(labels)) != len(labels):
        raise SystemExit("--label: one distinct name per --code")

    console = Console(width=130)
    tmp = Path(tempfile.mkdtemp(prefix="swarm-server-cpu-"))
    servers: list[Server] = []
    spies: list[subprocess.Popen[bytes]] = []
    ctx = mp.get_context("spawn")
    commands = [ctx.Queue() for _ in range(args.procs)]
    results: Any = ctx.Queue()
    clients = [ctx.Process(target=_client_proc, args=(q, results, i)) for i, q in enumerate(commands)]
    try:
        model = args.model
        if model is None:
            model = tmp / "tiny-model"
            build_tiny_model(model)
        servers = [
            start_server(lb, c, model, tmp, args.server_arg) for lb, c in zip(labels, codes, strict=True)
        ]
        for p in clients:
            p.start()
        for s in servers:
            wait_ready(s)
            # warm-up: connections opened, first-call costs (template compile, torch kernels) paid
            run_round(s, commands, results, args.concurrency, max(args.concurrency * 2, 64), args.max_tokens)
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            spy = args.py_spy or shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            for s in servers:
                out = args.profile / f"{s.label}.txt"
                cmd = [
                    spy,
                    "record",
                    "--format",
                    "raw",
                    "-o",
                    str(out),
                    "-p",
                    str(s.proc.pid),
                    "-r",
                    "200",
                    *([] if args.lines else ["--function"]),
                    *args.spy_arg,
                ]
                spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(2.0)
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]  # ABBA: drift in the load hits both alike
            for s in order:
                s.rounds.append(
                    run_round(s, commands, results, args.concurrency, args.episodes, args.max_tokens)
                )
        for spy_proc in spies:
            spy_proc.send_signal(2)
            spy_proc.wait(timeout=120)
        stacks = {s.label: _loaded(s.proc.pid, "uvloop", "httptools") for s in servers}
    finally:
        for q in commands:
            q.put(None)
        for p in clients:
            p.join(timeout=30)
        for s in servers:
            s.proc.terminate()
            s.proc.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)

    table = Table(title=f"swarm server CPU per episode (begin → chat, max_tokens {args.max_tokens} → finish)")
    columns = ("server", "loop thread ms/ep", "× first", "paired × first", "process ms/ep", "episodes/s")
    for name in (*columns, "client ms/ep"):
        table.add_column(name, justify="left" if name == "server" else "right")
    first_rounds = [r["loop_ms"] for r in servers[0].rounds]
    first = statistics.median(first_rounds)
    for s in servers:
        loop = [r["loop_ms"] for r in s.rounds]
        med = statistics.median(loop)
        # each round's ratio to the first server's round next to it in time (ABBA), then their median
        paired = [a / b for a, b in zip(loop, first_rounds, strict=True)]
        table.add_row(
            s.label,
            f"{med:.3f} ({min(loop):.3f}–{max(loop):.3f})",
            f"{med / first:.3f}",
            f"{statistics.median(paired):.3f} ({min(paired):.2f}–{max(paired):.2f})",
            f"{statistics.median(r['process_ms'] for r in s.rounds):.3f}",
            f"{statistics.median(r['episodes_s'] for r in s.rounds):.0f}",
            f"{statistics.median(r['client_ms'] for r in s.rounds):.2f}",
        )
    console.print(table)
    console.print(
        f"{args.rounds} rounds of {args.episodes} episodes per server (ABBA), {args.concurrency} at a time in "
        f"{args.procs} client processes; medians (min–max); load average {os.getloadavg()[0]:.1f} at the "
        f"end, {os.cpu_count()} cores; uvloop / httptools loaded: "
        + ", ".join(f"{k}: {v['uvloop']} / {v['httptools']}" for k, v in stacks.items()),
        highlight=False,
    )
    if args.profile is not None:
        for s in servers:
            inclusive, own, busy = top_frames(args.profile / f"{s.label}.txt", args.top)
            console.print(f"\n[bold]{s.label}[/]: main-thread busy samples {busy}; inclusive share:")
            for frame, share in inclusive:
                console.print(f"  {share:6.1%}  {frame}", highlight=False, soft_wrap=True)
            console.print("self share:")
            for frame, share in own[:12]:
                console.print(f"  {share:6.1%}  {frame}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
