"""``bench/multi_gpu.py --resume-check``: a server killed after a step and restarted on its run dir.

The server of ``multi_gpu.py`` (same model, trainer, engine and batch; ``--checkpoint-every 1``) trains
``--steps`` N steps from clients given exactly N batches of tasks; once step N's checkpoint is on disk
(its ``checkpoint.saved`` event), the server and every process of its session (Ray's workers, vLLM's
engine core) get SIGKILL. A new server on the same run dir resumes (`swarm.server.checkpoints.resume`;
under verl the actor loads the checkpoint's weights at start-up and its AdamW state from
``trainer_state.pt``), clients give it one more batch, and it trains step N + 1 and checkpoints it.

Reported (``--json``, and printed):

- **steps**: the server's step before the kill, right after the restart, and at the end; the metrics rows'
  steps after the restart; ``train.rewound`` events (a step counter that went back). Pass: N, N, N + 1.
- **AdamW**: from checkpoints N and N + 1's ``trainer_state.pt`` (the torch trainer's ``optimizer``), or
  under verl their ``verl_optimizer/`` folders (the actor's AdamW shards, torch.distributed.checkpoint,
  read unsharded by parameter name: `swarm.train.verl_backend.read_optimizer_files`). Each moment update of
  AdamW is ``m' = β₁m + (1−β₁)g`` and ``v' = β₂v + (1−β₂)g²`` with one gradient ``g``, so if step N + 1
  continued from checkpoint N's moments, ``g_m = (m' − β₁m)/(1−β₁)`` squared equals ``g_v = (v' −
  β₂v)/(1−β₂)`` up to float32 rounding: ``continued_rel_err`` = ‖g_m² − g_v‖ / ‖g_v‖ over all trained
  parameters. If AdamW had restarted (m = v = 0), the same identity holds with m and v zero instead:
  ``restarted_rel_err``. Continued: the first ≈ 1e-6 and the second ≫ it. Also AdamW's step count per
  parameter (N, then N + 1) and ‖m‖ at both checkpoints.
- **save / load time**: per step, the synchronous part of the checkpoint (``checkpoint_s`` of its metrics
  row: the CPU snapshot; with verl the actor's ranks copying their AdamW shards to CPU) and the background
  write (``write_s`` of ``checkpoint.saved``: with verl it includes waiting for the ranks' files); the bytes of each checkpoint; the restart's ``load_s``
  (``checkpoint.loaded``: weights into the server's copy, trainer state into the trainer) and the server's
  start-up time, first and after the restart (under verl the actor builds from the checkpoint's folder
  then).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from multi_gpu import (
    MULTICAST_OFF,
    START,
    BenchError,
    build_model,
    client_argv,
    free_port,
    kill_leftovers,
    last_line,
    log,
    new_events,
    serve_argv,
    stop,
    wait_ready,
    write_tasks,
)

CONTINUED_MAX_REL_ERR = 1e-3
"""``continued_rel_err`` below this (and ``restarted_rel_err`` above 100× it): AdamW continued."""


def adam_moments(trainer_state: dict[str, Any]) -> tuple[dict[Any, dict[str, Any]], tuple[float, float]]:
    """The AdamW per-parameter state (``step``, ``exp_avg``, ``exp_avg_sq``) and ``betas`` of a
    ``trainer_state.pt``: the torch trainer's ``optimizer`` (keys: parameter indices) or verl's
    ``verl_optimizer["optimizer"]`` (keys: parameter names).

    Raises:
        BenchError: neither is there (the checkpoint has no optimizer state).
    """
    optimizer = trainer_state.get("optimizer")
    verl = trainer_state.get("verl_optimizer")
    if optimizer is None and verl is not None:
        from swarm.train.state_files import StateFiles

        if isinstance(verl, StateFiles):  # the actor's shards in the checkpoint's verl_optimizer/ (DCP)
            from swarm.train.verl_backend import read_optimizer_files

            optimizer = read_optimizer_files(verl.check())
        else:  # a checkpoint written before them: the unsharded state in trainer_state.pt
            optimizer = verl["optimizer"]
    if optimizer is None:
        raise BenchError(f"the checkpoint has no optimizer state (keys: {sorted(trainer_state)})")
    betas = optimizer["param_groups"][0]["betas"]
    return optimizer["state"], (float(betas[0]), float(betas[1]))


def adam_continuity(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Whether ``after``'s AdamW moments are one update on from ``before``'s (module docstring).

    Args:
        before, after: ``trainer_state.pt`` of checkpoints N and N + 1.

    Returns:
        ``continued_rel_err``, ``restarted_rel_err``, ``adam_steps_before``/``after`` (sorted distinct
        counts), ``exp_avg_norm_before``/``after``, ``parameters`` (tensors compared), ``continued``.
    """
    import torch

    state0, (b1, b2) = adam_moments(before)
    state1, _ = adam_moments(after)
    common = [k for k in state1 if k in state0 and "exp_avg" in state1[k]]
    sums = {"cont": 0.0, "rest": 0.0, "cont_ref": 0.0, "rest_ref": 0.0, "m0": 0.0, "m1": 0.0}
    steps0, steps1 = set(), set()
    for key in common:
        m0, v0 = state0[key]["exp_avg"].double(), state0[key]["exp_avg_sq"].double()
        m1, v1 = state1[key]["exp_avg"].double(), state1[key]["exp_avg_sq"].double()
        steps0.add(int(torch.as_tensor(state0[key]["step"]).item()))
        steps1.add(int(torch.as_tensor(state1[key]["step"]).item()))
        for name, (m, v) in (("cont", (m0, v0)), ("rest", (torch.zeros_like(m0), torch.zeros_like(v0)))):
            g_m = (m1 - b1 * m) / (1 - b1)
            g_v = (v1 - b2 * v) / (1 - b2)
            sums[name] += float(((g_m * g_m - g_v) ** 2).sum())
            sums[f"{name}_ref"] += float((g_v * g_v).sum())
        sums["m0"] += float((m0 * m0).sum())
        sums["m1"] += float((m1 * m1).sum())
    if not common:
        raise BenchError("checkpoints N and N + 1 share no AdamW state")
    cont = (sums["cont"] / sums["cont_ref"]) ** 0.5 if sums["cont_ref"] > 0 else float("inf")
    rest = (sums["rest"] / sums["rest_ref"]) ** 0.5 if sums["rest_ref"] > 0 else float("inf")
    return {
        "parameters": len(common),
        "betas": [b1, b2],
        "adam_steps_before": sorted(steps0),
        "adam_steps_after": sorted(steps1),
        "exp_avg_norm_before": sums["m0"] ** 0.5,
        "exp_avg_norm_after": sums["m1"] ** 0.5,
        "continued_rel_err": cont,
        "restarted_rel_err": rest,
        "continued": cont < CONTINUED_MAX_REL_ERR and rest > 100 * cont,
    }


