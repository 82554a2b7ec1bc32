"""On-policy distillation against a real teacher server on loopback (issue 38).

The teacher is a second swarm server over a tiny model of the embedded architecture with other weights
(seed 7, training off); the student is a training server over another (seed 1) with ``--teacher``. Both
use the real SmolLM2 tokenizer, so the tokenizer check passes; a mismatch is shown with a local stand-in
speaking vLLM's wire format.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI

from swarm.batch import BatchConfig, BatchPolicy
from swarm.client import SwarmClient
from swarm.config import DistillConfig, TrainingConfig
from swarm.engine import HFEngine
from swarm.train import TrainerConfig
from tests.conftest import LiveServer, build_tiny_model, make_server, wait_for

QUESTION = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def teacher_model(embedded_source: Any) -> Any:
    return build_tiny_model(embedded_source, seed=7)


@pytest.fixture(scope="module")
def teacher(
    tmp_path_factory: pytest.TempPathFactory, teacher_model: Any, tokenizer: Any
) -> Iterator[LiveServer]:
    engine = HFEngine(teacher_model, tokenizer, "tiny-teacher")
    live = make_server(tmp_path_factory.mktemp("teacher"), engine, training=TrainingConfig(enabled=False))
    yield live
    live.stop()
    engine.close()


@pytest.fixture()
def student_engine(embedded_source: Any, tokenizer: Any) -> Iterator[HFEngine]:
    engine = HFEngine(build_tiny_model(embedded_source, seed=1), tokenizer, "tiny-student")
    yield engine
    engine.close()


def forward_logprobs(model: Any, token_ids: list[int], start: int) -> list[float]:
    """The teacher's own forward pass: log p(token_ids[i] | token_ids[:i]) for i in [start, len)."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[i - 1, token_ids[i]]) for i in range(start, len(token_ids))]


def distill_config(teacher_url: str, **kw: Any) -> TrainingConfig:
    return TrainingConfig(
        batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=1, group_size=2),
        trainer=TrainerConfig(lr=1e-3),
        distill=DistillConfig(teacher_url=teacher_url, **kw),
    )


def rollout(client: SwarmClient, task_id: str, reward: float) -> str:
    with client.episode(task_id) as ep:
        OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
            model=ep.model, messages=QUESTION, max_tokens=5, temperature=1.0
        )
        ep.finish(reward)
    return ep.id


def test_score_route_equals_the_teachers_own_forward_pass(teacher: LiveServer, teacher_model: Any) -> None:
    ids = [1, 504, 3458, 314, 260, 1789, 30, 2]
    answer = httpx.post(f"{teacher.url}/v1/score", json={"token_ids": ids, "start": 3}).json()
    expected = forward_logprobs(teacher_model, ids, 3)
    assert answer["policy_version"] == 0 and len(answer["logprobs"]) == len(ids) - 3
    assert answer["logprobs"] == pytest.approx(expected, abs=1e-5)
    bad = httpx.post(f"{teacher.url}/v1/score", json={"token_ids": ids, "start": 0})
    assert bad.status_code == 422  # start >= 1: position 0 has no context
    out = httpx.post(f"{teacher.url}/v1/score", json={"token_ids": ids, "start": 9})
    assert out.status_code == 400 and "start" in out.json()["error"]["message"]


def test_pure_distillation_trains_on_the_hand_computed_reverse_kl(
    tmp_path: Path, teacher: LiveServer, teacher_model: Any, student_engine: HFEngine
) -> None:
    live = make_server(tmp_path, student_engine, training=distill_config(teacher.url))
    try:
        with SwarmClient(live.url) as client:
            ids = [rollout(client, "t1", 1.0), rollout(client, "t1", 0.0)]
            wait_for(lambda: client.status().step == 1, what="step 1")
            views = [client.get_episode(i) for i in ids]
        row = httpx.get(f"{live.url}/api/v1/metrics").json()[0]
    finally:
        live.stop()
    kl_advantages: list[float] = []
    for view in views:
        assert view.trained_step == 1
        for call in view.calls:
            full = [*call.prompt_ids, *call.completion_ids]
            expected = forward_logprobs(teacher_model, full, len(call.prompt_ids))
            assert call.teacher_logprobs == pytest.approx(expected, abs=1e-5)  # stored with the record
        for sample in view.samples:
            assert sample.teacher_logprobs is not None
            for t, trained in enumerate(sample.loss_mask):
                if trained:
                    kl_advantages.append(sample.teacher_logprobs[t] - sample.behaviour_logprobs[t])
                else:
                    assert sample.teacher_logprobs[t] is None
    assert kl_advantages
    # pure: the per-token advantages the trainer got are the reverse-KL ones (not the GRPO ±1)
    assert row["adv_mean"] == pytest.approx(sum(kl_advantages) / len(kl_advantages), abs=1e-6)
    assert row["adv_min"] == pytest.approx(min(kl_advantages), abs=1e-6)
    distill = row["distill"]
    assert distill["teacher_kl"] == pytest.approx(-sum(kl_advantages) / len(kl_advantages), abs=1e-6)
    assert distill["teacher_kl/default"] == pytest.approx(distill["teacher_kl"])
    assert distill["scored_frac"] == 1.0 and distill["unscored_episodes"] == 0
    assert distill["teacher_latency_s"] > 0


