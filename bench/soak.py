"""Soak: many concurrent clients doing random begin / call / finish / abort and disconnects.

A real ``swarm serve`` process (the embedded model, training off, a client token, a short idle timeout)
takes ``--clients`` concurrent clients (asyncio tasks of this process) for ``--seconds``. Each client
loops: begin an episode, make 0-2 chat calls (``max_tokens`` 2, some streamed), then at random finish
it (55 %), abort it (15 %), abort it as an infra failure (10 %), vanish without a word (10 %: the server
reclaims it after ``--episode-timeout``), or drop a streamed call mid-answer and vanish (10 %).

Checked at the end (exit code 1 when any fails):

- the server stayed up (it answers ``GET /api/v1/status`` throughout and at the end);
- every episode a client began is in the pool exactly once, with the status the client gave it
  (finished with its reward, aborted, infra failure; vanished ones reclaimed as infra failures), and
  nothing else is;
- memory stays bounded: the server's RSS is printed every 10 s (a sixth of a short run); the last
  sample may exceed the first one after warm-up (the first quarter of the run) by at most
  ``--rss-growth`` (default 25 %); judged on runs of 60 s or more (a shorter one is all warm-up).

Run: ``.venv/bin/python bench/soak.py`` (≈ 2.5 min: 200 clients, 120 s); ``tests/server/test_soak.py``
runs a 5-second version with 20 clients in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
ACTIONS = (("finish", 0.55), ("abort", 0.15), ("infra", 0.10), ("vanish", 0.10), ("disconnect", 0.10))
EXPECTED = {
    "finish": "finished",
    "abort": "aborted",
    "infra": "infra_failure",
    "vanish": "infra_failure",
    "disconnect": "infra_failure",
}


@dataclass
class Tally:
    """What the clients did and were told."""

    began: dict[str, str] = field(default_factory=dict)
    """Episode id → the action its client took (its expected pool status via ``EXPECTED``)."""
    rewards: dict[str, float] = field(default_factory=dict)
    calls: int = 0
    refused: Counter[int] = field(default_factory=Counter)
    """Answers the clients could not use, by status (429/503 are retried by the client library first)."""
    unreachable: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _client(
    url: str, token: str, rng: random.Random, end: float, tally: Tally, http: httpx.AsyncClient
) -> None:
    from swarm.client import AsyncSwarmClient, RetryPolicy
    from swarm.errors import ClientError

    retry = RetryPolicy(attempts=4, max_wait_s=2.0, deadline_s=30.0)
    async with AsyncSwarmClient(
        url, client_token=token, client_id="soak", retry=retry, timeout_s=60
    ) as swarm:
        while time.monotonic() < end:
            try:
                ep = await swarm.begin(f"task-{rng.randrange(50)}")
            except ClientError as exc:
                tally.refused[exc.status_code] += 1
                continue
            except httpx.TransportError:
                tally.unreachable += 1
                await asyncio.sleep(0.5)
                continue
            action = rng.choices([a for a, _ in ACTIONS], [w for _, w in ACTIONS])[0]
            tally.began[ep.id] = action
            headers = {"Authorization": f"Bearer {ep.api_key}"}
            body = {"model": ep.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            try:
                for _ in range(rng.randrange(3)):
                    answer = await http.post(f"{ep.base_url}/chat/completions", json=body, headers=headers)
                    tally.calls += 1
                    if answer.status_code != 200:
                        tally.refused[answer.status_code] += 1
                if action == "disconnect":  # leave in the middle of a streamed answer
                    stream = {**body, "max_tokens": 8, "stream": True}
                    async with http.stream(
                        "POST", f"{ep.base_url}/chat/completions", json=stream, headers=headers
                    ) as streamed:
                        async for _ in streamed.aiter_raw():
                            break
                elif action == "finish":
                    reward = round(rng.random(), 6)
                    await ep.finish(reward)
                    tally.rewards[ep.id] = reward
                elif action in ("abort", "infra"):
                    await ep.abort("soak", infra_failure=action == "infra")
            except ClientError as exc:
                tally.refused[exc.status_code] += 1
                tally.began[ep.id] = "unknown"
            except httpx.TransportError:
                tally.unreachable += 1
                tally.began[ep.id] = "unknown"


async def _watch(
    url: str,
    admin: str,
    pid: int,
    end: float,
    every: float,
    rss: list[tuple[float, float]],
    down: list[float],
) -> None:
    """Sample the server's RSS and check it answers, every ``every`` seconds until ``end``."""
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as http:
        while True:
            try:
                (
                    await http.get(f"{url}/api/v1/status", headers={"Authorization": f"Bearer {admin}"})
                ).raise_for_status()
            except httpx.HTTPError:
                down.append(time.monotonic() - start)
            rss.append((time.monotonic() - start, _rss_mib(pid)))
            if time.monotonic() >= end:
                return
            await asyncio.sleep(min(every, max(0.0, end - time.monotonic())))


