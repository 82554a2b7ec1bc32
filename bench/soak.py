"""Soak: many concurrent clients doing random begin / call / finish / abort and disconnects.

A real ``swarm serve`` process (``--engine hf`` on ``--device cpu`` by default, or ``--engine vllm --device
cuda``; ``--model`` or the embedded model; a client token; a short idle timeout; training off, or on with
``--train``: LoRA, checkpoint every step) takes ``--clients`` concurrent clients (asyncio tasks of this
process) for ``--seconds``. Each client loops: begin an episode of one of ``--tasks`` tasks, make 0-2 chat
calls (``max_tokens`` 2), then at random finish it (55 %), abort it (15 %), abort it as an infra failure
(10 %), vanish without a word (10 %: the server reclaims it after ``--episode-timeout``), or drop a
streamed call mid-answer and vanish (10 %).

Checked at the end (exit code 1 when any fails):

- the server stayed up (it answers ``GET /api/v1/status`` throughout and at the end);
- every episode a client began is in the pool exactly once, with the status the client gave it
  (finished with its reward, aborted, infra failure; vanished ones reclaimed as infra failures), and
  nothing else is (an episode whose last request got an error answer or a timeout is counted as
  *unverified*: only its being in the pool once is checked);
- memory stays bounded: the RSS of the server and its child processes (vLLM's engine core) is sampled
  every 10 s (a sixth of a short run); the last sample may exceed the first one after warm-up (the first
  quarter of the run) by at most ``--rss-growth`` (default 25 %); judged on runs of 60 s or more;
- a stopped server leaves nothing behind: right after it exited (SIGTERM, no waiting), none of the child
  processes it had is alive and, on CUDA, the GPU's used memory is back to what it was before the server
  started (within ``--gpu-slack-mib``; read with ``nvidia-smi``, else ``torch.cuda.mem_get_info``);
- with ``--train``: every episode is consumed by at most one step (the pool's ``trained_step``) and
  exactly as its step says: the steps of ``metrics.jsonl`` are 1, 2, … N (never back, nothing rewound),
  N is the server's step at the end, every consumed episode's step is one of them, and step s consumed
  its ``groups × --group-size`` trained episodes (``--group-size`` of each task) plus its
  ``episodes_dropped`` infra failures; the pool's finished/aborted episodes not consumed are the server's
  ``pending`` count.

The verdict comes first, in one line (``nothing lost: yes/no`` with the counts), then the table;
``--json PATH`` writes every number (RSS and GPU memory series included).

Run: ``.venv/bin/python bench/soak.py`` (≈ 2.5 min on CPU: 200 clients, 120 s);
``tests/server/test_soak.py`` runs 20 clients for 6 s (and a short ``--train`` run) in CI. The GPU soak
(bench/README.md): ``--engine vllm --device cuda --train --seconds 600``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
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
from typing import Any

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
BUSY = ("draining", "training")
"""Server states in which a training step is under way."""


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


@dataclass
class Samples:
    """What the watcher saw every few seconds while the clients ran."""

    rss: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since the start, RSS of the server and its descendants in MiB)."""
    gpu: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since the start, GPU memory used in MiB); CUDA runs only."""
    down: list[float] = field(default_factory=list)
    """Seconds at which the server did not answer its status."""
    children: dict[int, str] = field(default_factory=dict)
    """Every descendant process seen: pid → its start time (``/proc/PID/stat`` field 22)."""


# -- processes and memory -----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or ``None`` when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> dict[int, str]:
    """Every living descendant of ``pid``: pid → start time (to tell a reused pid apart)."""
    parents: dict[int, int] = {}
    started: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
            started[int(entry.name)] = fields[19]
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = started[child]
                frontier.append(child)
    return found


def _alive(processes: dict[int, str]) -> list[int]:
    """The pids of ``processes`` still running (same start time, not a zombie)."""
    out = []
    for pid, started in processes.items():
        fields = _stat(pid)
        if fields is not None and fields[19] == started and fields[0] != "Z":
            out.append(pid)
    return out


def _rss_mib(pids: list[int]) -> float:
    """Summed VmRSS of ``pids`` in MiB (processes that are gone count 0)."""
    total = 0
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in lines if line.startswith("VmRSS:")), 0)
    return total / 1024


def _gpu_index(device: str) -> int | None:
    """The CUDA index of a torch ``device`` string (``cuda`` → 0, ``cuda:1`` → 1), ``None`` off CUDA."""
    return int(device.partition(":")[2] or 0) if device.startswith("cuda") else None


def _gpu_used_mib(index: int) -> float:
    """Memory in use on CUDA device ``index`` in MiB, device-wide (every process's): ``nvidia-smi`` (the
    GPU ``CUDA_VISIBLE_DEVICES`` maps it to), else ``torch.cuda.mem_get_info``, which opens a CUDA context
    in this process on its first call (read it first, before the server starts, so every reading has it)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if shutil.which("nvidia-smi"):
        gpu = visible[index] if index < len(visible) else str(index)
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", gpu],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode == 0 and out.stdout.strip():
            return float(out.stdout.split()[0])
    import torch

    free, total = torch.cuda.mem_get_info(index)
    return (total - free) / 2**20


