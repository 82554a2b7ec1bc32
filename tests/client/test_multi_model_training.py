"""Non-shared multi-model training: two tiny models on two training servers, one per werewolves team.

One ``run_workflow`` drives the werewolves template with ``llm`` = {"werewolves": A, "village": B}: every
game is one multi-server episode (a member on each server, finished atomically), each seat calls its
team's server, and each server trains its own model on its own agents only. The villager is recorded on
B but not trained (not in ``trainable_agents``), so B's loss covers exactly the seer, witch and hunter.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from swarm.batch import BatchConfig
from swarm.client import SwarmClient, load_workflow, run_workflow
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.protocol import BatchPolicy
from templates import render
from tests.client.conftest import episodes_of
from tests.conftest import LiveServer, build_tiny_model, make_server, wait_for

TEAMS = {"werewolves": {"werewolf_1"}, "village": {"seer_1", "witch_1", "hunter_1", "villager_1"}}
ADMIN = secrets.token_urlsafe(16)
TRAINED = ["werewolf_1", "seer_1", "witch_1", "hunter_1"]


@pytest.fixture
def team_servers(tmp_path: Path, embedded_source: Any, tokenizer: Any) -> Iterator[dict[str, LiveServer]]:
    """Two training servers, each over its own fresh tiny model (different seeds: non-shared parameters)."""
    training = TrainingConfig(batch=BatchConfig(policy=BatchPolicy.TASKS, batch_size=1, group_size=2))
    engines, servers = [], {}
    for seed, team in enumerate(TEAMS, start=10):
        engine = HFEngine(build_tiny_model(embedded_source, seed=seed), tokenizer, f"tiny-{team}")
        engines.append(engine)
        servers[team] = make_server(tmp_path / team, engine, training=training, admin_token=SecretStr(ADMIN))
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()
        for engine in engines:
            engine.close()


def test_two_models_train_together_each_on_its_own_agents(
    team_servers: dict[str, LiveServer], tmp_path: Path
) -> None:
    params = {
        "n_tasks": 1,
        "max_days": 1,
        "train_roles": "all",
        "speak_max_tokens": 6,
        "action_max_tokens": 4,
    }
    rendered = render("werewolves", params, tmp_path / "wolves")
    summary = run_workflow(
        load_workflow(str(rendered.workflow)),
        {team: server.url for team, server in team_servers.items()},
        rendered.folder / "tasks.jsonl",
        group_size=2,
        concurrency=2,
        trainable_agents=TRAINED,
        client_id="teams",
        show_progress=False,
    )
    assert summary.finished == 2 and summary.infra_failures == summary.agent_failures == 0

    for team, server in team_servers.items():
        with SwarmClient(server.url, admin_token=ADMIN) as client:  # reads episodes it did not begin
            wait_for(lambda client=client: client.status().step >= 1, 120, f"a step on the {team} server")
            (step,) = client.metrics()
            episodes = episodes_of(server, "teams")
            assert len(episodes) == 2 and {e.trained_step for e in episodes} == {1}
            loss_tokens = 0
            for episode in episodes:
                view = client.get_episode(episode.id)
                assert {c.agent for c in view.calls} <= TEAMS[team]  # the other team never calls this model
                assert set(episode.agent_rewards) == TEAMS[team]
                for sample in view.samples:
                    masked = sum(sample.loss_mask)
                    if sample.agent == "villager_1":
                        assert masked == 0  # recorded as context, not trained
                    loss_tokens += masked
                assert {s.agent for s in view.samples if any(s.loss_mask)} == TEAMS[team] - {"villager_1"}
        # the trainer's loss covered exactly those tokens: this server's own trained agents, nobody else's
        assert step.episodes == 2 and step.tokens == loss_tokens > 0
