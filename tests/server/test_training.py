"""Training in the server: live weight updates, metrics, live config, drain, and crash-safe resume."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from swarm.batch import BatchConfig, BatchPolicy
from swarm.client import SwarmClient
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.train import TrainerConfig
from tests.conftest import build_tiny_model, free_port, make_server, serve_process, wait_for

QUESTION = [{"role": "user", "content": "Say something."}]


def probe(client: SwarmClient) -> tuple[str, float]:
    """Greedy first token and its logprob for a fixed prompt, in an eval episode (never trained)."""
    with client.episode("probe", kind="eval") as ep:
        r = OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
            model=ep.model, messages=QUESTION, max_tokens=1, temperature=0, logprobs=True
        )
        ep.finish(0.0)
    token = r.choices[0].logprobs.content[0]
    return token.token, token.logprob


KEYS: dict[str, str] = {}
"""Episode keys by episode id, for reading an episode from a later client (a restarted server's)."""


def rollout(client: SwarmClient, task_id: str, reward: float, max_tokens: int = 6) -> str:
    with client.episode(task_id) as ep:
        KEYS[ep.id] = ep.api_key
        OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
            model=ep.model, messages=QUESTION, max_tokens=max_tokens, temperature=1.0
        )
        ep.finish(reward)
    return ep.id


def training_config(lr: float, **kw: Any) -> TrainingConfig:
    return TrainingConfig(
        batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=1, group_size=2),
        trainer=TrainerConfig(lr=lr),
        **{"checkpoint_every": 1, **kw},
    )


@pytest.fixture()
def fresh_engine(embedded_source: Any, tokenizer: Any) -> Any:
    engine = HFEngine(build_tiny_model(embedded_source, seed=1), tokenizer, "tiny-trainable")
    yield engine
    engine.close()


@pytest.mark.parametrize("lr", [1e-2, 0.0])
def test_a_step_updates_the_weights_generation_uses(tmp_path: Path, fresh_engine: Any, lr: float) -> None:
    live = make_server(tmp_path, fresh_engine, training=training_config(lr))
    try:
        with SwarmClient(live.url) as client:
            token_before, lp_before = probe(client)
            ids = [rollout(client, "t1", 1.0), rollout(client, "t1", 0.0)]
            wait_for(lambda: client.status().step == 1, what="step 1")
            token_after, lp_after = probe(client)
            assert all(client.get_episode(i).trained_step == 1 for i in ids)
            metrics = httpx.get(f"{live.url}/api/v1/metrics").json()
        if lr > 0:
            assert (token_after, lp_after) != (token_before, lp_before)
        else:
            assert (token_after, lp_after) == (token_before, lp_before)
        (m,) = metrics
        assert m["step"] == 1 and m["episodes"] == 2 and m["reward_mean"] == 0.5 and m["tokens"] > 0
        assert m["lr"] == lr and m["groups"] == 1
        run = tmp_path / "run"
        assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
        checkpoint = run / "checkpoints" / "step-000001" / "model.safetensors"
        wait_for(checkpoint.exists, what="checkpoint 1, written in the background")
        assert "train.step" in (run / "events.jsonl").read_text()
    finally:
        live.stop()


def _call(episode: Any) -> None:
    OpenAI(base_url=episode.base_url, api_key=episode.api_key).chat.completions.create(
        model=episode.model, messages=QUESTION, max_tokens=3, temperature=1.0
    )


def _asynchronous_server(tmp_path: Path, engine: Any, *, max_staleness: int) -> Any:
    """A server training one GRPO group of 2 per step (`tasks`, B = 1, G = 2), asynchronously."""
    config = training_config(1e-3, max_staleness=max_staleness)
    config.batch = BatchConfig(policy=BatchPolicy.TASKS, batch_size=1, group_size=2)
    return make_server(tmp_path, engine, training=config)


