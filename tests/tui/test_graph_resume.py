"""Approval resumes a waiting LangGraph graph: a real graph pauses on ``interrupt()`` with a patch id;
the TUI records the decision in the store and its ``on_decision`` hook resumes the thread with
``Command(resume={"patch_id", "approved", "note"})``, the value the research graph's approval node
parses (`a3r.graph.approval.parse_decision`)."""

from __future__ import annotations

import threading
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from a3r.app.tui import A3RApp, TuiConfig
from a3r.app.tui._approvals_screen import ApprovalsScreen
from a3r.graph.approval import parse_decision
from memory import PatchStatus, Store
from tests.tui.conftest import REWARD_DIFF, Seeded, cells, wait_for


class _State(TypedDict, total=False):
    patch_id: int
    action: str
    by: str
    note: str | None
    store_status: str


def _graph(store: Store) -> Any:
    """Propose → wait for the decision (interrupt) → read the store, like the research graph does."""

    def propose(state: _State) -> _State:
        artifact = store.artifacts(1)[0]
        patch = store.propose_patch(
            artifact.id, diff=REWARD_DIFF, rationale="run 1 collapsed", proposed_by="graph"
        )
        return {"patch_id": patch.id}

    def approve(state: _State) -> _State:
        decision = parse_decision(interrupt({"patch_id": state["patch_id"]}), state["patch_id"])
        stored = store.get_patch(state["patch_id"])
        return {
            "action": decision.action,
            "by": decision.by,
            "note": decision.note,
            "store_status": stored.status,
        }

    builder = StateGraph(_State)
    builder.add_node("propose", propose)
    builder.add_node("approve", approve)
    builder.add_edge(START, "propose")
    builder.add_edge("propose", "approve")
    builder.add_edge("approve", END)
    return builder.compile(checkpointer=InMemorySaver())


async def test_approval_in_the_tui_resumes_the_graph(store: Store, seeded: Seeded, config: TuiConfig) -> None:
    graph = _graph(store)
    thread = {"configurable": {"thread_id": "study-1"}}
    first = graph.invoke({}, thread)
    (pending,) = first["__interrupt__"]
    patch_id = pending.value["patch_id"]
    assert store.get_patch(patch_id).status is PatchStatus.pending
    finals: list[dict[str, Any]] = []
    resumed = threading.Event()

    decided_ids: list[int] = []

    def on_decision(decided: int, approved: bool, note: str | None) -> None:
        decided_ids.append(decided)
        finals.append(
            graph.invoke(Command(resume={"patch_id": decided, "approved": approved, "note": note}), thread)
        )
        resumed.set()

    app = A3RApp(store, config=config, on_decision=on_decision, approvals=True)
    async with app.run_test(size=(80, 24)) as pilot:
        assert isinstance(app.screen, ApprovalsScreen)
        await wait_for(pilot, lambda: len(cells(app, "#pending")) == 3)
        assert cells(app, "#pending")[-1][:4] == [str(patch_id), "1", "reward.py v1", "graph"]
        await pilot.press("down", "down", "enter", "r", *"reward hacking risk", "enter")
        await wait_for(pilot, resumed.is_set)
    (final,) = finals
    assert decided_ids == [patch_id]
    assert final["action"] == "reject" and final["note"] == "reward hacking risk"
    assert final["store_status"] == "rejected"  # the graph resumed after the store write
    assert "__interrupt__" not in final
    assert graph.get_state(thread).next == ()


async def test_standalone_tui_decision_is_the_resume_signal(
    store: Store, seeded: Seeded, config: TuiConfig
) -> None:
    """Without a hook (``a3r tui`` in another terminal), a graph waiting on its patch polls the store
    and resumes once the status is no longer pending."""
    graph = _graph(store)
    thread = {"configurable": {"thread_id": "study-1-standalone"}}
    patch_id = graph.invoke({}, thread)["__interrupt__"][0].value["patch_id"]
    finals: list[dict[str, Any]] = []
    stop = threading.Event()

    def waiting_runner() -> None:
        while not stop.wait(0.1):
            patch = store.get_patch(patch_id)
            if patch.status is not PatchStatus.pending:
                resume = {
                    "patch_id": patch.id,
                    "approved": patch.status is PatchStatus.approved,
                    "note": patch.note,
                }
                finals.append(graph.invoke(Command(resume=resume), thread))
                return

    runner = threading.Thread(target=waiting_runner, daemon=True)
    runner.start()
    app = A3RApp(store, config=config, approvals=True)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: len(cells(app, "#pending")) == 3)
            await pilot.press("down", "down", "enter", "a", *"go", "enter")
            await wait_for(pilot, lambda: finals)
    finally:
        stop.set()
        runner.join(timeout=10)
    (final,) = finals
    assert (final["action"], final["note"], final["store_status"]) == ("approve", "go", "approved")
    assert store.get_patch(patch_id).decided_by == "ada"