def episode_kl_advantages(view: Any) -> list[float]:
    """teacher − behaviour logprob at every trained token of an episode's samples."""
    out = []
    for sample in view.samples:
        for t, trained in enumerate(sample.loss_mask):
            if trained:
                out.append(sample.teacher_logprobs[t] - sample.behaviour_logprobs[t])
    return out


def test_mixed_distillation_adds_the_live_coefficient_times_the_reverse_kl(
    tmp_path: Path, teacher: LiveServer, student_engine: HFEngine
) -> None:
    live = make_server(tmp_path, student_engine, training=distill_config(teacher.url, mode="mixed", coef=0.5))
    try:
        changed = httpx.patch(f"{live.url}/api/v1/config", json={"distill_coef": 2.0})
        assert changed.status_code == 200, changed.text
        assert changed.json()["config"]["training"]["distill"]["coef"] == 2.0
        refused = httpx.patch(f"{live.url}/api/v1/config", json={"distill_coef": -1.0})
        assert refused.status_code == 422
        with SwarmClient(live.url) as client:
            ids = [rollout(client, "t1", 1.0), rollout(client, "t1", 0.0)]
            wait_for(lambda: client.status().step == 1, what="step 1")
            views = [client.get_episode(i) for i in ids]
        row = httpx.get(f"{live.url}/api/v1/metrics").json()[0]
    finally:
        live.stop()
    # GRPO advantages of rewards (1, 0) in one group: ±0.5 / (0.5 + 1e-6)
    task = {ids[0]: 0.5 / (0.5 + 1e-6), ids[1]: -0.5 / (0.5 + 1e-6)}
    per_token = [task[v.episode_id] + 2.0 * a for v in views for a in episode_kl_advantages(v)]
    assert row["adv_mean"] == pytest.approx(sum(per_token) / len(per_token), abs=1e-5)
    assert row["adv_max"] == pytest.approx(max(per_token), abs=1e-5)


def test_a_server_without_a_teacher_refuses_distill_coef(tmp_path: Path, student_engine: HFEngine) -> None:
    live = make_server(tmp_path, student_engine, training=TrainingConfig())
    try:
        refused = httpx.patch(f"{live.url}/api/v1/config", json={"distill_coef": 2.0})
    finally:
        live.stop()
    assert refused.status_code == 422 and "--teacher" in refused.json()["error"]["message"]


def test_a_teacher_outage_keeps_unscored_episodes_pooled_until_the_teacher_is_back(
    tmp_path: Path, teacher_model: Any, tokenizer: Any, student_engine: HFEngine
) -> None:
    teacher_engine = HFEngine(teacher_model, tokenizer, "tiny-teacher")
    down = make_server(tmp_path / "teacher", teacher_engine, training=TrainingConfig(enabled=False))
    config = distill_config(down.url, wait_s=3.0, retry_after_s=0.5, attempts=2, timeout_s=2.0)
    live = make_server(tmp_path / "student", student_engine, training=config)
    try:
        with SwarmClient(live.url) as client:
            first = rollout(client, "t1", 1.0)
            wait_for(lambda: all(c.teacher_logprobs for c in client.get_episode(first).calls), what="scored")
            down.stop()  # the teacher goes away
            second = rollout(client, "t1", 0.0)
            wait_for(lambda: client.status().step == 1, what="step 1 (on the scored episode only)")
            assert client.get_episode(first).trained_step == 1
            assert client.get_episode(second).trained_step is None  # left out, still pooled
            assert all(c.teacher_logprobs is None for c in client.get_episode(second).calls)
            row = httpx.get(f"{live.url}/api/v1/metrics").json()[0]
            assert row["episodes"] == 1 and row["distill"]["unscored_episodes"] == 1
            assert 0 < row["distill"]["scored_frac"] < 1
            events = (tmp_path / "student" / "run" / "events.jsonl").read_text()
            assert "distill.unscored" in events and second in events
            down.start()  # the teacher is back (same port): the pooled episode is scored and trained
            third = rollout(client, "t1", 0.5)
            wait_for(lambda: client.status().step == 2, what="step 2")
            assert (
                client.get_episode(second).trained_step == 2 and client.get_episode(third).trained_step == 2
            )
            row = httpx.get(f"{live.url}/api/v1/metrics").json()[1]
            assert row["episodes"] == 2 and row["distill"]["unscored_episodes"] == 0
            assert row["distill"]["scored_frac"] == 1.0
    finally:
        live.stop()
        if down._server is not None and not down._server.should_exit:
            down.stop()
        teacher_engine.close()