def test_asynchronous_mode_trains_without_draining_and_bounds_staleness(
    tmp_path: Path, fresh_engine: Any
) -> None:
    """K = 1, one group of 2 per step: open episodes survive one step, not two; finished ones wait."""
    live = _asynchronous_server(tmp_path, fresh_engine, max_staleness=1)
    try:
        with SwarmClient(live.url) as client:

            def step(task_id: str, n: int) -> None:
                rollout(client, task_id, 1.0)
                rollout(client, task_id, 0.0)
                wait_for(lambda: client.status().step == n, 60, f"step {n}")

            straggler = client.begin("slow")
            _call(straggler)  # sampled by policy 0, stays open
            lone = rollout(client, "lone", 1.0)  # finished at policy 0; its group never completes
            step("a", 1)
            assert client.get_episode(straggler.id).status == "open"  # no drain: it kept running
            step("b", 2)  # step 2 updates policy 1: a call of policy 0 would be 2 stale -> aborted
            view = client.get_episode(straggler.id)
            assert view.status == "infra_failure" and "too stale" in (view.reason or "")
            rollout(client, "lone", 0.0)  # completes the group: a finished episode is never dropped
            wait_for(lambda: client.status().step == 3, 60, "step 3")
            assert client.get_episode(lone).trained_step == 3  # staleness 2: it waited for its group

            late = client.begin("d")
            _call(late)  # policy 3
            step("e", 4)
            _call(late)  # policy 4: the episode spans two policy versions
            late.finish(1.0)
            rollout(client, "d", 0.0)
            wait_for(lambda: client.status().step == 5, 60, "step 5")
            assert [c.policy_version for c in client.get_episode(late.id).calls] == [3, 4]
            admitted = client.begin("admitted-while-training-is-allowed")
            admitted.abort()
        metrics = httpx.get(f"{live.url}/api/v1/metrics").json()
        assert [m["drain_s"] for m in metrics] == [0.0] * 5
        assert [m["stale_aborted"] for m in metrics] == [0, 1, 0, 0, 0]
        assert [m["drain_aborted"] for m in metrics] == [0] * 5
        assert [m["staleness_max"] for m in metrics] == [0, 0, 2, 0, 1]
        assert [m["staleness_mean"] for m in metrics] == [0.0, 0.0, 1.0, 0.0, 0.5]
        changed = httpx.patch(f"{live.url}/api/v1/config", json={"max_staleness": 0})
        assert changed.status_code == 200 and changed.json()["changed"] == {"max_staleness": 0}
        unset = httpx.patch(f"{live.url}/api/v1/config", json={"max_staleness": None, "lr": 0.5})
        assert unset.status_code == 422 and unset.json()["error"]["param"] == "max_staleness"
        assert "restart without --max-staleness" in unset.json()["error"]["message"]
        config = httpx.get(f"{live.url}/api/v1/config").json()["training"]
        assert config["max_staleness"] == 0 and config["trainer"]["lr"] == 1e-3  # nothing was applied
    finally:
        live.stop()


def test_asynchronous_admission_keeps_rollouts_at_most_k_steps_ahead(
    tmp_path: Path, fresh_engine: Any
) -> None:
    """K = 0, B = 1, G = 2: (K+1)·B·G = 2 train episodes ahead of the trainer, but a begun group completes."""
    live = _asynchronous_server(tmp_path, fresh_engine, max_staleness=0)
    url = f"{live.url}/api/v1/episodes"
    try:
        with SwarmClient(live.url) as client:
            x1, y1 = client.begin("x"), client.begin("y")
            refused = httpx.post(url, json={"task_id": "z"})
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
            assert "2 train episodes are ahead of the trainer" in refused.json()["error"]["message"]
            evals = httpx.post(url, json={"task_id": "z", "kind": "eval"})  # eval episodes are never held
            assert evals.status_code == 201
            x2, y2 = client.begin("x"), client.begin("y")  # begun groups may complete
            assert httpx.post(url, json={"task_id": "x"}).status_code == 503  # group x is full
            for episode in (x1, x2):
                _call(episode)
                episode.finish(1.0 if episode is x1 else 0.0)
            wait_for(lambda: client.status().step == 1, 60, "step 1")
            assert httpx.post(url, json={"task_id": "z"}).status_code == 503  # y is still ahead
            for episode in (y1, y2):
                _call(episode)
                episode.finish(0.5 if episode is y1 else 0.0)
            wait_for(lambda: client.status().step == 2, 60, "step 2")
            z = client.begin("z")
            z.abort("done", infra_failure=True)
            client.begin("w").abort("done")  # the infra failure gave its place back
            counts = client.status().episodes
            assert (counts.pending, counts.trained, counts.infra_failure) == (1, 4, 1)
    finally:
        live.stop()


def test_a_synchronous_server_cannot_be_made_asynchronous_live(tmp_path: Path, fresh_engine: Any) -> None:
    live = make_server(tmp_path, fresh_engine, training=training_config(1e-3))
    try:
        answer = httpx.patch(f"{live.url}/api/v1/config", json={"max_staleness": 1})
        assert answer.status_code == 422
        assert "--max-staleness" in answer.json()["error"]["message"]
        assert answer.json()["error"]["param"] == "max_staleness"
    finally:
        live.stop()


