"""The dataset runner against a real tiny-model server: groups, resume, failures, heartbeats, eval."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from swarm.client import (
    LLM,
    AsyncSwarmClient,
    DatasetError,
    Runner,
    RunnerConfig,
    RunnerError,
    TaskSet,
    load_workflow,
    run_workflow,
)
from swarm.protocol import EpisodeKind, EpisodeStatus
from tests.client.conftest import CHAT_WORKFLOW, episodes_of, write_jsonl, write_workflow


def _tasks(tmp_path: Path, n: int, name: str = "tasks.jsonl") -> Path:
    rows = [{"id": f"t{i}", "question": f"What is {i} + 1?", "value": i / 10} for i in range(n)]
    return write_jsonl(tmp_path / name, rows)


def _run(workflow: Any, server: Any, dataset: Any, console: Console | None = None, **config: Any) -> Any:
    eval_tasks = config.pop("eval_tasks", None)

    async def go() -> Any:
        client = AsyncSwarmClient(server.url, client_id=config["client_id"], retry=Runner.default_retry())
        try:
            runner = Runner(
                workflow,
                {"default": client},
                dataset if isinstance(dataset, TaskSet) else TaskSet(dataset),
                RunnerConfig(**config),
                eval_dataset=eval_tasks,
                console=console or Console(file=io.StringIO()),
                show_progress=False,
            )
            return await runner.run()
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_groups_of_g_episodes_share_the_task_id(client_server, tmp_path: Path) -> None:
    workflow = load_workflow(write_workflow(tmp_path, CHAT_WORKFLOW))
    state = tmp_path / "state"
    summary = _run(
        workflow,
        client_server,
        _tasks(tmp_path, 3),
        client_id="groups",
        group_size=2,
        concurrency=3,
        state_dir=state,
    )
    assert (summary.finished, summary.tasks_done, summary.agent_failures, summary.infra_failures) == (
        6,
        3,
        0,
        0,
    )
    episodes = episodes_of(client_server, "groups")
    assert sorted(e.task_id for e in episodes) == ["t0", "t0", "t1", "t1", "t2", "t2"]
    assert all(e.status is EpisodeStatus.FINISHED and e.kind is EpisodeKind.TRAIN for e in episodes)
    assert {e.task_id: e.reward for e in episodes} == {"t0": 0.0, "t1": 0.1, "t2": 0.2}
    assert all(e.metrics["chars"] >= 0 for e in episodes)
    # The progress file keeps each episode's Result.metrics (a3r draws the reward's parts from it).
    rows = [json.loads(x) for x in (state / "progress.jsonl").read_text().splitlines()]
    assert sorted(r["metrics"]["chars"] for r in rows) == sorted(e.metrics["chars"] for e in episodes)
    assert sorted(e.metadata["member"] for e in episodes if e.task_id == "t1") == [0, 1]
    _, calls = client_server.runtime.pool.get(episodes[0].id)
    assert len(calls) == 1 and 1 <= len(calls[0].completion_ids) <= 4


def test_resume_runs_only_what_is_not_done(client_server, tmp_path: Path) -> None:
    workflow = load_workflow(
        write_workflow(tmp_path, "async def run(task, llm):\n    return task['value']\n")
    )
    state = tmp_path / "state"
    first = _run(
        workflow, client_server, _tasks(tmp_path, 3), client_id="resume", group_size=2, state_dir=state
    )
    assert first.finished == 6 and first.resumed == 0
    lines = [json.loads(x) for x in (state / "progress.jsonl").read_text().splitlines()]
    assert sorted((r["task_id"], r["member"]) for r in lines) == [
        (f"t{i}", g) for i in range(3) for g in range(2)
    ]
    assert all(r["kind"] == "train" and r["round"] == 0 and r["status"] == "finished" for r in lines)
    # a torn line from a killed runner is ignored
    with (state / "progress.jsonl").open("a") as fh:
        fh.write('{"kind": "train", "round": 1, "task_')
    second = _run(
        workflow,
        client_server,
        _tasks(tmp_path, 3),
        client_id="resume",
        group_size=2,
        epochs=2,
        state_dir=state,
    )
    assert second.resumed == 6 and second.finished == 6 and second.tasks_done == 6
    episodes = episodes_of(client_server, "resume")
    assert len(episodes) == 12
    assert sorted(e.metadata["round"] for e in episodes) == [0] * 6 + [1] * 6


def test_agent_error_aborts_the_episode_and_shows_the_traceback(client_server, tmp_path: Path) -> None:
    code = """
        async def run(task, llm):
            if task["id"] == "t1":
                return score_for(task)
            return 1.0

        def score_for(task):
            return task["no-such-field"]
    """
    out = io.StringIO()
    summary = _run(
        load_workflow(write_workflow(tmp_path, code)),
        client_server,
        _tasks(tmp_path, 3),
        console=Console(file=out, width=120),
        client_id="agent-error",
        group_size=1,
    )
    assert (summary.finished, summary.agent_failures, summary.infra_failures) == (2, 1, 0)
    statuses = {e.task_id: e.status for e in episodes_of(client_server, "agent-error")}
    assert statuses == {
        "t0": EpisodeStatus.FINISHED,
        "t1": EpisodeStatus.ABORTED,
        "t2": EpisodeStatus.FINISHED,
    }
    text = out.getvalue()
    assert "workflow error in task t1" in text
    assert "Traceback" in text and "score_for" in text and "KeyError" in text and "no-such-field" in text


def test_infra_errors_abort_as_infra_failure_and_rerun(client_server, tmp_path: Path) -> None:
    code = """
        import httpx
        tries = {}

        async def run(task, llm):
            tries[task["id"]] = tries.get(task["id"], 0) + 1
            if task["id"] == "t0" and tries["t0"] == 1:
                raise httpx.ConnectTimeout("the tool service timed out")
            return 1.0
    """
    summary = _run(
        load_workflow(write_workflow(tmp_path, code)),
        client_server,
        _tasks(tmp_path, 2),
        client_id="infra",
        group_size=1,
        retry_backoff_s=0.05,
    )
    assert (summary.finished, summary.agent_failures, summary.infra_failures) == (2, 0, 1)
    episodes = episodes_of(client_server, "infra")
    assert [(e.task_id, e.status) for e in episodes if e.task_id == "t0"] == [
        ("t0", EpisodeStatus.INFRA_FAILURE),
        ("t0", EpisodeStatus.FINISHED),
    ]
    first_t0 = next(e for e in episodes if e.task_id == "t0")  # t1 may end first: both run at once
    assert "ConnectTimeout" in (first_t0.reason or "")


def test_heartbeat_finds_a_lost_episode_and_cancels_the_workflow(client_server, tmp_path: Path) -> None:
    sabotaged: list[str] = []

    async def run(task: dict[str, Any], llm: LLM) -> float:
        if not sabotaged:  # first attempt: the server loses the episode while the agent works
            episode_id = client_server.runtime.episode_for_key(llm.api_key).id
            sabotaged.append(episode_id)
            async with httpx.AsyncClient(base_url=client_server.url) as other:  # with the key (issue 35)
                ended_now = await other.post(
                    f"/api/v1/episodes/{episode_id}/abort",
                    json={"reason": "lost behind the runner's back", "infra_failure": True},
                    headers={"Authorization": f"Bearer {llm.api_key}"},
                )
                ended_now.raise_for_status()
            await asyncio.sleep(30)
        return 1.0

    start = time.monotonic()
    summary = _run(
        run, client_server, _tasks(tmp_path, 1), client_id="heartbeat", group_size=1, heartbeat_s=0.2
    )
    assert time.monotonic() - start < 10
    assert (summary.finished, summary.infra_failures) == (1, 1)
    assert [e.status for e in episodes_of(client_server, "heartbeat")] == [
        EpisodeStatus.INFRA_FAILURE,
        EpisodeStatus.FINISHED,
    ]


def test_a_workflow_past_the_episode_timeout_is_aborted_and_rerun(client_server, tmp_path: Path) -> None:
    attempts: list[int] = []

    async def run(task: dict[str, Any], llm: LLM) -> float:
        attempts.append(1)
        if len(attempts) == 1:  # first attempt hangs (a stuck tool, a lost connection)
            await asyncio.sleep(30)
        return 1.0

    start = time.monotonic()
    summary = _run(
        run, client_server, _tasks(tmp_path, 1), client_id="timeout", group_size=1, episode_timeout_s=0.5
    )
    assert time.monotonic() - start < 10
    assert (summary.finished, summary.infra_failures, summary.agent_failures) == (1, 1, 0)
    episodes = episodes_of(client_server, "timeout")
    assert [e.status for e in episodes] == [EpisodeStatus.INFRA_FAILURE, EpisodeStatus.FINISHED]
    assert "longer than the episode timeout (0.5 s)" in (episodes[0].reason or "")


def test_a_finish_refused_because_the_server_ended_the_episode_says_why(
    client_server, tmp_path: Path
) -> None:
    ended: list[str] = []

    async def run(task: dict[str, Any], llm: LLM) -> float:
        if not ended:  # the server ends the episode (as a staleness or drain abort would) mid-workflow
            episode_id = client_server.runtime.episode_for_key(llm.api_key).id
            ended.append(episode_id)
            async with httpx.AsyncClient(base_url=client_server.url) as other:  # with the key (issue 35)
                ended_now = await other.post(
                    f"/api/v1/episodes/{episode_id}/abort",
                    json={"reason": "too stale: a test says so", "infra_failure": True},
                    headers={"Authorization": f"Bearer {llm.api_key}"},
                )
                ended_now.raise_for_status()
        return 1.0

    out = io.StringIO()
    summary = _run(
        run, client_server, _tasks(tmp_path, 1), Console(file=out, width=300), client_id="ended", group_size=1
    )
    assert (summary.finished, summary.infra_failures) == (1, 1)
    assert f"the server ended episode {ended[0]} (infra_failure): too stale: a test says so" in out.getvalue()


def test_the_workflows_openai_clients_are_closed_when_the_episode_ends(client_server, tmp_path: Path) -> None:
    workflow = load_workflow(
        write_workflow(
            tmp_path,
            CHAT_WORKFLOW.replace(
                "from swarm.client import Result", "from swarm.client import Result\n    MADE = []"
            ).replace(
                "client = llm.openai(max_retries=0)",
                "client = llm.openai(max_retries=0); MADE.append(client)",
            ),
        )
    )
    summary = _run(workflow, client_server, _tasks(tmp_path, 2), client_id="closing", group_size=2)
    made = workflow.__globals__["MADE"]
    assert summary.finished == 4 and len(made) == 4
    assert all(client.is_closed() for client in made)


def test_eval_rounds_every_k_train_tasks(client_server, tmp_path: Path) -> None:
    workflow = load_workflow(
        write_workflow(tmp_path, "async def run(task, llm):\n    return task['value']\n")
    )
    evals = TaskSet(
        write_jsonl(tmp_path / "eval.jsonl", [{"id": "e0", "value": 1.0}, {"id": "e1", "value": 0.0}])
    )
    summary = _run(
        workflow,
        client_server,
        _tasks(tmp_path, 4),
        client_id="eval",
        group_size=2,
        eval_every=2,
        eval_tasks=evals,
    )
    assert summary.finished == 8 + 4
    assert sorted(summary.eval_rewards) == [1, 2] and summary.eval_reward_mean(1) == 0.5
    episodes = episodes_of(client_server, "eval")
    evals_seen = [(e.task_id, e.metadata["round"]) for e in episodes if e.kind is EpisodeKind.EVAL]
    assert sorted(evals_seen) == [("e0", 1), ("e0", 2), ("e1", 1), ("e1", 2)]


def test_an_invalid_episode_stops_the_run(client_server, tmp_path: Path) -> None:
    workflow = load_workflow(write_workflow(tmp_path, "async def run(task, llm):\n    return 1.0\n"))
    dataset = write_jsonl(tmp_path / "bad.jsonl", [{"id": "ok"}, {"id": "x" * 600}])
    with pytest.raises(RunnerError, match="task_id: String should have at most 512 characters"):
        _run(workflow, client_server, dataset, client_id="rejected", group_size=1, concurrency=1)
    assert [e.task_id for e in episodes_of(client_server, "rejected")] == ["ok"]


def test_run_workflow_with_a_generator(client_server) -> None:
    async def run(task: dict[str, Any], llm: LLM) -> float:
        async with httpx.AsyncClient() as http:  # the episode's key works for /v1/models too
            await http.get(f"{llm.base_url}/models", headers={"Authorization": f"Bearer {llm.api_key}"})
        return float(task["n"])

    summary = run_workflow(
        run,
        client_server.url,
        TaskSet(lambda: ({"id": f"g{n}", "n": n} for n in range(3))),
        group_size=2,
        client_id="generator",
        show_progress=False,
    )
    assert summary.finished == 6 and summary.train_reward_mean == pytest.approx(1.0)


def test_a_run_of_infra_failures_stops_the_runner(client_server, tmp_path: Path) -> None:
    code = """
        import httpx

        async def run(task, llm):
            raise httpx.ConnectError("the tool service is down")
    """
    with pytest.raises(RunnerError, match="3 infrastructure failures in a row"):
        _run(
            load_workflow(write_workflow(tmp_path, code)),
            client_server,
            _tasks(tmp_path, 10),
            client_id="infra-streak",
            group_size=1,
            concurrency=1,
            infra_retries=0,
            max_consecutive_infra=3,
        )
    assert [e.status for e in episodes_of(client_server, "infra-streak")] == [EpisodeStatus.INFRA_FAILURE] * 3


def test_rerun_aborted_after_fixing_the_workflow(client_server, tmp_path: Path) -> None:
    state = tmp_path / "state"
    broken = write_workflow(tmp_path, "async def run(task, llm):\n    return task['missing']\n", name="wf.py")
    first = _run(
        load_workflow(broken),
        client_server,
        _tasks(tmp_path, 2),
        client_id="rerun",
        group_size=1,
        state_dir=state,
    )
    assert first.agent_failures == 2
    fixed = write_workflow(tmp_path, "async def run(task, llm):\n    return 1.0\n", name="wf.py")
    again = _run(
        load_workflow(fixed),
        client_server,
        _tasks(tmp_path, 2),
        client_id="rerun",
        group_size=1,
        state_dir=state,
    )
    assert (again.resumed, again.finished) == (2, 0)  # an agent failure is a real rollout: done
    rerun = _run(
        load_workflow(fixed),
        client_server,
        _tasks(tmp_path, 2),
        client_id="rerun",
        group_size=1,
        state_dir=state,
        rerun_aborted=True,
    )
    assert (rerun.resumed, rerun.finished) == (0, 2)
    statuses = [e.status for e in episodes_of(client_server, "rerun")]
    assert statuses == [EpisodeStatus.ABORTED] * 2 + [EpisodeStatus.FINISHED] * 2


def test_a_bad_generated_record_stops_the_run(client_server) -> None:
    def tasks() -> Any:
        yield {"id": "fine"}
        yield ["not", "a", "dict"]

    with pytest.raises(DatasetError, match="a task must be a JSON object, got list"):
        run_workflow(
            _one, client_server.url, TaskSet(tasks), group_size=1, client_id="bad-gen", show_progress=False
        )
    assert "bad-gen" not in client_server.runtime.status().clients  # nothing left open
    assert all(e.status is not EpisodeStatus.FINISHED for e in episodes_of(client_server, "bad-gen"))


async def _one(task: dict[str, Any], llm: LLM) -> float:
    return 1.0


def test_episode_blocks_abort_infra_errors_as_infra_failures(client_server) -> None:
    from swarm.client import SwarmClient

    with SwarmClient(client_server.url, client_id="blocks") as client:
        with pytest.raises(httpx.ReadTimeout), client.episode("timeout"):
            raise httpx.ReadTimeout("the tool service timed out")
        with pytest.raises(KeyError), client.episode("bug"):
            raise KeyError("bug")

    async def go() -> None:
        async with AsyncSwarmClient(client_server.url, client_id="blocks") as client:
            with pytest.raises(TimeoutError):
                async with client.episode("async-timeout"):
                    raise TimeoutError

    asyncio.run(go())
    got = [(e.task_id, e.status) for e in episodes_of(client_server, "blocks")]
    assert got == [
        ("timeout", EpisodeStatus.INFRA_FAILURE),
        ("bug", EpisodeStatus.ABORTED),
        ("async-timeout", EpisodeStatus.INFRA_FAILURE),
    ]
