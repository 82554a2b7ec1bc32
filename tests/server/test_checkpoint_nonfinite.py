"""A step whose second update has a non-finite gradient is a step (issue 35): it keeps its first update,
is published (policy version, journal entry, engine weights, episodes consumed, metrics row with
``updates_nonfinite``, ``train.nonfinite``), and a kill -9 before its checkpoint is on disk replays it to
the same weights bit for bit (its journal entry caps the replay at the update it applied). A batch
whose first update is non-finite applies nothing and is skipped (``train.skipped``), weights unchanged.

A real ``swarm serve`` child process (`tests.server.slow_checkpoint_serve`: the real server, whose
checkpoint writes wait while a gate file exists, whose steps leave their weights behind, and whose
trainer's first parameter gets a gradient hook making the process's second backward non-finite) trains a
tiny model on CPU with two PPO epochs a step (one micro-batch each: one backward an update).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file

from swarm.client import SwarmClient
from swarm.pool import Pool
from swarm.server.checkpoints import JournalEntry, resume, write_journal
from swarm.server.events import EventLog
from swarm.server.step_history import StepHistory
from swarm.train import TorchTrainer, TrainerConfig
from tests.conftest import build_tiny_model, serve_process, wait_for
from tests.server.test_checkpoint_journal import _batch
from tests.server.test_checkpoint_skip import (
    ADMIN,
    _checkpoints,
    _events,
    _journal,
    _train,
    slow_server_files,
)
from tests.server.test_training import rollout
from tests.train.factories import PAD

pytestmark = pytest.mark.slow


def _serve(
    model_dir: Path, run_dir: Path, port: int, gate: Path, weights: Path, *, nonfinite: int | None
) -> subprocess.Popen[bytes]:
    flags = ["--batch-policy", "episodes", "--batch-size", "1", "--group-size", "2", "--lr", "1e-3"]
    flags += ["--ppo-epochs", "2", "--micro-batch-size", "8", "--admin-token", ADMIN]
    env = {"SWARM_TEST_CHECKPOINT_GATE": str(gate), "SWARM_TEST_WEIGHTS_DIR": str(weights)}
    if nonfinite is not None:
        env["SWARM_TEST_NONFINITE_BACKWARD"] = str(nonfinite)
    return serve_process(
        model_dir, run_dir, port, *flags, module="tests.server.slow_checkpoint_serve", env=env
    )


def _score(url: str) -> tuple[int, list[float]]:
    """The served policy version and its logprobs of a fixed token sequence (``POST /v1/score``)."""
    body = {"token_ids": [5, 6, 7, 8, 9], "start": 1}
    answer = httpx.post(f"{url}/v1/score", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 200, answer.text
    return answer.json()["policy_version"], answer.json()["logprobs"]


def _messages(run_dir: Path, kind: str) -> list[str]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e["message"] for e in map(json.loads, lines) if e["kind"] == kind]


def test_a_step_cut_short_by_a_non_finite_update_is_published_and_replayed(
    tmp_path: Path, embedded_source: Any, tokenizer: Any
) -> None:
    files = slow_server_files(tmp_path, embedded_source, tokenizer)
    model_dir, run_dir, port, gate, first, second = files.parts()
    url = files.url

    gate.touch()  # step 1's checkpoint write waits: only its journal entry is on disk
    proc = _serve(model_dir, run_dir, port, gate, first, nonfinite=2)  # step 1's second update
    try:
        with SwarmClient(url, admin_token=ADMIN) as client:
            a = _train(client, "a", 1, first)
            status, rows = client.status(), client.metrics()
            trained = {client.get_episode(e).trained_step for e in a}
        assert _score(url)[0] == 1  # the engine serves step 1's weights
        assert status.step == 1 and trained == {1}
        assert [(r.step, r.updates, r.updates_nonfinite) for r in rows] == [(1, 1, 1)]
        assert _events(run_dir, "train.nonfinite") == [{"step": 1, "updates": 1, "updates_nonfinite": 1}]
        assert _events(run_dir, "train.skipped") == []
        assert _journal(run_dir) == [1] and _checkpoints(run_dir) == []
        os.kill(proc.pid, signal.SIGKILL)  # before step 1's checkpoint reached the disk
        proc.wait()
        gate.unlink()

        # the restart's replay is its first backward (capped at one update: no hook could stop it), so
        # the next step's first update is its second: non-finite
        proc = _serve(model_dir, run_dir, port, gate, second, nonfinite=2)
        assert _events(run_dir, "checkpoint.replayed")[-1]["steps"] == [1]
        assert _checkpoints(run_dir) == [1] and _journal(run_dir) == []
        saved = load_file(str(run_dir / "checkpoints" / "step-000001" / "model.safetensors"))
        live = torch.load(first / "step-1.pt")
        assert len(saved) > 10
        assert [n for n, v in saved.items() if not torch.equal(v, live[n])] == []  # bit for bit
        with SwarmClient(url, admin_token=ADMIN) as client:
            assert client.status().step == 1
            before = _score(url)
            # a first-update NaN applies nothing: the batch is skipped, the weights stay bit for bit
            b = [rollout(client, "b", 1.0), rollout(client, "b", 0.0)]
            wait_for(lambda: len(_events(run_dir, "train.skipped")) == 1, 60, "the rejected batch")
            assert "nothing was applied" in _messages(run_dir, "train.skipped")[0]
            assert client.status().step == 1 and _score(url) == before
            c = _train(client, "c", 2, second)
            rows = client.metrics()
            groups = {"a": a, "b": b, "c": c}
            trained = {
                name: {client.get_episode(e).trained_step for e in ids} for name, ids in groups.items()
            }
        assert trained == {"a": {1}, "b": {1}, "c": {2}}  # each episode consumed once (b at the served step)
        assert [(r.step, r.updates, r.updates_nonfinite) for r in rows] == [(1, 1, 1), (2, 2, 0)]
        assert all(r.rewound_steps == [] for r in rows)
    finally:
        gate.unlink(missing_ok=True)
        proc.kill()
        proc.wait()


def test_a_replay_writes_the_cut_off_row_of_a_step_cut_short(
    tmp_path: Path, embedded_source: Any, tokenizer: Any
) -> None:
    # a journal entry of a step that applied one of its two updates (max_updates=1) and whose metrics row
    # the kill cut off: the replay makes one update and writes the row as the step was
    run, events = tmp_path / "run", EventLog(None)
    batch = _batch(1)
    config = TrainerConfig(lr=1e-2, ppo_epochs=2, recompute_old_logprobs=True)
    write_journal(run, JournalEntry(1, batch, config.model_dump(), "episodes", max_updates=1))
    trainer = TorchTrainer(build_tiny_model(embedded_source, seed=4), config, pad_token_id=PAD)
    history, pool = StepHistory(run / "metrics.jsonl"), Pool(run / "pool.db")
    try:
        assert resume(run, trainer, pool, history, events, tokenizer=tokenizer, keep=2) == 1
    finally:
        pool.close()
    assert [(r.step, r.updates, r.updates_nonfinite) for r in history.rows] == [(1, 1, 1)]
    alone = TorchTrainer(  # the step made of its first update alone
        build_tiny_model(embedded_source, seed=4),
        config.model_copy(update={"ppo_epochs": 1}),
        pad_token_id=PAD,
    )
    alone.step(batch.samples, batch.advantages)
    for name, value in alone.model.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[name], value), name