def test_live_config_pause_resume_and_drain(tmp_path: Path, fresh_engine: Any) -> None:
    config = training_config(1e-3, drain_timeout_s=1.0)
    config.batch = BatchConfig(policy=BatchPolicy.EPISODES, batch_size=1, group_size=1)
    live = make_server(tmp_path, fresh_engine, training=config)
    url = live.url
    try:
        bad = httpx.patch(f"{url}/api/v1/config", json={"lr": -1})
        assert bad.status_code == 422 and "lr" in bad.json()["error"]["message"]
        bad = httpx.patch(f"{url}/api/v1/config", json={"quotas": {"math": 0.5}})
        assert bad.status_code == 422 and "sum to 1" in bad.json()["error"]["message"]
        bad = httpx.patch(f"{url}/api/v1/config", json={"loss_agg": "token_mean"})
        assert bad.status_code == 422 and "loss_weighting" in bad.json()["error"]["message"]
        before = httpx.get(f"{url}/api/v1/config").json()
        for body, param in [
            ('{"lr": 1e400}', "lr"),  # JSON's 1e400 is an infinite float
            ('{"kl_coef": 1e400}', "kl_coef"),
            ('{"max_grad_norm": NaN}', "max_grad_norm"),
            ('{"lr": true}', "lr"),
            ('{"batch_size": "4"}', "batch_size"),
            ('{"quotas": {"math": 0.5}}', "quotas"),
            ('{"temperature": 3}', "temperature"),
            ('{"group_size": 1, "batch_policy": "tasks"}', "batch_policy"),
        ]:
            bad = httpx.patch(
                f"{url}/api/v1/config", content=body, headers={"content-type": "application/json"}
            )
            error = bad.json()["error"]
            assert bad.status_code == 422 and error["param"] == param, (body, error)
            assert "\n" not in error["message"] and "pydantic.dev" not in error["message"], error
        assert httpx.get(f"{url}/api/v1/config").json() == before  # nothing was applied
        ok = httpx.patch(f"{url}/api/v1/config", json={"lr": 5e-4, "temperature": 0.7, "clip_eps_high": 0.28})
        assert ok.status_code == 200, ok.text
        cfg = httpx.get(f"{url}/api/v1/config").json()
        assert cfg["training"]["trainer"]["lr"] == 5e-4 and cfg["sampling"]["temperature"] == 0.7
        assert cfg["training"]["trainer"]["temperature"] == 1.0  # the recorded logprobs' temperature
        greedy = httpx.patch(f"{url}/api/v1/config", json={"temperature": 0})
        assert greedy.status_code == 200 and greedy.json()["config"]["sampling"]["temperature"] == 0
        httpx.patch(f"{url}/api/v1/config", json={"temperature": 0.7})
        assert httpx.post(f"{url}/api/v1/pause").json()["state"] == "paused"
        refused = httpx.post(f"{url}/api/v1/episodes", json={"task_id": "x"})
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert httpx.post(f"{url}/api/v1/resume").json()["state"] == "rolling"

        with SwarmClient(url) as client:
            straggler = client.begin("slow")  # stays open while a batch becomes ready
            rollout(client, "fast", 1.0)
            wait_for(lambda: client.status().state.value == "draining", 10, "draining")
            during = httpx.post(f"{url}/api/v1/episodes", json={"task_id": "late"})
            assert during.status_code == 503
            wait_for(lambda: client.status().step == 1, 30, "step 1")
            view = client.get_episode(straggler.id)
            assert view.status == "infra_failure" and "drain" in (view.reason or "")
            gone = httpx.post(
                f"{straggler.base_url}/chat/completions",
                json={"model": straggler.model, "messages": QUESTION},
                headers={"Authorization": f"Bearer {straggler.api_key}"},
            )
            assert gone.status_code == 403  # an ended episode's key is a wrong credential
        metrics = httpx.get(f"{url}/api/v1/metrics").json()
        assert metrics[0]["lr"] == 5e-4 and metrics[0]["drain_aborted"] == 1
        events = httpx.get(f"{url}/api/v1/events?follow=false").text
        assert "config.changed" in events and "server.paused" in events
    finally:
        live.stop()


def _serve(model_dir: Path, run_dir: Path, port: int) -> subprocess.Popen[bytes]:
    flags = ["--batch-policy", "episodes", "--batch-size", "1", "--group-size", "2", "--lr", "1e-3"]
    return serve_process(model_dir, run_dir, port, *flags, "--checkpoint-every", "1", "--drain-timeout", "5")