class Server:
    """One ``swarm serve`` of the check, in a session of its own."""

    def __init__(self, argv: list[str], url: str, log_path: Path) -> None:
        self.url, self.log_path = url, log_path
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            argv,
            stdout=log_path.open("ab"),
            stderr=subprocess.STDOUT,
            env={**os.environ, **MULTICAST_OFF},
            start_new_session=True,
        )

    def status_step(self) -> int:
        import httpx

        return int(httpx.get(f"{self.url}/api/v1/status", timeout=30).json()["step"])

    def kill(self) -> None:
        """SIGKILL the server and every process of its session (Ray's raylet and workers may have left
        its tree: own process groups, same session); return once none is left, at most 30 s: GPU memory
        is freed when they are gone, and the next server needs it."""
        kill_leftovers(self.process.pid)
        self.process.wait(30)
        deadline = time.monotonic() + 30
        while _session_alive(self.process.pid) and time.monotonic() < deadline:
            kill_leftovers(self.process.pid)
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM the session, SIGKILL after 20 s; then whatever of it outlived the server."""
        stop(self.process, 20)
        kill_leftovers(self.process.pid)


def _session_alive(session: int) -> bool:
    """Whether a process of ``session`` other than this one runs (zombies, killed but not yet reaped, do
    not count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:  # fields after the command name: state ppid pgrp session ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            return True
    return False


def _wait_for(what: str, done: Any, server: Server, deadline: float, events: Path, cursor: list[int]) -> None:
    """Poll ``done(new_events)`` every second until it is true.

    Raises:
        BenchError: the server exited, a step failed, or ``deadline`` passed.
    """
    while True:
        if server.process.poll() is not None:
            raise BenchError(
                f"the server exited with {server.process.returncode}: {last_line(server.log_path)}"
            )
        fresh = new_events(events, cursor)
        for ev in fresh:
            if ev["kind"] in ("train.failed", "checkpoint.failed"):
                raise BenchError(f"{ev['kind']}: {ev['message'][:300]}")
        if done(fresh):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"--budget reached waiting for {what}; server: {last_line(server.log_path)}")
        time.sleep(1)


