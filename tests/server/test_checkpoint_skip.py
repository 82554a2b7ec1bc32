"""A step never waits for a checkpoint write (issue 35): while a write is in flight, steps are journaled and
their snapshots skipped; a kill -9 in the middle of the write replays them to the uninterrupted weights; a
normal stop makes the newest state durable.

A real ``swarm serve`` child process (`tests.server.slow_checkpoint_serve`: the real server, whose
`save_checkpoint` waits while a gate file exists and whose steps leave their weights behind) trains a tiny
model on CPU at the default checkpoint settings (every step, in the background).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from swarm.client import SwarmClient
from tests.conftest import build_tiny_model, free_port, serve_process, wait_for
from tests.server.test_training import rollout

pytestmark = pytest.mark.slow

ADMIN = secrets.token_urlsafe(16)  # a fresh admin token per run, never a literal
STEP_CHECKPOINT_S = 0.5
"""Ceiling of a skipped step's synchronous checkpoint cost (its journal entry: a few kB), seconds."""


def _serve(model_dir: Path, run_dir: Path, port: int, gate: Path, weights: Path) -> subprocess.Popen[bytes]:
    flags = ["--batch-policy", "episodes", "--batch-size", "1", "--group-size", "2", "--lr", "1e-3"]
    env = {"SWARM_TEST_CHECKPOINT_GATE": str(gate), "SWARM_TEST_WEIGHTS_DIR": str(weights)}
    return serve_process(
        model_dir,
        run_dir,
        port,
        *flags,
        "--admin-token",
        ADMIN,
        module="tests.server.slow_checkpoint_serve",
        env=env,
    )


def _journal(run_dir: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints" / "journal").glob("step-*.pt"))


def _checkpoints(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "meta.json").exists())


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e["data"] for e in map(json.loads, lines) if e["kind"] == kind]


def _train(client: SwarmClient, task: str, step: int, weights: Path) -> list[str]:
    """One group of two rollouts of ``task``: step ``step`` trains it; returns its episode ids once the
    step's weights are dumped."""
    ids = [rollout(client, task, 1.0), rollout(client, task, 0.0)]
    wait_for(lambda: (weights / f"step-{step}.pt").exists(), 120, f"step {step}")
    return ids


def _assert_same_weights(checkpoint: Path, expected: Path) -> None:
    saved, live = load_file(str(checkpoint / "model.safetensors")), torch.load(expected)
    assert saved.keys() <= live.keys() and len(saved) > 10
    for name, value in saved.items():
        torch.testing.assert_close(value, live[name], msg=name)


@dataclass(frozen=True)
class SlowServerFiles:
    """What a test of the instrumented server (`tests.server.slow_checkpoint_serve`) works with: a tiny
    model, a run dir, a port, the gate file that holds checkpoint writes, and one folder of per-step
    weights for each of the two server processes."""

    model_dir: Path
    run_dir: Path
    port: int
    gate: Path
    first: Path
    second: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def parts(self) -> tuple[Path, Path, int, Path, Path, Path]:
        """``(model_dir, run_dir, port, gate, first, second)``."""
        return self.model_dir, self.run_dir, self.port, self.gate, self.first, self.second


def slow_server_files(tmp_path: Path, embedded_source: Any, tokenizer: Any) -> SlowServerFiles:
    """Save the tiny model and make the folders a slow-checkpoint test needs under ``tmp_path``."""
    model_dir = tmp_path / "tiny"
    build_tiny_model(embedded_source, seed=3).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    files = SlowServerFiles(
        model_dir,
        tmp_path / "run",
        free_port(),
        tmp_path / "gate",
        tmp_path / "weights-first",
        tmp_path / "weights-second",
    )
    files.first.mkdir()
    files.second.mkdir()
    return files


