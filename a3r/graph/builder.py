"""Wiring of the research graph and its SQLite checkpointer.

::

    START → planner ─(coder)→ coder ─(runner)→ runner → analyst ─(approve)→ approve ─(runner)→ runner …
               ↑  └─(runner)→ runner   └─(reporter)→ reporter      └─(planner)→ planner
               └──────────────────────────────────────────────────────────────┘
    planner ─(reporter)→ reporter → END

Routing is by ``Command(goto=...)`` from planner, coder, analyst and approve (their return types
name the targets, so the compiled graph knows the edges); runner → analyst and reporter → END are
fixed edges.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from a3r.graph.analyst import analyst
from a3r.graph.approval import approve
from a3r.graph.coder import coder
from a3r.graph.context import RunContext
from a3r.graph.planner import planner
from a3r.graph.reporter import reporter
from a3r.graph.runner import runner
from a3r.graph.state import STATE_TYPES, ResearchState

__all__ = ["build_graph", "open_checkpointer", "serializer"]


def serializer() -> JsonPlusSerializer:
    """Checkpoint serializer that revives only builtins and the state's own types (`STATE_TYPES`)."""
    return JsonPlusSerializer(allowed_msgpack_modules=[(t.__module__, t.__name__) for t in STATE_TYPES])


def open_checkpointer(path: Path) -> SqliteSaver:
    """A SQLite checkpointer on ``path`` with strict deserialisation (`serializer`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False)
    saver = SqliteSaver(conn, serde=serializer())
    saver.setup()
    return saver


def build_graph(
    checkpointer: BaseCheckpointSaver[str] | None = None,
    *,
    interrupt_before: Sequence[str] | None = None,
) -> CompiledStateGraph[ResearchState, RunContext, ResearchState, ResearchState]:
    """Compile the research graph (planner, coder, runner, analyst, approve, reporter).

    Args:
        checkpointer: Where threads are checkpointed (`open_checkpointer`); required for approvals.
        interrupt_before: Node names to pause before (debugging, tests, dry runs).
    """
    graph = StateGraph(ResearchState, context_schema=RunContext)
    graph.add_node("planner", planner)
    graph.add_node("coder", coder)
    graph.add_node("runner", runner)
    graph.add_node("analyst", analyst)
    graph.add_node("approve", approve)
    graph.add_node("reporter", reporter)
    graph.add_edge(START, "planner")
    graph.add_edge("runner", "analyst")
    graph.add_edge("reporter", END)
    return graph.compile(checkpointer=checkpointer, interrupt_before=list(interrupt_before or []))
