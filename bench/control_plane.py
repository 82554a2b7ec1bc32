"""Benchmark: episode control-plane throughput of a swarm server (begin + finish, no generation).

``--clients`` concurrent clients (asyncio tasks spread over ``--procs`` client processes) each loop
``begin → finish(reward)`` with :class:`swarm.client.AsyncSwarmClient` until ``--episodes`` episodes
have finished. The server is a real ``uvicorn`` process (started here with the embedded model
unless ``--server URL`` names a running one); every finish is committed to its SQLite pool before it
answers, as in production. Reported: episodes/s over the timed window (first start to last finish,
all processes), latency of one episode (begin + finish) and of each call, p50/p90/p99, and a check
that the server's pool holds every finished episode.

Target (issue 5): ≥ 1,000 episodes/s with 100 clients.

Measured here (2 shared CPU cores, load average 5-7 from other work, 5,000 episodes, training off):
198 episodes/s, episode latency p50 473 ms / p99 707 ms. The throughput is CPU-bound on both sides: the
server spends 1.13 ms of CPU per episode (≈ 890 episodes/s on one free core: its event loop is one
thread) and the httpx clients 2.1 ms, so two idle cores shared by both would cap at ≈ 620 episodes/s;
≥ 1,000 needs the server on its own core and the clients elsewhere. Where the server's time goes (py-spy):
Starlette/FastAPI request handling ≈ 60 % (FastAPI 0.165's built-in telemetry check ≈ 6 % of it), h11
HTTP parsing ≈ 15 %, socket writes ≈ 12 %, swarm's own begin/finish ≈ 11 % (pool commit 4 %, event log
3 %). Making the FastAPI dependencies ``async`` (no thread-pool hop) took it from 1.68 to 1.20 ms. With
``--training`` the batch-policy check re-reads every pending episode after each finish: 4.0 ms per
episode at a few thousand pending episodes, and growing with the pool.

The server runs with training off (this measures the episode routes and the pool); ``--training``
leaves it on, so its batch-policy check runs after every finish as in a training run.

Run: ``.venv/bin/python bench/control_plane.py`` (≈ 30 s); ``--access-log`` serves with uvicorn's
per-request access log on (what ``swarm serve --access-log`` does); ``--profile out.svg`` records
the server with py-spy (``pip install py-spy``; ``out.txt`` writes collapsed stacks instead).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import shutil
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

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(port: int, run_dir: Path, access_log: bool, training: bool) -> None:
    """The server process: the embedded model behind uvicorn (h11 or httptools, whatever is installed)."""
    import uvicorn

    from swarm.config import ServerConfig, TrainingConfig
    from swarm.server.app import create_app

    config = ServerConfig(run_dir=run_dir, port=port, training=TrainingConfig(enabled=training))
    uvicorn.run(create_app(config), host="127.0.0.1", port=port, log_level="warning", access_log=access_log)


def _client_proc(url: str, clients: int, episodes: int, start_at: float, out: Any) -> None:
    """One client process: ``clients`` tasks sharing ``episodes`` begin+finish loops."""
    from swarm.client import AsyncSwarmClient, RetryPolicy

    async def main() -> dict[str, Any]:
        # One client object (one keep-alive connection) per simulated client, as separate runners
        # would have: httpcore's pool scans every connection per request, so one shared pool of 100
        # connections costs the *client* ~9 ms of CPU per episode and would measure httpcore instead.
        retry = RetryPolicy(attempts=3)
        pool = [
            AsyncSwarmClient(url, client_id=f"bench-{os.getpid()}-{w}", retry=retry) for w in range(clients)
        ]
        remaining = [episodes]
        episode_s: list[float] = []
        begin_s: list[float] = []
        finish_s: list[float] = []
        rng = random.Random(os.getpid())

        async def worker(client: AsyncSwarmClient) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                t0 = time.perf_counter()
                ep = await client.begin(f"task-{rng.randrange(1000)}")
                t1 = time.perf_counter()
                await ep.finish(rng.random())
                t2 = time.perf_counter()
                begin_s.append(t1 - t0)
                finish_s.append(t2 - t1)
                episode_s.append(t2 - t0)

        # open every connection outside the timed window
        await asyncio.gather(*(c.status() for c in pool))
        await asyncio.sleep(max(0.0, start_at - time.time()))
        started, cpu0 = time.time(), time.process_time()
        await asyncio.gather(*(worker(c) for c in pool))
        ended, cpu = time.time(), time.process_time() - cpu0
        for c in pool:
            await c.aclose()
        return {
            "start": started,
            "end": ended,
            "cpu": cpu,
            "episode": episode_s,
            "begin": begin_s,
            "finish": finish_s,
        }

    out.put(asyncio.run(main()))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its threads (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


def _wait_ready(url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/api/v1/status", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server at {url} did not become ready in {timeout_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--server", help="use a running server instead of starting one")
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients in total")
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--access-log", action="store_true", help="serve with uvicorn's access log on")
    parser.add_argument(
        "--training", action="store_true", help="leave training on (its batch check runs after every finish)"
    )
    parser.add_argument("--profile", type=Path, help="py-spy flame graph of the server (SVG)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # internal: be the server
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.run_dir, args.access_log, args.training)
        return

    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="swarm-bench-"))
    server: subprocess.Popen[bytes] | None = None
    spy: subprocess.Popen[bytes] | None = None
    url = args.server
    try:
        if url is None:
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = [sys.executable, __file__, "--serve", str(port), "--run-dir", str(tmp / "run")]
            cmd += ["--access-log"] if args.access_log else []
            cmd += ["--training"] if args.training else []
            server = subprocess.Popen(cmd, cwd=ROOT)
        _wait_ready(url, server)
        before = httpx.get(f"{url}/api/v1/status").json()["episodes"]["finished"]
        server_cpu0 = _cpu_seconds(server.pid) if server is not None else None
        if args.profile is not None and server is not None:
            spy = subprocess.Popen(
                [
                    shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
                    "record",
                    "-o",
                    str(args.profile),
                    "-p",
                    str(server.pid),
                ]
                + (["--format", "raw"] if args.profile.suffix != ".svg" else []),
                stdout=subprocess.DEVNULL,
            )
            time.sleep(1.0)
        ctx = mp.get_context("spawn")
        out: Any = ctx.Queue()
        start_at = time.time() + 3.0  # every process imports and connects first
        per_proc = [args.clients // args.procs + (i < args.clients % args.procs) for i in range(args.procs)]
        eps_proc = [args.episodes // args.procs + (i < args.episodes % args.procs) for i in range(args.procs)]
        procs = [
            ctx.Process(target=_client_proc, args=(url, c, e, start_at, out))
            for c, e in zip(per_proc, eps_proc, strict=True)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=60)
        server_cpu = _cpu_seconds(server.pid) - server_cpu0 if server_cpu0 is not None and server else None
        after = httpx.get(f"{url}/api/v1/status").json()["episodes"]["finished"]
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)

    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    episode = [x for r in results for x in r["episode"]]
    begin = [x for r in results for x in r["begin"]]
    finish = [x for r in results for x in r["finish"]]
    rate = len(episode) / wall
    table = Table(title="swarm control plane: begin + finish, no generation")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("clients (processes)", f"{args.clients} ({args.procs})")
    table.add_row("episodes", str(len(episode)))
    table.add_row("pool check (finished on server)", f"{after - before} / {len(episode)}")
    table.add_row("wall time", f"{wall:.2f} s")
    table.add_row("episodes/s", f"[bold]{rate:,.0f}[/]  (target ≥ 1,000)")
    table.add_row("requests/s", f"{2 * rate:,.0f}")
    for name, values in (("episode (begin+finish)", episode), ("begin", begin), ("finish", finish)):
        table.add_row(
            f"{name} latency p50 / p90 / p99",
            f"{_pct(values, 0.5):.1f} / {_pct(values, 0.9):.1f} / {_pct(values, 0.99):.1f} ms",
        )
    table.add_row("mean episode latency", f"{statistics.fmean(episode) * 1000:.1f} ms")
    client_cpu = sum(r["cpu"] for r in results)
    table.add_row("client CPU per episode", f"{client_cpu / len(episode) * 1000:.2f} ms")
    if server_cpu is not None:
        per_episode = server_cpu / len(episode)
        table.add_row("server CPU per episode (all threads)", f"{per_episode * 1000:.2f} ms")
        table.add_row("server capacity on one free core", f"{1 / per_episode:,.0f} episodes/s")
    table.add_row("load average (1 min) at the end", f"{os.getloadavg()[0]:.1f}")
    how = f"access log {'on' if args.access_log else 'off'}, training {'on' if args.training else 'off'}"
    table.add_row("server", f"started here ({how})" if server else url)
    table.add_row("cpu cores", str(os.cpu_count()))
    console.print(table)
    if after - before != len(episode):
        raise SystemExit("the server's pool does not hold every finished episode")


if __name__ == "__main__":
    main()