def _saved(step: int, found: dict[int, dict[str, Any]]) -> Any:
    """A ``_wait_for`` test: step ``step``'s ``checkpoint.saved`` event has come (kept in ``found``)."""

    def done(fresh: list[dict[str, Any]]) -> bool:
        for ev in fresh:
            if ev["kind"] == "checkpoint.saved":
                found[int(ev["data"]["step"])] = ev["data"]
        return step in found

    return done


def resume_check(a: dict[str, Any]) -> dict[str, Any]:
    """Run the check (module docstring) with ``multi_gpu.py``'s arguments ``a``; returns the result."""
    import httpx
    import torch

    from swarm.train.state_files import resolve_state_files

    n = a["steps"]
    a = {**a, "checkpoint_every": 1}
    deadline = START + a["budget"]
    work = Path(tempfile.mkdtemp(prefix="swarm-resume-check-", dir=a["work_dir"]))
    logs = Path(a["json_out"]).parent if a["json_out"] is not None else work
    server_log = logs / "resume_check_server.log"
    run_dir = work / "run"
    events = run_dir / "events.jsonl"
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in a.items()},
        "complete": False,
        "where": "building the model",
        "logs": [str(server_log)],
    }
    saved: dict[int, dict[str, Any]] = {}
    cursor = [0]
    server: Server | None = None
    clients: subprocess.Popen[bytes] | None = None
    try:
        log(f"building a random {a['shape']} Qwen2 model in {work / 'model'}")
        result["model"] = build_model(a["shape"], work / "model", a["seed"])
        write_tasks(work / "tasks_1.jsonl", a["groups"] * n, a["completion"])
        write_tasks(work / "tasks_2.jsonl", a["groups"], a["completion"])

        def start(name: str) -> Server:
            port = free_port()
            started = Server(
                serve_argv(a, work / "model", run_dir, port), f"http://127.0.0.1:{port}", server_log
            )
            wait_ready(started.process, started.url, server_log, deadline)
            result[f"{name}_ready_s"] = time.monotonic() - started.started
            log(f"{name} server ready in {result[f'{name}_ready_s']:.1f} s (step {started.status_step()})")
            return started

        result["where"] = "the first server's steps"
        server = start("first")
        clients = subprocess.Popen(
            client_argv(a, server.url, work / "tasks_1.jsonl", work / "clients_1"),
            stdout=(logs / "resume_check_clients.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_for(f"step {n}'s checkpoint", _saved(n, saved), server, deadline, events, cursor)
        result["step_before_kill"] = server.status_step()
        rows_before = httpx.get(f"{server.url}/api/v1/metrics", timeout=30).json()
        stop(clients, 10)
        log(f"step {result['step_before_kill']} checkpointed; SIGKILL to the server and its session")
        server.kill()
        result["where"] = "the restarted server's step"
        server = start("restarted")
        result["step_after_restart"] = server.status_step()
        clients = subprocess.Popen(
            client_argv(a, server.url, work / "tasks_2.jsonl", work / "clients_2"),
            stdout=(logs / "resume_check_clients.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        target = result["step_after_restart"] + 1
        _wait_for(f"step {target}'s checkpoint", _saved(target, saved), server, deadline, events, cursor)
        result["step_final"] = server.status_step()
        rows_after = httpx.get(f"{server.url}/api/v1/metrics", timeout=30).json()
        stop(clients, 10)
        server.stop()
        server = None
        all_events = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
        loaded = [e["data"] for e in all_events if e["kind"] == "checkpoint.loaded"]
        result["rewound_steps"] = [
            e["data"].get("rewound_steps") for e in all_events if e["kind"] == "train.rewound"
        ]
        result["replayed_steps"] = [
            e["data"].get("steps") for e in all_events if e["kind"] == "checkpoint.replayed"
        ]
        result["metrics_steps_after_restart"] = [r["step"] for r in rows_after]
        result["step_counter_continued"] = (
            result["step_before_kill"] == result["step_after_restart"] == n
            and result["step_final"] == n + 1
            and not result["rewound_steps"]
        )
        rows = {r["step"]: r for r in rows_before + rows_after}
        folder = run_dir / "checkpoints"
        result["save"] = [
            {
                "step": step,
                "checkpoint_s": rows[step]["checkpoint_s"] if step in rows else None,
                "write_s": saved[step].get("write_s"),
            }
            for step in sorted(saved)
        ]
        result["checkpoint_bytes"] = {
            p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
            for p in sorted(folder.glob("step-*"))
        }
        result["load"] = loaded
        log("reading AdamW's state from checkpoints N and N + 1")
        result["where"] = "reading the checkpoints"
        states = [
            resolve_state_files(  # verl's optimizer folder: its path in the checkpoint
                torch.load(path / "trainer_state.pt", map_location="cpu", mmap=True, weights_only=False), path
            )
            for path in (folder / f"step-{step:06d}" for step in (n, n + 1))
        ]
        result["adam"] = adam_continuity(*states)
        result["complete"] = True
    except Exception as exc:  # anything: stop the processes, keep what was measured, report it
        result["error"] = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        log(f"stopped: {result['error']}")
    finally:
        stop(clients, 10)
        if server is not None:
            server.stop()
        if not a["keep"]:
            shutil.rmtree(work, ignore_errors=True)
    print_resume(result, n)
    return result


def print_resume(r: dict[str, Any], n: int) -> None:
    """The check's verdicts and times, one line each."""

    def seconds(v: Any) -> str:
        return "n/a" if v is None else f"{v:.2f} s"

    if "step_counter_continued" in r:
        log(
            f"step counter: {r['step_before_kill']} before the kill, {r['step_after_restart']} after the restart, "
            f"{r['step_final']} at the end (expected {n}, {n}, {n + 1}); rewound {r['rewound_steps'] or 'none'}: "
            f"{'PASS' if r['step_counter_continued'] else 'FAIL'}"
        )
    if "adam" in r:
        ad = r["adam"]
        log(
            f"AdamW over {ad['parameters']} tensors: step count {ad['adam_steps_before']} → {ad['adam_steps_after']}, "
            f"|m| {ad['exp_avg_norm_before']:.3g} → {ad['exp_avg_norm_after']:.3g}; moment identity rel. error "
            f"continued {ad['continued_rel_err']:.2e}, restarted {ad['restarted_rel_err']:.2e}: "
            f"{'CONTINUED' if ad['continued'] else 'NOT CONTINUED'}"
        )
    for row in r.get("save", []):
        log(
            f"save step {row['step']}: snapshot {seconds(row['checkpoint_s'])}, write {seconds(row['write_s'])} (background)"
        )
    for row in r.get("load", []):
        log(f"load at restart (step {row.get('step')}): {seconds(row.get('load_s'))}")
    if "restarted_ready_s" in r:
        log(
            f"server start-up: first {seconds(r['first_ready_s'])}, after the restart {seconds(r['restarted_ready_s'])}"
        )
    for name, size in r.get("checkpoint_bytes", {}).items():
        log(f"{name}: {size / 2**30:.2f} GiB")