# -- the clients ----------------------------------------------------------------------------------------------
async def _client(
    url: str,
    token: str,
    rng: random.Random,
    end: float,
    tally: Tally,
    http: httpx.AsyncClient,
    args: argparse.Namespace,
) -> None:
    from swarm.client import AsyncSwarmClient, RetryPolicy
    from swarm.errors import ClientError

    retry = RetryPolicy(attempts=4, max_wait_s=2.0, deadline_s=args.retry_deadline)
    async with AsyncSwarmClient(
        url, client_token=token, client_id="soak", retry=retry, timeout_s=args.request_timeout
    ) as swarm:
        while time.monotonic() < end:
            try:
                ep = await swarm.begin(f"task-{rng.randrange(args.tasks)}")
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
    url: str, admin: str, pid: int, gpu: int | None, end: float, every: float, seen: Samples
) -> None:
    """Every ``every`` seconds until ``end``: check the server answers, sample its tree's RSS (and the GPU's
    memory), and note its descendants."""
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as http:
        while True:
            try:
                (
                    await http.get(f"{url}/api/v1/status", headers={"Authorization": f"Bearer {admin}"})
                ).raise_for_status()
            except httpx.HTTPError:
                seen.down.append(time.monotonic() - start)
            tree = _descendants(pid)
            seen.children.update(tree)
            seen.rss.append((time.monotonic() - start, _rss_mib([pid, *tree])))
            if gpu is not None:
                seen.gpu.append((time.monotonic() - start, await asyncio.to_thread(_gpu_used_mib, gpu)))
            if time.monotonic() >= end:
                return
            await asyncio.sleep(min(every, max(0.0, end - time.monotonic())))


async def _soak(
    url: str, token: str, admin: str, pid: int, gpu: int | None, args: argparse.Namespace
) -> tuple[Tally, Samples]:
    tally, seen = Tally(), Samples()
    end = time.monotonic() + args.seconds
    limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=args.request_timeout, limits=limits) as http:
        rngs = [random.Random(args.seed * 100_003 + i) for i in range(args.clients)]
        every = min(10.0, args.seconds / 6)
        watcher = asyncio.create_task(_watch(url, admin, pid, gpu, end, every, seen))
        await asyncio.gather(*(_client(url, token, rng, end, tally, http, args) for rng in rngs))
        await watcher
    return tally, seen