def test_steps_during_a_write_skip_the_snapshot_and_a_kill_replays_them(
    tmp_path: Path, embedded_source: Any, tokenizer: Any
) -> None:
    files = slow_server_files(tmp_path, embedded_source, tokenizer)
    model_dir, run_dir, port, gate, first, second = files.parts()
    url = files.url
    groups: dict[str, list[str]] = {}

    gate.touch()  # step 1's checkpoint write starts and waits: in flight for steps 2-4
    proc = _serve(model_dir, run_dir, port, gate, first)
    try:
        with SwarmClient(url, admin_token=ADMIN) as client:
            for step, task in enumerate("abcd", start=1):
                groups[task] = _train(client, task, step, first)
            rows = client.metrics()
        # no step waited for the write: steps 2-4 only journaled (step 1 snapshotted), all published
        assert [row.step for row in rows] == [1, 2, 3, 4]
        assert all(row.checkpoint_s < STEP_CHECKPOINT_S for row in rows[1:]), [r.checkpoint_s for r in rows]
        assert _journal(run_dir) == [1, 2, 3, 4] and _checkpoints(run_dir) == []
        os.kill(proc.pid, signal.SIGKILL)  # in the middle of step 1's write
        proc.wait()
        gate.unlink()

        proc = _serve(model_dir, run_dir, port, gate, second)
        # the restart replayed steps 1-4 from the journal: the step counter did not go back, and the
        # weights are the killed process's after step 4
        assert _events(run_dir, "checkpoint.replayed")[-1]["steps"] == [1, 2, 3, 4]
        assert _checkpoints(run_dir) == [4] and _journal(run_dir) == []
        # the checkpoint written after the replay is logged like any other (it had no event)
        assert [(e["step"], e.get("replay")) for e in _events(run_dir, "checkpoint.saved")] == [(4, True)]
        _assert_same_weights(run_dir / "checkpoints" / "step-000004", first / "step-4.pt")
        with SwarmClient(url, admin_token=ADMIN) as client:
            assert client.status().step == 4
            assert [row.step for row in client.metrics()] == [1, 2, 3, 4]
            # a normal stop with a write in flight and step 6's snapshot skipped: it finishes the write
            # and writes step 6
            gate.touch()  # (checkpoint 4 was written before the server answered)
            groups["e"] = _train(client, "e", 5, second)
            assert _journal(run_dir) == [5]  # step 5 snapshotted: its write waits at the gate
            groups["f"] = _train(client, "f", 6, second)
            assert _journal(run_dir) == [5, 6] and _checkpoints(run_dir) == [4]
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None  # waiting for the write in flight
        gate.unlink()
        assert proc.wait(timeout=120) in (0, -signal.SIGTERM)  # uvicorn re-raises it after the shutdown
        assert _checkpoints(run_dir)[-1] == 6 and _journal(run_dir) == []
        saved = _events(run_dir, "checkpoint.saved")[-1]  # the stop's synchronous write
        assert saved["step"] == 6 and saved["skipped"] == [6]
        _assert_same_weights(run_dir / "checkpoints" / "step-000006", second / "step-6.pt")

        # a restart loads checkpoint 6, replays nothing, and every task trained exactly once
        proc = _serve(model_dir, run_dir, port, gate, second)
        with SwarmClient(url, admin_token=ADMIN) as client:
            assert client.status().step == 6
            groups["g"] = _train(client, "g", 7, second)
            trained = {
                task: {client.get_episode(e).trained_step for e in ids} for task, ids in groups.items()
            }
            status, rows = client.status(), client.metrics()
        assert trained == {task: {step} for step, task in enumerate("abcdefg", start=1)}
        assert status.episodes.pending == 0 and status.episodes.trained == 2 * len(groups)
        assert [row.step for row in rows] == list(range(1, 8))
        assert all(row.rewound_steps == [] for row in rows)
        assert _events(run_dir, "checkpoint.replayed") == [{"steps": [1, 2, 3, 4]}]
    finally:
        gate.unlink(missing_ok=True)
        proc.kill()
        proc.wait()
