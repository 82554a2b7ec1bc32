"""kill -9 at the default checkpoint settings: the step counter never goes back and every task trains once.

A real ``swarm serve`` child process (default checkpoint settings: every step, written in the background;
only the model, run dir and a small batch are chosen) is killed with SIGKILL right after a step's metrics
row appears, and while a step's checkpoint is being written; each restart must continue from the last
published step (replaying it from the journal when its checkpoint was not on disk yet), never redo one.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.client import SwarmClient
from tests.conftest import build_tiny_model, free_port, serve_process, wait_for
from tests.server.test_training import rollout

pytestmark = pytest.mark.slow


ADMIN = secrets.token_urlsafe(16)  # a fresh admin token per run, never a literal
"""Reads the episodes back after restarts (issue 35: an episode answers only to its key or the admin)."""


def _serve(model_dir: Path, run_dir: Path, port: int) -> subprocess.Popen[bytes]:
    flags = ["--batch-policy", "episodes", "--batch-size", "1", "--group-size", "2", "--lr", "1e-3"]
    flags += ["--admin-token", ADMIN]
    return serve_process(model_dir, run_dir, port, *flags)


def _rows(url: str) -> list[int]:
    return [
        row["step"]
        for row in httpx.get(
            f"{url}/api/v1/metrics", timeout=5, headers={"Authorization": f"Bearer {ADMIN}"}
        ).json()
    ]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _writing(run_dir: Path, step: int) -> bool:
    """Step ``step``'s checkpoint is being written: its journal entry exists and its folder does not."""
    root = run_dir / "checkpoints"
    journaled = (root / "journal" / f"step-{step:06d}.pt").exists()
    return journaled and not (root / f"step-{step:06d}" / "meta.json").exists()


def _stop_while_writing(proc: subprocess.Popen[bytes], run_dir: Path, step: int, timeout_s: float) -> bool:
    """Freeze the server (SIGSTOP) the moment step ``step``'s checkpoint write shows on disk; True when
    it was frozen inside that write (else the write ended first), then kill it."""
    tmp_prefix = f".step-{step:06d}."
    deadline = time.monotonic() + timeout_s
    root = run_dir / "checkpoints"
    while time.monotonic() < deadline:
        if root.exists() and any(p.name.startswith(tmp_prefix) for p in root.iterdir()):
            os.kill(proc.pid, signal.SIGSTOP)
            break
        if (root / f"step-{step:06d}" / "meta.json").exists():
            break
        time.sleep(0.0005)
    inside = _writing(run_dir, step)
    _kill(proc)
    return inside


def test_kill_9_never_moves_the_step_counter_back(
    tmp_path: Path, embedded_source: Any, tokenizer: Any
) -> None:
    model_dir = tmp_path / "tiny"
    build_tiny_model(embedded_source, seed=3).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    run_dir, port = tmp_path / "run", free_port()
    url = f"http://127.0.0.1:{port}"
    groups: dict[str, list[str]] = {}
    published = 0  # the highest step a client has seen

    def restart() -> subprocess.Popen[bytes]:
        proc = _serve(model_dir, run_dir, port)
        with SwarmClient(url, admin_token=ADMIN) as client:
            step = client.status().step
        assert step >= published, f"the step counter went back from {published} to {step}"
        assert _rows(url) == list(range(1, step + 1))
        return proc

    proc = _serve(model_dir, run_dir, port)
    try:
        # 1. killed right after step 1's metrics row appears
        with SwarmClient(url, admin_token=ADMIN) as client:
            groups["a"] = [rollout(client, "a", 1.0), rollout(client, "a", 0.0)]
        wait_for(lambda: _rows(url) == [1], 60, "step 1's metrics row")
        _kill(proc)
        published = 1
        proc = restart()

        # 2. killed while a step's checkpoint is being written (retried on the next step if the write
        #    was faster than the poll)
        caught, task = False, 0
        while not caught and task < 6:
            name, step = f"t{task}", published + 1
            with SwarmClient(url, admin_token=ADMIN) as client:
                groups[name] = [rollout(client, name, 1.0), rollout(client, name, 0.0)]
            caught = _stop_while_writing(proc, run_dir, step, 60)
            published = max(published, _step_on_disk(run_dir))
            proc = restart()
            with SwarmClient(
                url, admin_token=ADMIN
            ) as client:  # journaled (or checkpointed): the step survived the kill
                assert client.status().step == step
            published = step
            task += 1
        assert caught, "no kill landed inside a checkpoint write"

        # 3. killed while rolling, then one more step to see the server trains on
        with SwarmClient(url, admin_token=ADMIN) as client:
            groups["z"] = [rollout(client, "z", 1.0)]
        _kill(proc)
        proc = restart()
        with SwarmClient(url, admin_token=ADMIN) as client:
            groups["z"].append(rollout(client, "z", 0.0))
            wait_for(lambda: client.status().step == published + 1, 60, "the last step")
            trained = {
                task: {client.get_episode(e).trained_step for e in ids} for task, ids in groups.items()
            }
            status = client.status()
            rows = client.metrics()
        # every task trained once, by one step, each step by one task; nothing was ever rewound
        assert sorted(s for steps in trained.values() for s in steps) == list(range(1, len(groups) + 1))
        assert all(len(steps) == 1 for steps in trained.values()), trained
        assert status.episodes.pending == 0 and status.episodes.trained == 2 * len(groups)
        assert [row.step for row in rows] == list(range(1, len(groups) + 1))
        assert all(row.rewound_steps == [] for row in rows)
    finally:
        proc.kill()
        proc.wait()


def _step_on_disk(run_dir: Path) -> int:
    """The newest step whose metrics row was written (a kill after it published the step)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return len([line for line in lines if line.strip()])
