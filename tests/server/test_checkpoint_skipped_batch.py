"""A batch consumed without an update (``train.skipped``) survives a restart: no rewind, consumed once.

A skipped batch (here: a group whose episodes made no call, so it has no trainable token) is no step:
the step counter stays, no metrics row is written, and its episodes are marked consumed at the policy
version being served (``trained_step`` = the last step), which is durable whenever that step is. A real
``swarm serve`` child process at the default checkpoint settings is stopped with SIGTERM right after a
skip, then killed with SIGKILL right after another; each restart must report no rewind, keep the step
counter and leave every episode's ``trained_step`` as it was (issue 35, fresh-user check item 3).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from swarm.client import SwarmClient
from tests.conftest import free_port, serve_process, wait_for
from tests.server.test_training import rollout

pytestmark = pytest.mark.slow

ADMIN = secrets.token_urlsafe(16)  # a fresh admin token per run, never a literal


def _serve(model_dir: Path, run_dir: Path, port: int) -> subprocess.Popen[bytes]:
    flags = ["--batch-policy", "episodes", "--batch-size", "1", "--group-size", "2", "--lr", "1e-3"]
    output = run_dir.parent / "serve.log"  # every start's stdout and stderr, appended
    return serve_process(model_dir, run_dir, port, *flags, "--admin-token", ADMIN, output=output)


def _kinds(run_dir: Path) -> list[str]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line)["kind"] for line in lines if line.strip()]


def _skip(client: SwarmClient, run_dir: Path, task: str) -> list[str]:
    """A group of two episodes without a call (nothing to train): returns their ids once it was skipped."""
    skips = _kinds(run_dir).count("train.skipped")
    ids = []
    for reward in (1.0, 0.0):
        with client.episode(task) as ep:
            ep.finish(reward)
        ids.append(ep.id)
    wait_for(lambda: _kinds(run_dir).count("train.skipped") == skips + 1, 60, "the skipped batch")
    return ids


def _trained(client: SwarmClient, ids: list[str]) -> dict[str, int | None]:
    return {e: client.get_episode(e).trained_step for e in ids}


def test_a_skipped_batch_is_neither_rewound_nor_consumed_twice(tmp_path: Path, tiny_model_dir: Path) -> None:
    model_dir, run_dir, port = tiny_model_dir, tmp_path / "run", free_port()
    url = f"http://127.0.0.1:{port}"
    ids: list[str] = []

    def restart(step: int) -> subprocess.Popen[bytes]:
        """Start the server again; it must be at ``step`` with no rewind and every episode as it was."""
        proc = _serve(model_dir, run_dir, port)
        with SwarmClient(url, admin_token=ADMIN) as client:
            status = client.status()
            assert status.step == step
            assert _trained(client, ids) == before
            assert status.episodes.pending == 0 and status.episodes.trained == len(ids)
            assert [row.step for row in client.metrics()] == list(range(1, step + 1))
        kinds = _kinds(run_dir)
        assert "pool.rewound" not in kinds and "train.rewound" not in kinds, kinds
        return proc

    proc = _serve(model_dir, run_dir, port)
    try:
        with SwarmClient(url, admin_token=ADMIN) as client:
            ids += _skip(client, run_dir, "s0")  # before any step: consumed at policy version 0
            ids += [rollout(client, "a", 1.0), rollout(client, "a", 0.0)]
            wait_for(lambda: client.status().step == 1, 60, "step 1")
            ids += _skip(client, run_dir, "s1")  # consumed at policy version 1, no step 2
            before = _trained(client, ids)
            assert client.status().step == 1 and len(client.metrics()) == 1
        assert list(before.values()) == [0, 0, 1, 1, 1, 1]

        # a normal stop right after the skip
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) in (0, -signal.SIGTERM)
        proc = restart(1)

        # a kill -9 right after a skip that follows a step (its checkpoint may still be in flight)
        with SwarmClient(url, admin_token=ADMIN) as client:
            ids += [rollout(client, "b", 1.0), rollout(client, "b", 0.0)]
            wait_for(lambda: client.status().step == 2, 60, "step 2")
            ids += _skip(client, run_dir, "s2")
            before = _trained(client, ids)
        assert list(before.values())[-4:] == [2, 2, 2, 2]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = restart(2)

        # training goes on at step 3, and no row was ever rewound
        with SwarmClient(url, admin_token=ADMIN) as client:
            ids += [rollout(client, "c", 1.0), rollout(client, "c", 0.0)]
            wait_for(lambda: client.status().step == 3, 60, "step 3")
            assert list(_trained(client, ids).values()) == [*before.values(), 3, 3]
            rows, status = client.metrics(), client.status()
        assert [row.step for row in rows] == [1, 2, 3] and all(row.rewound_steps == [] for row in rows)
        assert status.episodes.pending == 0 and status.episodes.trained == len(ids)
        # the log says the default interval and holds no progress bar of the per-step checkpoints
        log = (tmp_path / "serve.log").read_text()
        assert log.count("checkpoint every step") == 3, log
        assert "Writing model shards" not in log, log
    finally:
        proc.kill()
        proc.wait()