# -- the server -------------------------------------------------------------------------------------------------
def _serve_command(port: int, run_dir: Path, args: argparse.Namespace) -> list[str]:
    cmd = [
        sys.executable, "-m", "swarm.cli", "serve", "--port", str(port), "--run-dir", str(run_dir),
        "--engine", args.engine, "--device", args.device,
        "--episode-timeout", str(args.episode_timeout), "--log-level", "warning",
    ]  # fmt: skip
    if args.device == "cpu":
        cmd += ["--threads", "1"]  # a shared CPU machine
    if args.model:
        cmd += ["--model", args.model]
    if args.engine == "vllm":
        cmd += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.train:
        cmd += ["--train", "--lora-rank", str(args.lora_rank)]
        cmd += ["--batch-policy", "tasks", "--batch-size", str(args.batch_size)]
        cmd += ["--group-size", str(args.group_size)]
    else:
        cmd += ["--no-train"]
    return cmd


def _status(url: str, admin: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/api/v1/status", headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    answer.raise_for_status()
    return dict(answer.json())


def _settle(url: str, admin: str, limit_s: float) -> dict[str, Any]:
    """The server's status once no episode is open and no step is under way (twice in a row, 1 s apart),
    or the last one read after ``limit_s`` seconds; ``{}`` when it does not answer."""
    deadline = time.monotonic() + limit_s
    quiet = 0
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            status = _status(url, admin)
        except httpx.HTTPError:
            return {}
        quiet = quiet + 1 if status["state"] not in BUSY and status["episodes"]["open"] == 0 else 0
        if quiet >= 2:
            break
        time.sleep(1.0)
    return status


def _stop(server: subprocess.Popen[bytes]) -> float:
    """SIGTERM the server and wait for it (killed after 120 s); returns the seconds it took."""
    started = time.monotonic()
    server.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=120)
    if server.poll() is None:  # deaf to SIGTERM: the check of its children will say what it left
        server.kill()
        server.wait()
    return time.monotonic() - started


# -- the checks -------------------------------------------------------------------------------------------------
def _pool_check(rows: list[tuple[Any, ...]], tally: Tally) -> dict[str, int]:
    """Begun episodes against the pool: missing, extra, twice, wrong status (or reward), unverified."""
    stored = Counter(r[0] for r in rows)
    by_id = {r[0]: (r[1], r[2]) for r in rows}
    began = tally.began
    wrong = [
        e for e, action in began.items()
        if action != "unknown" and e in by_id and (
            by_id[e][0] != EXPECTED[action] or (action == "finish" and by_id[e][1] != tally.rewards[e])
        )
    ]  # fmt: skip
    return {
        "begun": len(began),
        "pool_rows": len(rows),
        "missing": sum(1 for e in began if e not in by_id),
        "extra": sum(1 for e in by_id if e not in began),
        "twice": sum(1 for n in stored.values() if n > 1),
        "wrong_status": len(wrong),
        "unverified": sum(1 for a in began.values() if a == "unknown"),
    }


