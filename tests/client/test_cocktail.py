"""Cocktail: two clients of different task families feed one training server; its quotas set the mix.

The count client runs 4x the concurrency of the math client, so without quotas count would fill most
of the batch; with quotas math 0.75 / count 0.25 (slack = G) the first trained batch must hold
0.75 * B * G math episodes within one group (issue 5 item 4;
docs/ARCHITECTURE.md §Batch policies and quotas).
"""

from __future__ import annotations

import asyncio
import copy
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from swarm.batch import BatchConfig, BatchPolicy, FamilyQuotas
from swarm.cli import app
from swarm.client import LLM, AsyncSwarmClient, Runner, RunnerConfig, TaskSet
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from tests.conftest import make_server

G = 2
B = 8
SHARES = {"math": 0.75, "count": 0.25}


async def _agent(task: dict[str, Any], llm: LLM) -> float:
    async with llm.openai(max_retries=0) as client:
        await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], max_tokens=3
        )
    return random.random()  # every group has signal, so no group is dropped as zero-variance


def _tasks(family: str) -> TaskSet:
    return TaskSet(lambda: ({"id": f"{family}-{i}", "q": f"{family} question {i}"} for i in range(200)))


def test_quotas_set_the_trained_mix(tmp_path: Path, tiny_model: Any, tokenizer: Any) -> None:
    engine = HFEngine(copy.deepcopy(tiny_model), tokenizer, "tiny-cocktail")  # training changes weights
    training = TrainingConfig(
        batch=BatchConfig(policy=BatchPolicy.TASKS, batch_size=B, group_size=G),
        quotas=FamilyQuotas(shares=SHARES, slack=G, retry_after_s=0.3),
        drain_timeout_s=10.0,
    )
    live = make_server(tmp_path, engine, training=training)
    stop = threading.Event()
    errors: list[BaseException] = []

    async def clients() -> None:
        pairs = []
        for family, concurrency in (("math", 2), ("count", 8)):
            client = AsyncSwarmClient(live.url, client_id=f"cocktail-{family}", retry=Runner.default_retry())
            config = RunnerConfig(
                group_size=G, concurrency=concurrency, family=family, client_id=client.client_id
            )
            pairs.append(
                (client, Runner(_agent, {"default": client}, _tasks(family), config, show_progress=False))
            )
        running = asyncio.gather(*(runner.run() for _, runner in pairs))
        stopped = asyncio.ensure_future(asyncio.to_thread(stop.wait))
        await asyncio.wait([running, stopped], return_when=asyncio.FIRST_COMPLETED)
        running.cancel()  # the runners abort their open episodes (infra failures) and return
        try:
            await running
        except asyncio.CancelledError:
            pass
        finally:
            for client, _ in pairs:
                await client.aclose()

    def drive() -> None:
        try:
            asyncio.run(clients())
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=drive)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while live.runtime.step < 1:
            assert not errors, errors
            assert thread.is_alive() and time.monotonic() < deadline, "no training step happened"
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(timeout=60)
        trained = [e for e in live.runtime.pool.recent(100_000) if e.trained_step == 1]
        frame = CliRunner().invoke(app, ["top", live.url, "--once"]).output
        live.stop()
        engine.close()
    assert not errors, errors
    families = Counter(e.family for e in trained)
    assert sum(families.values()) == B * G, families
    groups = Counter((e.family, e.task_id) for e in trained)
    assert set(groups.values()) == {G}  # whole groups only
    # swarm top shows the step and its reward mean from GET /api/v1/metrics
    assert "policy step" in frame and "reward mean per step" in frame
    assert "steps)" in frame and "no training step yet" not in frame, frame
    expected_math = SHARES["math"] * B * G
    assert abs(families["math"] - expected_math) <= G, families
    assert abs(families["count"] - SHARES["count"] * B * G) <= G, families


def test_a_family_the_quotas_do_not_list_stops_the_run(
    tmp_path: Path, tiny_model: Any, tokenizer: Any
) -> None:
    from swarm.client import RunnerError, run_workflow

    engine = HFEngine(copy.deepcopy(tiny_model), tokenizer, "tiny-cocktail")
    training = TrainingConfig(quotas=FamilyQuotas(shares=SHARES, slack=G))
    live = make_server(tmp_path, engine, training=training)
    try:
        try:
            run_workflow(_agent, live.url, _tasks("code"), family="code", max_tasks=1, show_progress=False)
        except RunnerError as exc:
            message = str(exc)
        else:
            raise AssertionError("the server admitted a family its quotas do not list")
    finally:
        live.stop()
        engine.close()
    assert "refused a new episode" in message and "422" in message and "'code'" in message