async def _soak(
    url: str, token: str, admin: str, pid: int, args: argparse.Namespace
) -> tuple[Tally, list[tuple[float, float]], list[float]]:
    tally = Tally()
    rss: list[tuple[float, float]] = []
    down: list[float] = []
    end = time.monotonic() + args.seconds
    limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        rngs = [random.Random(args.seed * 100_003 + i) for i in range(args.clients)]
        every = min(10.0, args.seconds / 6)
        watcher = asyncio.create_task(_watch(url, admin, pid, end, every, rss, down))
        await asyncio.gather(*(_client(url, token, rng, end, tally, http) for rng in rngs))
        await watcher
    return tally, rss, down


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--episode-timeout", type=float, default=10.0, help="server idle reclaim, seconds")
    parser.add_argument("--rss-growth", type=float, default=0.25, help="allowed RSS growth after warm-up")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped soak stops its server (finally)
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="swarm-soak-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    token, admin = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    env = {**os.environ, "SWARM_CLIENT_TOKEN": token, "SWARM_ADMIN_TOKEN": admin}
    cmd = [
        str(Path(sys.executable).parent / "swarm"), "serve", "--port", str(port), "--run-dir", str(tmp / "run"),
        "--no-train", "--threads", "1", "--episode-timeout", str(args.episode_timeout), "--log-level", "warning",
    ]  # fmt: skip
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/api/v1/status", headers={"Authorization": f"Bearer {admin}"}).is_success:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                console.print("the server did not start")
                return 1
            time.sleep(0.5)
        started = time.monotonic()
        tally, rss, down = asyncio.run(_soak(url, token, admin, server.pid, args))
        elapsed = time.monotonic() - started
        # vanished episodes are reclaimed after the idle timeout (checked every 5 s)
        time.sleep(args.episode_timeout + 6.0)
        alive = server.poll() is None
        try:
            status = httpx.get(f"{url}/api/v1/status", headers={"Authorization": f"Bearer {admin}"}).json()
        except httpx.HTTPError:
            status, alive = {}, False
    finally:
        server.terminate()
        server.wait(timeout=60)
    rows = (
        sqlite3.connect(tmp / "run" / "pool.db").execute("SELECT id, status, reward FROM episodes").fetchall()
    )
    shutil.rmtree(tmp, ignore_errors=True)

    stored = Counter(r[0] for r in rows)
    by_id = {r[0]: (r[1], r[2]) for r in rows}
    began = tally.began
    missing = [e for e in began if e not in by_id]
    extra = [e for e in by_id if e not in began]
    twice = [e for e, n in stored.items() if n > 1]
    wrong = [
        e for e, action in began.items()
        if action != "unknown" and e in by_id and (
            by_id[e][0] != EXPECTED[action] or (action == "finish" and by_id[e][1] != tally.rewards[e])
        )
    ]  # fmt: skip
    warm = [m for t, m in rss if t >= args.seconds / 4]  # after warm-up: a quarter of the run
    growth = warm[-1] / warm[0] - 1 if len(warm) > 1 else 0.0
    checks = {
        "server up throughout and at the end": alive and not down and bool(status),
        "every begun episode in the pool exactly once": not missing and not extra and not twice,
        "each with the status (and reward) its client gave it": not wrong,
    }
    if args.seconds >= 60:  # a short run is all warm-up: the first calls allocate the model's buffers
        checks[f"RSS growth after warm-up ≤ {args.rss_growth:.0%}"] = growth <= args.rss_growth

    table = Table(title=f"soak: {args.clients} clients, {elapsed:.0f} s, seed {args.seed}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("episodes begun", str(len(began)))
    for action, _ in ACTIONS:
        table.add_row(f"  {action}", str(sum(1 for a in began.values() if a == action)))
    table.add_row("  ended with an error answer", str(sum(1 for a in began.values() if a == "unknown")))
    table.add_row("episodes/s", f"{len(began) / elapsed:.1f}")
    table.add_row("chat calls", str(tally.calls))
    table.add_row(
        "refused answers (status: count)",
        ", ".join(f"{k}: {v}" for k, v in sorted(tally.refused.items())) or "0",
    )
    table.add_row("transport errors", str(tally.unreachable))
    table.add_row(
        "pool rows · missing · extra · twice · wrong status",
        f"{len(rows)} · {len(missing)} · {len(extra)} · {len(twice)} · {len(wrong)}",
    )
    table.add_row("server RSS MiB (t s: MiB)", "  ".join(f"{t:.0f}: {m:.0f}" for t, m in rss))
    table.add_row("RSS growth after warm-up", f"{growth:+.1%}")
    for name, ok in checks.items():
        table.add_row(name, "PASS" if ok else "FAIL")
    console.print(table)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