def _training_check(
    rows: list[tuple[Any, ...]], steps: list[dict[str, Any]], status: dict[str, Any], group_size: int
) -> tuple[dict[str, Any], list[str]]:
    """Each episode consumed once and as its step says (see the module docstring); returns the numbers and
    what is wrong (empty: trained exactly once)."""
    problems: list[str] = []
    numbers = [int(s["step"]) for s in steps]
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"steps of metrics.jsonl are {numbers}, not 1…{len(numbers)}")
    if any(s.get("rewound_steps") for s in steps):
        problems.append("steps were rewound")
    if status and int(status["step"]) != len(numbers):
        problems.append(f"the server is at step {status['step']}, metrics.jsonl has {len(numbers)} steps")
    consumed: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        if row[3] is not None:
            consumed.setdefault(int(row[3]), []).append(row)
    if unknown := sorted(set(consumed) - set(numbers)):
        problems.append(f"episodes consumed by steps {unknown} that metrics.jsonl does not have")
    for step in steps:
        taken = consumed.get(int(step["step"]), [])
        trained = [r for r in taken if r[1] != "infra_failure"]
        dropped = len(taken) - len(trained)
        per_task = Counter(r[4] for r in trained)
        if len(trained) != step["groups"] * group_size or set(per_task.values()) - {group_size}:
            problems.append(
                f"step {step['step']}: {len(trained)} episodes trained in {len(per_task)} tasks, the step "
                f"says {step['groups']} groups of {group_size}"
            )
        if dropped != step["episodes_dropped"]:
            problems.append(
                f"step {step['step']}: {dropped} dropped, the step says {step['episodes_dropped']}"
            )
    pending = sum(1 for r in rows if r[3] is None and r[1] in ("finished", "aborted"))
    if status and pending != status["episodes"]["pending"]:
        problems.append(
            f"{pending} untrained episodes in the pool, the server counts {status['episodes']['pending']}"
        )
    trained = sum(1 for r in rows if r[3] is not None and r[1] != "infra_failure")
    return {
        "steps": len(numbers),
        "trained": trained,
        "dropped": sum(1 for r in rows if r[3] is not None and r[1] == "infra_failure"),
        "pending": pending,
        "problems": problems,
    }, problems


