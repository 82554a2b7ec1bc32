"""Every template, rendered with short settings, runs whole episodes against a real swarm server.

Plumbing runs on the shared loopback server over the tiny random model (``server`` fixture: fast, and
its garbage output exercises the robust parsing); the signal check runs the arithmetic template on
the real embedded SmolLM2-135M (``embedded_server``). Episodes are ``eval`` so the shared servers do
not train on them.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from swarm.client import AsyncSwarmClient
from templates import render


def load_workflow(folder: Path) -> Any:
    """Load ``workflow.py`` by path, as a runner does (a top-level module, no package)."""
    spec = importlib.util.spec_from_file_location(f"workflow_{folder.name}", folder / "workflow.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def run_episodes(url: str, folder: Path, n: int) -> list[tuple[dict[str, Any], Any, Any]]:
    """Run the first ``n`` tasks of a rendered template; returns (task, result, episode view) triples."""
    workflow = load_workflow(folder)
    tasks = [json.loads(line) for line in (folder / "tasks.jsonl").read_text().splitlines()][:n]
    out = []
    async with AsyncSwarmClient(url) as client:
        for task in tasks:
            agents = workflow.trainable_agents(task) if hasattr(workflow, "trainable_agents") else None
            async with client.episode(task["id"], kind="eval", trainable_agents=agents) as ep:
                result = await workflow.run(task, ep.llm)
                await ep.finish(result)
            out.append((task, result, await client.get_episode(ep.id)))
    return out


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("arithmetic", {"n_tasks": 3, "max_tokens": 6}),
        ("math", {"dataset": "gsm8k", "limit": 2, "max_tokens": 12}),
        ("countdown", {"n_tasks": 2, "max_tokens": 12}),
    ],
)
async def test_single_turn_templates_run_episodes(
    server: Any, tmp_path: Path, name: str, params: dict
) -> None:
    rendered = render(name, params, tmp_path / name)
    episodes = await run_episodes(server.url, rendered.folder, 3)
    assert len(episodes) == min(3, len(rendered.tasks.read_text().splitlines()))
    for task, result, view in episodes:
        assert view.status == "finished" and view.task_id == task["id"]
        assert view.reward == result.reward and 0.0 <= result.reward <= 1.0
        assert set(result.metrics) >= {"correct", "format_ok", "completion_chars"}
        (call,) = view.calls
        assert call.sampling.get("max_tokens", params["max_tokens"]) == params["max_tokens"]
        assert len(call.completion_ids) <= params["max_tokens"]
        assert result.metrics["completion_chars"] == len(call.text)


async def test_who_is_the_spy_runs_a_game_with_named_agents(server: Any, tmp_path: Path) -> None:
    params = {
        "n_players": 3,
        "max_rounds": 2,
        "train_roles": "spy",
        "n_tasks": 1,
        "describe_max_tokens": 8,
        "vote_max_tokens": 4,
        "leak_penalty": 0.0,  # a broken reward: the metric below still scores the default weights
    }
    rendered = render("who_is_the_spy", params, tmp_path / "spy")
    episodes = await run_episodes(server.url, rendered.folder, 1)
    for task, result, view in episodes:
        names = {"spy_1", "civilian_1", "civilian_2"}
        assert set(result.agent_rewards) == names == {call.agent for call in view.calls}
        assert view.agent_rewards == result.agent_rewards
        (spy,) = task["trainable_agents"]
        assert spy == "spy_1"
        assert result.reward == result.agent_rewards[spy]
        assert all(call.trainable == (call.agent == spy) for call in view.calls)
        rounds = int(result.metrics["rounds"])
        assert 1 <= rounds <= 2
        # the reward under the default weights: the spy's leaks (it describes every round of a
        # 3-player game) cost 0.5 each there and nothing here
        leaks = result.metrics["leak_rate"] * rounds
        expected = max(-1.0, result.reward - 0.5 * leaks)
        assert result.metrics["default_weights_reward"] == pytest.approx(expected)
        # every living player describes and votes each round (at most 3 players x 2 calls x rounds)
        assert 6 <= len(view.calls) <= 6 * rounds
        # the spy's history is append-only: all its calls chain into one sample (only trainable agents
        # give samples); the others' calls are recorded but not trained
        (sample,) = view.samples
        assert sample.agent == spy
        assert sample.calls == [c.index for c in view.calls if c.agent == spy]
        assert view.merge.splice_mismatches == 0


@pytest.mark.slow
async def test_embedded_model_gets_reward_on_the_easiest_arithmetic_level(
    embedded_server: Any, tmp_path: Path
) -> None:
    """Measured with the real SmolLM2-135M (greedy, 16 level-1 tasks, 3-shot prompt): the easiest
    level must give GRPO a signal. At temperature 1, 64 tasks gave a mean reward of 0.16."""
    rendered = render(
        "arithmetic", {"level": 1, "n_tasks": 16, "temperature": 0.0, "max_tokens": 8}, tmp_path / "a"
    )
    episodes = await run_episodes(embedded_server.url, rendered.folder, 16)
    rewards = [result.reward for _, result, _ in episodes]
    assert 0.0 < sum(rewards) / len(rewards) < 1.0


async def test_who_is_the_spy_untrained_players_can_use_another_endpoint(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Civilians are served by an opponent endpoint (here a second episode, keyed via an env var NAME)."""
    async with AsyncSwarmClient(server.url) as client:
        async with client.episode("opponent", kind="eval") as opponent:
            monkeypatch.setenv("SPY_TEST_OPPONENT_KEY", opponent.api_key)
            params = {
                "n_players": 3,
                "max_rounds": 1,
                "train_roles": "spy",
                "n_tasks": 1,
                "describe_max_tokens": 6,
                "vote_max_tokens": 4,
                "opponent_base_url": opponent.base_url,
                "opponent_api_key_env": "SPY_TEST_OPPONENT_KEY",
            }
            rendered = render("who_is_the_spy", params, tmp_path / "spy")
            ((task, result, view),) = await run_episodes(server.url, rendered.folder, 1)
            await opponent.finish(0.0)
        opponent_view = await client.get_episode(opponent.id)
    (spy,) = task["trainable_agents"]
    assert {c.agent for c in view.calls} == {spy}
    assert {c.agent for c in opponent_view.calls} == set(result.agent_rewards) - {spy}
    assert opponent.api_key not in rendered.workflow.read_text()
