"""Real processes: kill -9 a runner mid-episode, resume it with an edited reward; restart the server
under a running runner. The server runs in this process (real uvicorn on loopback); runners run as
``swarm run`` subprocesses or in a thread."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from swarm.client import load_workflow, run_workflow
from swarm.protocol import EpisodeStatus
from tests.client.conftest import NO_TRAINING, episodes_of, swarm_run, write_jsonl, write_workflow
from tests.conftest import make_server

BLOCKING_WORKFLOW = """
    import asyncio
    import pathlib

    MARKS = pathlib.Path({marks!r})

    async def run(task, llm):
        async with llm.openai(max_retries=0) as client:
            await client.chat.completions.create(
                model=llm.model, messages=[{{"role": "user", "content": "hi"}}], max_tokens=2
            )
        if task.get("block"):
            (MARKS / f"{{task['id']}}-{{id(llm)}}").touch()
            await asyncio.sleep(600)  # the runner is killed while it waits here
        return {reward}
"""


def _wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_kill_9_mid_episode_then_resume_with_an_edited_reward(tmp_path: Path, tiny_engine) -> None:
    live = make_server(
        tmp_path / "server", tiny_engine, episode_timeout_s=1.5, reclaim_period_s=0.5, training=NO_TRAINING
    )
    try:
        marks = tmp_path / "marks"
        marks.mkdir()
        workflow = write_workflow(tmp_path, BLOCKING_WORKFLOW.format(marks=str(marks), reward="1.0"))
        rows = [{"id": "t0"}, {"id": "t1", "block": True}, {"id": "t2"}]
        data = write_jsonl(tmp_path / "data.jsonl", rows)
        args = [str(workflow), "--server", live.url, "--dataset", str(data), "--group-size", "2"]
        args += ["--concurrency", "2", "--client-id", "killed", "--state-dir", str(tmp_path / "state")]
        args += ["--heartbeat", "0.3"]  # a live runner keeps its episodes from being reclaimed
        runner = swarm_run([*args, "--no-progress"])
        try:
            _wait_for(lambda: len(list(marks.iterdir())) == 2, 60, "both t1 episodes to block")
            finished_before = [e for e in episodes_of(live, "killed") if e.status is EpisodeStatus.FINISHED]
            assert sorted(e.task_id for e in finished_before) == ["t0", "t0"]
            assert live.runtime.status().clients == {"killed": 2}
        finally:
            runner.send_signal(signal.SIGKILL)
            runner.wait(timeout=30)
        assert runner.returncode == -signal.SIGKILL
        # the server goes on and reclaims the killed client's open episodes after the timeout
        _wait_for(lambda: live.runtime.status().clients == {}, 20, "the open episodes to be reclaimed")
        ended = episodes_of(live, "killed")
        reclaimed = [e for e in ended if e.status is EpisodeStatus.INFRA_FAILURE]
        assert sorted(e.task_id for e in reclaimed) == ["t1", "t1"]
        assert all("reclaimed" in (e.reason or "") for e in reclaimed)
        # edit the reward, restart the runner: it resumes (t0 is not run again) and finishes the rest
        workflow.write_text(workflow.read_text().replace("return 1.0", "return 0.5"))
        data.write_text(data.read_text().replace(', "block": true', ""))
        again = swarm_run([*args, "--no-progress"])
        out, _ = again.communicate(timeout=120)
        assert again.returncode == 0, out
        finished = [e for e in episodes_of(live, "killed") if e.status is EpisodeStatus.FINISHED]
        assert Counter(e.task_id for e in finished) == {"t0": 2, "t1": 2, "t2": 2}
        assert {e.task_id: e.reward for e in finished} == {"t0": 1.0, "t1": 0.5, "t2": 0.5}
        assert finished[:2] == finished_before  # nothing finished before the kill was lost
        assert "resumed (skipped)" in out and "│ 2" in out.split("resumed (skipped)")[1][:20]
    finally:
        live.stop()


def test_server_restart_under_a_running_client(tmp_path: Path, tiny_engine) -> None:
    live = make_server(tmp_path / "server", tiny_engine, training=NO_TRAINING)
    try:
        code = """
            import asyncio

            async def run(task, llm):
                async with llm.openai(max_retries=0) as client:
                    await client.chat.completions.create(
                        model=llm.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                    )
                await asyncio.sleep(0.3)
                return 1.0
        """
        workflow = load_workflow(write_workflow(tmp_path, code))
        data = write_jsonl(tmp_path / "data.jsonl", [{"id": f"r{i}"} for i in range(8)])
        outcome: dict[str, Any] = {}

        def client() -> None:
            try:
                outcome["summary"] = run_workflow(
                    workflow,
                    live.url,
                    data,
                    group_size=2,
                    concurrency=4,
                    client_id="restarted",
                    infra_retries=3,
                    retry_backoff_s=0.2,
                    show_progress=False,
                )
            except BaseException as exc:  # surfaced by the assertion below
                outcome["error"] = exc

        thread = threading.Thread(target=client)
        thread.start()
        _wait_for(
            lambda: len(episodes_of(live, "restarted")) >= 2 and live.runtime.status().clients,
            60,
            "two ended episodes and some open ones",
        )
        live.restart()  # the open episodes die with the old process: their keys stop working
        thread.join(timeout=180)
        assert not thread.is_alive()
        assert "error" not in outcome, outcome.get("error")
        summary = outcome["summary"]
        assert summary.finished == 16 and summary.agent_failures == 0
        assert summary.infra_failures >= 1  # in-flight episodes were lost, classified and re-run
        finished = [e for e in episodes_of(live, "restarted") if e.status is EpisodeStatus.FINISHED]
        assert Counter(e.task_id for e in finished) == {f"r{i}": 2 for i in range(8)}
    finally:
        live.stop()
