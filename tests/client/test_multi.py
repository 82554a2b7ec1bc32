"""Multi-model episodes over two real servers: finish each with its reward, or abort them all."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.client import (
    AsyncSwarmClient,
    MultiEpisode,
    MultiEpisodeError,
    PartialFinishError,
    RetryPolicy,
    UndecidedFinishError,
    load_workflow,
    run_workflow,
)
from swarm.protocol import EpisodeStatus
from tests.client.conftest import episodes_of, write_jsonl, write_workflow
from tests.conftest import free_port

FAST = RetryPolicy(attempts=2, max_wait_s=0.05, deadline_s=5)


async def _chat(llm: Any, text: str) -> str:
    async with llm.openai(max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": text}], max_tokens=3
        )
    return reply.choices[0].message.content or ""


def _clients(a: Any, b: Any, client_id: str) -> dict[str, AsyncSwarmClient]:
    return {
        "planner": AsyncSwarmClient(a.url, client_id=client_id, retry=FAST),
        "executor": AsyncSwarmClient(b.url, client_id=client_id, retry=FAST),
    }


async def _close(clients: dict[str, AsyncSwarmClient]) -> None:
    for c in clients.values():
        await c.aclose()


def test_finish_sets_each_member_its_own_reward(client_server, second_server) -> None:
    async def go() -> None:
        clients = _clients(client_server, second_server, "multi-ok")
        async with MultiEpisode(clients, task_id="plan-1", family=None) as eps:
            assert eps["planner"].base_url.startswith(client_server.url)
            assert eps["executor"].base_url.startswith(second_server.url)
            plan = await _chat(eps["planner"].llm, "Plan: add 2 and 3.")
            await _chat(eps["executor"].llm, f"Execute: {plan}")
            await eps.finish({"planner": 0.25, "executor": 0.75})
        await _close(clients)

    asyncio.run(go())
    (planner,) = episodes_of(client_server, "multi-ok")
    (executor,) = episodes_of(second_server, "multi-ok")
    assert (planner.status, planner.reward, planner.task_id) == (EpisodeStatus.FINISHED, 0.25, "plan-1")
    assert (executor.status, executor.reward, executor.task_id) == (EpisodeStatus.FINISHED, 0.75, "plan-1")
    assert len(client_server.runtime.pool.get(planner.id)[1]) == 1
    assert len(second_server.runtime.pool.get(executor.id)[1]) == 1


def test_an_exception_aborts_every_member(client_server, second_server) -> None:
    async def go() -> None:
        clients = _clients(client_server, second_server, "multi-raise")
        with pytest.raises(KeyError):
            async with MultiEpisode(clients, task_id="t") as eps:
                await _chat(eps["planner"].llm, "hello")
                raise KeyError("bug in the reward")
        with pytest.raises(httpx.ConnectTimeout):
            async with MultiEpisode(clients, task_id="t-infra"):
                raise httpx.ConnectTimeout("tool timed out")
        async with MultiEpisode(clients, task_id="t-no-finish"):
            pass
        await _close(clients)

    asyncio.run(go())
    for server in (client_server, second_server):
        got = [(e.task_id, e.status) for e in episodes_of(server, "multi-raise")]
        assert got == [
            ("t", EpisodeStatus.ABORTED),
            ("t-infra", EpisodeStatus.INFRA_FAILURE),
            ("t-no-finish", EpisodeStatus.ABORTED),
        ]


def test_a_lost_member_aborts_the_others_instead_of_finishing_them(client_server, second_server) -> None:
    async def go() -> None:
        clients = _clients(client_server, second_server, "multi-lost")
        with pytest.raises(MultiEpisodeError) as info:
            async with MultiEpisode(clients, task_id="t") as eps:
                # the executor's server forgets the episode (reclaimed, restarted…)
                await clients["executor"].abort(eps["executor"].id, "reclaimed", infra_failure=True)
                await eps.finish({"planner": 1.0, "executor": 1.0})
        assert not isinstance(info.value, PartialFinishError)
        assert info.value.aborted == ["planner"]
        await _close(clients)

    asyncio.run(go())
    assert [e.status for e in episodes_of(client_server, "multi-lost")] == [EpisodeStatus.INFRA_FAILURE]
    assert [e.status for e in episodes_of(second_server, "multi-lost")] == [EpisodeStatus.INFRA_FAILURE]


def test_a_member_that_cannot_begin_aborts_the_ones_that_did(client_server) -> None:
    async def go() -> None:
        clients = {
            "planner": AsyncSwarmClient(client_server.url, client_id="multi-begin", retry=FAST),
            "executor": AsyncSwarmClient(
                f"http://127.0.0.1:{free_port()}", client_id="multi-begin", retry=FAST
            ),
        }
        with pytest.raises(httpx.ConnectError):
            async with MultiEpisode(clients, task_id="t"):
                raise AssertionError("the block must not run")
        await _close(clients)

    asyncio.run(go())
    assert [e.status for e in episodes_of(client_server, "multi-begin")] == [EpisodeStatus.INFRA_FAILURE]


def _failing_transport(fails: str) -> httpx.MockTransport:
    """A server that begins and heartbeats fine but answers every ``fails`` request (``/prepare`` or
    ``/commit``) with 500 (a crash in the middle of a finish)."""

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/api/v1/episodes":
            created = {"episode_id": "ep-fake", "base_url": "http://fake/v1", "api_key": "k", "model": "m"}
            return httpx.Response(201, json=created)
        if path.endswith(fails):
            return httpx.Response(500, json={"error": {"type": "server_error", "message": "disk on fire"}})
        return httpx.Response(200, json={"ok": True})

    return httpx.MockTransport(handler)


def test_a_finish_failing_on_any_server_leaves_no_half_finished_episode(client_server) -> None:
    """Two-phase finish: a failed prepare aborts everyone; a failed secondary commit is the servers' to
    settle (the transaction committed); a primary commit without an answer aborts nothing."""

    async def go() -> tuple[MultiEpisodeError, list[str], UndecidedFinishError]:
        real = AsyncSwarmClient(client_server.url, client_id="multi-order", retry=FAST)
        no_prepare = AsyncSwarmClient("http://fake", retry=FAST, transport=_failing_transport("/prepare"))
        no_commit = AsyncSwarmClient("http://fake", retry=FAST, transport=_failing_transport("/commit"))
        for order, task in ((("fake", "real"), "prepare-first"), (("real", "fake"), "prepare-last")):
            with pytest.raises(MultiEpisodeError) as failed:
                clients = {"fake": no_prepare, "real": real}
                async with MultiEpisode({n: clients[n] for n in order}, task_id=task) as eps:
                    await eps.finish(1.0)
            assert not isinstance(failed.value, PartialFinishError | UndecidedFinishError)
        async with MultiEpisode({"real": real, "fake": no_commit}, task_id="commit-secondary") as eps:
            await eps.finish(1.0)  # the primary committed: the transaction did
        unconfirmed = eps.unconfirmed
        with pytest.raises(UndecidedFinishError) as undecided:
            async with MultiEpisode({"fake": no_commit, "real": real}, task_id="commit-primary") as eps:
                await eps.finish(1.0)
        for client in (real, no_prepare, no_commit):
            await client.aclose()
        return failed.value, unconfirmed, undecided.value

    failed, unconfirmed, undecided = asyncio.run(go())
    assert "real" in failed.aborted and unconfirmed == ["fake"]
    assert undecided.aborted == [] and undecided.primary == "fake"
    got = [(e.task_id, e.status) for e in episodes_of(client_server, "multi-order")]
    assert got == [
        ("prepare-first", EpisodeStatus.INFRA_FAILURE),
        ("prepare-last", EpisodeStatus.INFRA_FAILURE),
        ("commit-secondary", EpisodeStatus.FINISHED),
        ("commit-primary", EpisodeStatus.PREPARED),  # waits for its primary's fate; never trained as is
    ]


def test_rewards_must_name_the_members(client_server, second_server) -> None:
    async def go() -> None:
        clients = _clients(client_server, second_server, "multi-names")
        with pytest.raises(ValueError, match="rewards name"):
            async with MultiEpisode(clients, task_id="t") as eps:
                await eps.finish({"planner": 1.0})
        await _close(clients)

    asyncio.run(go())
    assert [e.status for e in episodes_of(second_server, "multi-names")] == [EpisodeStatus.ABORTED]


def test_runner_with_two_servers(client_server, second_server, tmp_path: Path) -> None:
    code = """
        from swarm.client import Result

        async def run(task, llm):
            planner, executor = llm["planner"], llm["executor"]
            async with planner.openai(max_retries=0) as a, executor.openai(max_retries=0) as b:
                plan = await a.chat.completions.create(
                    model=planner.model, messages=[{"role": "user", "content": task["q"]}], max_tokens=3
                )
                await b.chat.completions.create(
                    model=executor.model,
                    messages=[{"role": "user", "content": plan.choices[0].message.content or "go"}],
                    max_tokens=3,
                )
            return {"planner": 0.5, "executor": Result(reward=1.0, metrics={"steps": 1.0})}
    """
    summary = run_workflow(
        load_workflow(write_workflow(tmp_path, code)),
        {"planner": client_server.url, "executor": second_server.url},
        write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "q": "2+2?"}, {"id": "b", "q": "3+3?"}]),
        group_size=2,
        client_id="multi-runner",
        show_progress=False,
    )
    assert summary.finished == 4 and summary.train_reward_mean == 0.5  # the first server's reward
    planner = episodes_of(client_server, "multi-runner")
    executor = episodes_of(second_server, "multi-runner")
    assert sorted(e.task_id for e in planner) == sorted(e.task_id for e in executor) == ["a", "a", "b", "b"]
    assert {e.reward for e in planner} == {0.5} and {e.reward for e in executor} == {1.0}
    assert {e.metrics.get("steps") for e in executor} == {1.0}
