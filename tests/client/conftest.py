"""Client-side fixtures: a tiny-model server of our own, workflow files written on the fly, pool reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.pool import StoredEpisode
from tests.conftest import LiveServer, make_server

NO_TRAINING = TrainingConfig(enabled=False)
"""Client tests serve and record only: a training step would change the shared tiny model's weights."""


@pytest.fixture(scope="session")
def client_server(tmp_path_factory: pytest.TempPathFactory, tiny_engine: HFEngine) -> Iterator[LiveServer]:
    """A tiny-model server for the client tests (episodes are told apart by client id)."""
    live = make_server(tmp_path_factory.mktemp("client-server"), tiny_engine, training=NO_TRAINING)
    yield live
    live.stop()


def swarm_run(args: list[str]) -> subprocess.Popen[str]:
    """``swarm run ARGS`` as a real child process (stdout and stderr together, text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "swarm.cli", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def write_workflow(folder: Path, code: str, name: str = "workflow.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(code), encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def episodes_of(server: LiveServer, client_id: str) -> list[StoredEpisode]:
    """Ended episodes of one client on ``server`` (oldest first)."""
    found = [e for e in server.runtime.pool.recent(100_000) if e.client_id == client_id]
    return sorted(found, key=lambda e: e.seq)


CHAT_WORKFLOW = """
    from swarm.client import Result

    async def run(task, llm):
        client = llm.openai(max_retries=0)
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=4
        )
        text = reply.choices[0].message.content or ""
        return Result(reward=float(task["value"]), metrics={"chars": float(len(text))})
"""
"""A real agent: one chat call (4 tokens), reward = the task's ``value`` field."""


@pytest.fixture(scope="session")
def second_server(tmp_path_factory: pytest.TempPathFactory, tiny_engine: HFEngine) -> Iterator[LiveServer]:
    """Another tiny-model server (multi-model episodes span two servers)."""
    live = make_server(tmp_path_factory.mktemp("second-server"), tiny_engine, training=NO_TRAINING)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def embedded_client_server(
    tmp_path_factory: pytest.TempPathFactory, embedded: HFEngine
) -> Iterator[LiveServer]:
    """A server on the real embedded SmolLM2-135M-Instruct (training off: the model is shared)."""
    live = make_server(tmp_path_factory.mktemp("embedded-client"), embedded, training=NO_TRAINING)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def embedded_second_server(
    tmp_path_factory: pytest.TempPathFactory, embedded: HFEngine
) -> Iterator[LiveServer]:
    """A second embedded-model server (the two-model example's executor)."""
    live = make_server(tmp_path_factory.mktemp("embedded-second"), embedded, training=NO_TRAINING)
    yield live
    live.stop()
