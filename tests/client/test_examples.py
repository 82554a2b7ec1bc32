"""Every example runs: as a workflow through the runner and as a script, against servers on the real
embedded model (short completions); the cocktail example trains, so it gets a private tiny model."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from swarm.batch import BatchConfig, FamilyQuotas
from swarm.client import load_workflow, run_workflow
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.protocol import EpisodeStatus
from tests.client.conftest import episodes_of
from tests.conftest import make_server, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SHORT = 4
"""Completion tokens per example call in CI."""


@pytest.fixture
def short_completions(monkeypatch: pytest.MonkeyPatch) -> None:
    if str(EXAMPLES) not in sys.path:
        monkeypatch.syspath_prepend(str(EXAMPLES))
    import math_common

    monkeypatch.setattr(math_common, "MAX_TOKENS", SHORT)


def _script(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _one_task(server: Any, name: str, client_id: str) -> Any:
    """Run example ``name`` as a workflow on the first math task, one episode; its run summary."""
    return run_workflow(
        load_workflow(EXAMPLES / f"{name}.py"),
        server.url,
        EXAMPLES / "data" / "math.jsonl",
        max_tasks=1,
        group_size=1,
        client_id=client_id,
        show_progress=False,
    )


@pytest.mark.parametrize("name", ["math_openai", "math_langchain", "math_http", "math_agentscope"])
def test_math_example_as_workflow(name: str, embedded_client_server, short_completions: None) -> None:
    client_server = embedded_client_server
    summary = _one_task(client_server, name, f"example-{name}")
    assert (summary.finished, summary.agent_failures, summary.infra_failures) == (1, 0, 0)
    episodes = episodes_of(client_server, f"example-{name}")
    assert [e.task_id for e in episodes] == ["math-000"]
    assert all(e.metrics.keys() == {"has_number", "chars"} for e in episodes)
    calls = client_server.runtime.pool.get(episodes[0].id)[1]
    assert len(calls) == 1 and len(calls[0].completion_ids) <= SHORT


@pytest.mark.parametrize(
    "name", ["math_openai.py", "math_langchain.py", "math_http.py", "math_agentscope.py"]
)
def test_math_example_as_script(name: str, embedded_client_server) -> None:
    client_server = embedded_client_server
    out = _script(
        name, "--server", client_server.url, "--tasks", "1", "--group-size", "1", "--max-tokens", "2"
    )
    assert "finished=1 agent_failures=0 infra_failures=0" in out
    assert len(episodes_of(client_server, name.removesuffix(".py"))) == 1


def test_two_models_example(embedded_client_server, embedded_second_server, short_completions: None) -> None:
    client_server, second_server = embedded_client_server, embedded_second_server
    summary = run_workflow(
        load_workflow(EXAMPLES / "two_models.py"),
        {"planner": client_server.url, "executor": second_server.url},
        EXAMPLES / "data" / "math.jsonl",
        max_tasks=1,
        group_size=1,
        client_id="example-two",
        show_progress=False,
    )
    assert summary.finished == 1
    for server in (client_server, second_server):
        assert [e.status for e in episodes_of(server, "example-two")] == [EpisodeStatus.FINISHED]
    assert all("plan_chars" in e.metrics for e in episodes_of(client_server, "example-two"))
    out = _script(
        "two_models.py",
        "--planner",
        client_server.url,
        "--executor",
        second_server.url,
        "--tasks",
        "1",
        "--group-size",
        "1",
        "--max-tokens",
        "2",
    )
    assert "finished=1" in out


def test_cocktail_example(tmp_path: Path, tiny_model: Any, tokenizer: Any) -> None:
    engine = HFEngine(copy.deepcopy(tiny_model), tokenizer, "tiny-cocktail-example")
    live = make_server(tmp_path, engine, training=TrainingConfig(quotas=FamilyQuotas(shares={"x": 1.0})))
    try:
        out = _script(
            "cocktail.py", "--server", live.url, "--tasks", "2", "--group-size", "2", "--max-tokens", "2"
        )
        assert "math: finished=4" in out and "count: finished=4" in out
        assert live.runtime.training.config.quotas.shares == {"math": 0.75, "count": 0.25}
        families = Counter(
            e.family for e in live.runtime.pool.recent(1000) if e.status is EpisodeStatus.FINISHED
        )
    finally:
        live.stop()
        engine.close()
    assert families == {"math": 4, "count": 4}


def test_anthropic_tool_loop_example_is_trained_by_swarm_run(
    tmp_path: Path, tiny_model: Any, tokenizer: Any, short_completions: None
) -> None:
    """``swarm run`` rolls the Anthropic-SDK example out against a training server: its /v1/messages calls
    are recorded, merged and trained (one GRPO step of 2 tasks x 2 episodes)."""
    from math_anthropic import calculate

    assert (calculate("(2 + 3) * 4"), calculate("7 / 2"), calculate("__import__('os')")[:6]) == (
        "20",
        "3.5",
        "error:",
    )
    engine = HFEngine(copy.deepcopy(tiny_model), tokenizer, "tiny-anthropic-example")
    batch = BatchConfig(batch_size=2, group_size=2)
    live = make_server(tmp_path, engine, training=TrainingConfig(batch=batch))
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "swarm.cli",
                "run",
                str(EXAMPLES / "math_anthropic.py"),
                "--server",
                live.url,
                "--dataset",
                str(EXAMPLES / "data" / "math.jsonl"),
                "--max-tasks",
                "2",
                "--group-size",
                "2",
                "--client-id",
                "example-anthropic",
                "--state-dir",
                str(tmp_path / "state"),  # not the default .swarm/runs/ of the checkout: no resume
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        wait_for(lambda: live.runtime.step >= 1, 120, "a training step")
        episodes = episodes_of(live, "example-anthropic")
        calls = [call for e in episodes for call in live.runtime.pool.get(e.id)[1]]
    finally:
        live.stop()
        engine.close()
    assert len(episodes) == 4 and all(e.trained_step is not None for e in episodes)
    assert all("tool_calls" in e.metrics for e in episodes)
    assert calls and all(c.prompt_ids and c.completion_ids for c in calls)


def test_the_same_prompt_examples_send_identical_prompts(client_server, short_completions: None) -> None:
    """The OpenAI SDK, LangChain, AgentScope and raw-HTTP agents differ only in the client stack: the
    server records the same prompt ids for the same task (what bench/frameworks.py compares)."""
    prompts = {}
    for name in ("math_openai", "math_langchain", "math_agentscope", "math_http"):
        assert _one_task(client_server, name, f"same-prompt-{name}").finished == 1
        (episode,) = episodes_of(client_server, f"same-prompt-{name}")
        (call,) = client_server.runtime.pool.get(episode.id)[1]
        prompts[name] = call.prompt_ids
    assert len({tuple(p) for p in prompts.values()}) == 1, prompts