def _series(points: list[tuple[float, float]], most: int = 8) -> str:
    """``t: MiB`` pairs, at most ``most`` of them spread over the series (first and last kept)."""
    if len(points) > most:
        points = [points[round(i * (len(points) - 1) / (most - 1))] for i in range(most)]
    return "  ".join(f"{t:.0f}: {m:.0f}" for t, m in points)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="swarm serve --engine")
    parser.add_argument("--device", default="cpu", help="swarm serve --device (vllm: cuda)")
    parser.add_argument("--model", default=None, help="swarm serve --model (default: the embedded model)")
    parser.add_argument(
        "--train", action=argparse.BooleanOptionalAction, default=False, help="train (LoRA) during the soak"
    )
    parser.add_argument("--lora-rank", type=int, default=16, help="with --train")
    parser.add_argument("--batch-size", type=int, default=8, help="with --train: B groups per step")
    parser.add_argument("--group-size", type=int, default=8, help="with --train: G episodes per task")
    parser.add_argument("--tasks", type=int, default=50, help="distinct task ids the clients draw from")
    parser.add_argument("--episode-timeout", type=float, default=10.0, help="server idle reclaim, seconds")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="a client's read timeout, s")
    parser.add_argument(
        "--retry-deadline", type=float, default=30.0, help="a client gives up retrying 429/503 after, s"
    )
    parser.add_argument("--settle-timeout", type=float, default=300.0, help="wait for the last step, s")
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=1200.0,
        help="wait this long for the server to answer, s (vLLM's start, plus any wait for the GPU lock)",
    )
    parser.add_argument("--rss-growth", type=float, default=0.25, help="allowed RSS growth after warm-up")
    parser.add_argument("--gpu-slack-mib", type=float, default=256.0, help="GPU memory left after a stop")
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.3, help="vllm: the server's share of the GPU"
    )
    parser.add_argument(
        "--gpu-shared",
        action="store_true",
        help="other work uses the GPU too: its memory is read device-wide, so it is reported, not judged",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    args = parser.parse_args()
    if args.engine == "vllm" and not args.device.startswith("cuda"):
        parser.error("--engine vllm runs on --device cuda")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped soak stops its server (finally)
    console = Console(width=160)
    gpu = _gpu_index(args.device)
    gpu_mib: dict[str, float] = {}
    if gpu is not None:
        try:
            gpu_mib["before"] = _gpu_used_mib(gpu)
        except (RuntimeError, AssertionError, ValueError) as exc:  # torch without a usable CUDA device
            console.print(f"cannot read the memory of {args.device}: {exc}", markup=False)
            return 2
    tmp = Path(tempfile.mkdtemp(prefix="swarm-soak-"))
    run_dir = tmp / "run"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    token, admin = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    env = {**os.environ, "SWARM_CLIENT_TOKEN": token, "SWARM_ADMIN_TOKEN": admin}
    log = (tmp / "serve.log").open("wb")
    server = subprocess.Popen(
        _serve_command(port, run_dir, args), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    status: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + args.start_timeout
        while True:
            try:
                if httpx.get(f"{url}/api/v1/status", headers={"Authorization": f"Bearer {admin}"}).is_success:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                tail = (tmp / "serve.log").read_text(errors="replace").splitlines()[-30:]
                why = "it exited" if server.poll() is not None else f"no answer in {args.start_timeout:.0f} s"
                console.print(f"the server did not start ({why}):\n" + "\n".join(tail), markup=False)
                return 1
            time.sleep(0.5)
        if gpu is not None:
            gpu_mib["loaded"] = _gpu_used_mib(gpu)
        started = time.monotonic()
        tally, seen = asyncio.run(_soak(url, token, admin, server.pid, gpu, args))
        elapsed = time.monotonic() - started
        # vanished episodes are reclaimed after the idle timeout (checked every 5 s); then the last step
        time.sleep(args.episode_timeout + 6.0)
        status = _settle(url, admin, args.settle_timeout)
        alive = server.poll() is None and bool(status)
        seen.children.update(_descendants(server.pid))
        if gpu is not None:
            gpu_mib["end"] = _gpu_used_mib(gpu)
    finally:
        stop_s = _stop(server)
        log.close()
    left = _alive(seen.children)  # right after the exit: nothing waited for
    if gpu is not None:
        gpu_mib["after_stop"] = _gpu_used_mib(gpu)
    gpu_freed = gpu is None or gpu_mib["after_stop"] <= gpu_mib["before"] + args.gpu_slack_mib
    later: dict[str, Any] = {}
    if left or not gpu_freed:  # what a moment later shows (for the report; the check is the above)
        time.sleep(5.0)
        later["children_alive"] = len(_alive(seen.children))
        if gpu is not None:
            later["gpu_mib"] = _gpu_used_mib(gpu)
    with sqlite3.connect(run_dir / "pool.db") as db:
        rows = db.execute("SELECT id, status, reward, trained_step, task_id FROM episodes").fetchall()
    metrics = run_dir / "metrics.jsonl"
    steps = []
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line
            continue
    shutil.rmtree(tmp, ignore_errors=True)

    pool = _pool_check(rows, tally)
    training, problems = _training_check(rows, steps, status, args.group_size) if args.train else ({}, [])
    warm = [m for t, m in seen.rss if t >= args.seconds / 4]  # after warm-up: a quarter of the run
    growth = warm[-1] / warm[0] - 1 if len(warm) > 1 else 0.0
    lost = pool["missing"] + pool["extra"] + pool["twice"] + pool["wrong_status"]
    checks = {
        "server up throughout and at the end": alive and not seen.down,
        "every begun episode in the pool exactly once": not (
            pool["missing"] or pool["extra"] or pool["twice"]
        ),
        "each with the status (and reward) its client gave it": not pool["wrong_status"],
        "no child process alive right after the stop": not left,
    }
    if args.seconds >= 60:  # a short run is all warm-up: the first calls allocate the model's buffers
        checks[f"RSS growth after warm-up ≤ {args.rss_growth:.0%}"] = growth <= args.rss_growth
    if gpu is not None and not args.gpu_shared:  # device-wide: other processes' memory would count
        checks[f"GPU memory back to its start right after the stop (≤ +{args.gpu_slack_mib:.0f} MiB)"] = (
            gpu_freed
        )
    if args.train:
        checks["every consumed episode trained exactly once, as its step says"] = not problems
    passed = all(checks.values())

    verdict = (
        f"soak {'PASS' if passed else 'FAIL'} · nothing lost: {'yes' if lost == 0 else 'no'} "
        f"({pool['begun']} begun, {pool['pool_rows']} in the pool: {pool['missing']} missing, {pool['extra']} "
        f"extra, {pool['twice']} twice, {pool['wrong_status']} wrong status, {pool['unverified']} unverified)"
    )
    if args.train:
        verdict += (
            f" · trained once: {'yes' if not problems else 'no'} ({training['steps']} steps, "
            f"{training['trained']} trained, {training['dropped']} dropped, {training['pending']} pending)"
        )
    verdict += f" · {sum(checks.values())}/{len(checks)} checks"
    console.print(verdict, markup=False, highlight=False, soft_wrap=True)

    what = f"{args.engine} on {args.device}{', training LoRA r' + str(args.lora_rank) if args.train else ''}"
    table = Table(title=f"soak: {args.clients} clients, {elapsed:.0f} s, {what}, seed {args.seed}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("episodes begun", str(len(tally.began)))
    for action, _ in ACTIONS:
        table.add_row(f"  {action}", str(sum(1 for a in tally.began.values() if a == action)))
    table.add_row("  ended with an error answer", str(pool["unverified"]))
    table.add_row("episodes/s", f"{len(tally.began) / elapsed:.1f}")
    table.add_row("chat calls", str(tally.calls))
    table.add_row(
        "refused answers (status: count)",
        ", ".join(f"{k}: {v}" for k, v in sorted(tally.refused.items())) or "0",
    )
    table.add_row("transport errors", str(tally.unreachable))
    table.add_row(
        "pool rows · missing · extra · twice · wrong status",
        f"{pool['pool_rows']} · {pool['missing']} · {pool['extra']} · {pool['twice']} · {pool['wrong_status']}",
    )
    if args.train:
        table.add_row(
            "training steps · trained · dropped · pending",
            " · ".join(str(training[k]) for k in ("steps", "trained", "dropped", "pending")),
        )
        for problem in problems[:5]:
            table.add_row("  training problem", problem)
    table.add_row("server + children RSS MiB (t s: MiB)", _series(seen.rss))
    table.add_row("RSS growth after warm-up", f"{growth:+.1%}")
    table.add_row("child processes seen · alive right after the stop", f"{len(seen.children)} · {len(left)}")
    table.add_row("stop (SIGTERM → exit)", f"{stop_s:.1f} s")
    if gpu is not None:
        table.add_row(
            "GPU MiB used (device-wide" + (", shared: not judged" if args.gpu_shared else "")
            + "): before · loaded · max · end · after stop",
            " · ".join(f"{v:.0f}" for v in (
                gpu_mib["before"], gpu_mib["loaded"], max((m for _, m in seen.gpu), default=float("nan")),
                gpu_mib["end"], gpu_mib["after_stop"],
            )),
        )  # fmt: skip
    if later:
        table.add_row("5 s after the stop", ", ".join(f"{k} {v:.0f}" for k, v in later.items()))
    for name, ok in checks.items():
        table.add_row(name, "PASS" if ok else "FAIL")
    console.print(table)

    if args.json is not None:
        report = {
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "passed": passed,
            "nothing_lost": lost == 0,
            "checks": checks,
            "seconds": elapsed,
            "episodes_per_s": len(tally.began) / elapsed,
            "actions": dict(Counter(tally.began.values())),
            "chat_calls": tally.calls,
            "refused": {str(k): v for k, v in sorted(tally.refused.items())},
            "transport_errors": tally.unreachable,
            "pool": pool,
            "training": training,
            "rss_mib": seen.rss,
            "rss_growth": growth,
            "down_at_s": seen.down,
            "children": {"seen": len(seen.children), "alive_after_stop": left},
            "stop_s": stop_s,
            "gpu_mib": {**gpu_mib, "series": seen.gpu} if gpu is not None else None,
            "later": later,
            "server_status": status,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