def test_kill_9_while_rolling_and_while_training_loses_nothing(
    tmp_path: Path, embedded_source: Any, tokenizer: Any
) -> None:
    model_dir = tmp_path / "tiny"
    build_tiny_model(embedded_source, seed=2).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    run_dir, port = tmp_path / "run", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(model_dir, run_dir, port)
    try:
        with SwarmClient(url) as client:
            first = [rollout(client, "a", 1.0), rollout(client, "a", 0.0)]
            wait_for(lambda: client.status().step == 1, 60, "step 1")
            third = rollout(client, "b", 1.0)
        os.kill(proc.pid, signal.SIGKILL)  # while rolling: one finished episode pending
        proc.wait()
        proc = _serve(model_dir, run_dir, port)
        with SwarmClient(url) as client:
            status = client.status()
            assert status.step == 1 and status.episodes.finished == 3 and status.episodes.pending == 1
            # make the next step slow enough to kill the server in the middle of it
            assert httpx.patch(f"{url}/api/v1/config", json={"ppo_epochs": 400}).status_code == 200
            fourth = rollout(client, "b", 0.0)
            wait_for(lambda: client.status().state.value == "training", 60, "training state")
        os.kill(proc.pid, signal.SIGKILL)  # while training step 2
        proc.wait()
        proc = _serve(model_dir, run_dir, port)
        with SwarmClient(url) as client:
            status = client.status()
            # resumed from checkpoint 1; the two episodes of the lost step 2 are pending again, and the
            # server may already be retraining them (then the pool counts them before the step shows)
            assert status.step in (1, 2) and status.episodes.finished == 4
            assert status.episodes.pending + status.episodes.trained == 4 and status.episodes.trained >= 2
            wait_for(lambda: client.status().step == 2, 60, "step 2 after restart")
            trained = {
                eid: client.get_episode(eid, api_key=KEYS[eid]).trained_step
                for eid in [*first, third, fourth]
            }
        assert trained == {first[0]: 1, first[1]: 1, third: 2, fourth: 2}  # each trained exactly once
        steps = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
        assert len(steps) == 2
    finally:
        proc.kill()
        proc.wait()


def test_a_rewind_is_an_event_and_a_metrics_row(tmp_path: Path, fresh_engine: Any) -> None:
    """A server that stops between checkpoints redoes the lost steps: it says so in an event and in the
    first metrics row after the restart, so no step number is reused silently."""
    live = make_server(tmp_path, fresh_engine, training=training_config(1e-3, checkpoint_every=3))
    try:
        with SwarmClient(live.url) as client:
            for task in ("a", "b"):
                rollout(client, task, 1.0)
                rollout(client, task, 0.0)
            wait_for(lambda: client.status().step == 2, what="step 2")
        live.restart()  # no checkpoint yet: steps 1 and 2 die with the process
        with SwarmClient(live.url) as client:
            events = [e for e in client.events() if e.kind == "train.rewound"]
            assert len(events) == 1 and events[0].data == {"rewound_steps": [1, 2], "resumed_from": 0}
            assert "steps 1-2 were lost" in events[0].message and events[0].level == "warning"
            wait_for(lambda: client.status().step == 2, what="steps 1 and 2 redone")
            rows = client.metrics()
        assert [(m.step, m.rewound_steps) for m in rows] == [(1, [1, 2]), (2, [])]
    finally:
        live.stop()


def test_every_server_checkpoints_every_step_unless_told_otherwise() -> None:
    from swarm.serve_options import ServeOptions

    assert TrainingConfig(trainer=TrainerConfig(lora={"r": 4})).checkpoint_every == 1
    assert TrainingConfig().checkpoint_every == 1
    assert TrainingConfig(trainer=TrainerConfig(lora={"r": 4}), checkpoint_every=4).checkpoint_every == 4
    assert ServeOptions(lora_rank=8).to_server_config().training.checkpoint_every == 1
    assert ServeOptions().to_server_config().training.checkpoint_every == 1
    assert ServeOptions(lora_rank=8, checkpoint_every=3).to_server_config().training.checkpoint_every == 3


def test_status_counts_are_two_partitions_that_overlap(tmp_path: Path, fresh_engine: Any) -> None:
    """``/api/v1/status`` counts episodes by status and, apart, train episodes by training: an aborted
    train episode trains too, so ``trained`` exceeds ``finished`` here (2 > 1, as a fresh user saw 6 > 5);
    ``pending + trained`` is the finished and aborted train episodes, eval ones in neither. The document
    says so."""
    live = make_server(tmp_path, fresh_engine, training=training_config(1e-3))
    try:
        with SwarmClient(live.url) as client:
            rollout(client, "g", 1.0)
            with client.episode("g") as ep:  # the group's other rollout, aborted by its client
                OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
                    model=ep.model, messages=QUESTION, max_tokens=4
                )
                ep.abort("gave up")
            with client.episode("e", kind="eval") as ev:
                ev.finish(1.0)
            wait_for(lambda: client.status().episodes.trained == 2, 120, "the step")
            counts = client.status().episodes
        assert (counts.open, counts.finished, counts.aborted, counts.infra_failure) == (0, 2, 1, 0)
        assert (counts.pending, counts.trained) == (0, 2)  # the aborted one trained; the eval one did not
        schema = httpx.get(f"{live.url}/openapi.json").json()["components"]["schemas"]["EpisodeCounts"]
        assert "Two partitions" in schema["description"]
        assert "not of all episodes" in schema["properties"]["trained"]["description"]
    finally:
        live.stop()
