"""The typed control contract against a real training server with an admin token: metrics rows,
events, the config view and patch answer, checkpoints, and the admin check the router declares once."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from swarm.batch import BatchConfig, BatchPolicy
from swarm.client import AsyncSwarmClient, SwarmClient
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.errors import ClientError
from swarm.protocol import (
    CheckpointSaved,
    ConfigChanged,
    ConfigView,
    EngineState,
    Event,
    ServerStepMetrics,
)
from swarm.train import TrainerConfig
from tests.conftest import LiveServer, make_server, wait_for

TOKEN = "control-test-token"


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Any, tokenizer: Any
) -> Iterator[LiveServer]:
    """A server (own copy of the tiny model, admin token) that trained one step on a group of two."""
    engine = HFEngine(copy.deepcopy(tiny_model), tokenizer, "tiny-control")
    training = TrainingConfig(
        batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=1, group_size=2),
        trainer=TrainerConfig(lr=1e-4),
        checkpoint_every=100,
    )
    live = make_server(
        tmp_path_factory.mktemp("control"), engine, training=training, admin_token=SecretStr(TOKEN)
    )
    try:
        with SwarmClient(live.url, admin_token=TOKEN) as client:
            for reward in (1.0, 0.0):
                with client.episode("t-1") as ep:
                    httpx.post(
                        f"{ep.base_url}/chat/completions",
                        json={
                            "model": ep.model,
                            "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 3,
                        },
                        headers={"Authorization": f"Bearer {ep.api_key}"},
                        timeout=60,
                    ).raise_for_status()
                    ep.finish(reward)
            wait_for(lambda: client.status().step == 1, timeout_s=120, what="the first training step")
        yield live
    finally:
        live.stop()
        engine.close()


def test_metrics_are_typed_rows(trained: LiveServer) -> None:
    with SwarmClient(trained.url, admin_token=TOKEN) as client:
        rows = client.metrics()
        assert [type(row) for row in rows] == [ServerStepMetrics]
        assert rows[0].step == 1 and rows[0].reward_mean == 0.5 and rows[0].groups == 1
        assert rows[0].batch_policy == "episodes" and rows[0].samples >= 1
        assert client.metrics(since_step=1) == []


def test_events_are_typed_and_resume_after_a_seq(trained: LiveServer) -> None:
    with SwarmClient(trained.url, admin_token=TOKEN) as client:
        events = client.events()
        assert events and all(isinstance(e, Event) for e in events)
        assert [e.seq for e in events] == sorted(e.seq for e in events)
        kinds = [e.kind for e in events]
        assert kinds.count("episode.finished") == 2 and "train.step" in kinds
        step = next(e for e in events if e.kind == "train.step")
        assert step.data["step"] == 1
        assert client.events(since=events[-1].seq) == []
        assert [e.seq for e in client.events(since=events[-2].seq)] == [events[-1].seq]


def test_config_patch_and_checkpoint_answers_are_typed(trained: LiveServer) -> None:
    with SwarmClient(trained.url, admin_token=TOKEN) as client:
        view = client.config()
        assert isinstance(view, ConfigView) and view.training["batch"]["group_size"] == 2
        changed = client.patch_config(temperature=0.5, max_tokens=12)
        assert isinstance(changed, ConfigChanged) and changed.changed == {
            "temperature": 0.5,
            "max_tokens": 12,
        }
        assert changed.config.sampling.temperature == 0.5 and client.config().sampling.max_tokens == 12
        with pytest.raises(ClientError) as bad:
            client.patch_config(lr=-1.0)
        assert bad.value.status_code == 422 and "lr" in str(bad.value)
        saved = client.checkpoint()
        assert isinstance(saved, CheckpointSaved) and saved.step == 1 and saved.path.endswith("step-000001")
        # No update since: a second request neither writes nor logs the same step again.
        assert client.checkpoint().path == saved.path
        logged = [e for e in client.events() if e.kind == "checkpoint.saved" and e.data.get("step") == 1]
        assert len(logged) == 1


async def test_async_client_mirrors_the_typed_answers(trained: LiveServer) -> None:
    async with AsyncSwarmClient(trained.url, admin_token=TOKEN) as client:
        assert [m.step for m in await client.metrics()] == [1]
        assert any(e.kind == "train.step" for e in await client.events())
        assert (await client.config()).training["batch"]["batch_size"] == 1
        assert (await client.patch_config(top_p=0.9)).changed == {"top_p": 0.9}
        assert (await client.checkpoint()).step == 1


def test_every_control_route_needs_the_admin_token(trained: LiveServer) -> None:
    with SwarmClient(trained.url, admin_token="wrong") as client:
        calls = [client.status, client.metrics, client.events, client.config, client.checkpoint]
        for call in calls:
            with pytest.raises(ClientError) as refused:
                call()
            assert refused.value.status_code == 401, call
        with pytest.raises(ClientError):
            client.patch_config(lr=0.1)
    for method, path in [("POST", "/api/v1/pause"), ("POST", "/api/v1/resume")]:
        assert httpx.request(method, trained.url + path).status_code == 401
    with SwarmClient(trained.url, admin_token=TOKEN) as client:
        assert client.status().state is not EngineState.PAUSED


def test_the_openapi_schema_is_the_contract(trained: LiveServer) -> None:
    paths = httpx.get(f"{trained.url}/openapi.json").json()["paths"]

    def answer(path: str, method: str) -> Any:
        return paths[path][method]["responses"]["200"]["content"]["application/json"]["schema"]

    assert answer("/api/v1/metrics", "get")["items"]["$ref"].endswith("/ServerStepMetrics")
    assert answer("/api/v1/config", "get")["$ref"].endswith("/ConfigView")
    assert answer("/api/v1/config", "patch")["$ref"].endswith("/ConfigChanged")
    assert answer("/api/v1/checkpoint", "post")["$ref"].endswith("/CheckpointSaved")
    assert answer("/api/v1/clients/{client_id}/ready", "post")["$ref"].endswith("/VoteCast")
    assert "401" in paths["/api/v1/status"]["get"]["responses"]
