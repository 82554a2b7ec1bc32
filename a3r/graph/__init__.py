"""The research graph: planner (supervisor) → coder → runner → analyst → planner …, with patch
approval by `interrupt`, a SQLite checkpointer, and the run context carrying store, provider and
servers. `a3r.app.session` drives it for the CLI and the TUI.

The graph sits above `a3r.providers`, `a3r.swarmops` and `a3r.study`; nothing below imports it.
"""

from __future__ import annotations

from a3r.graph.builder import build_graph, open_checkpointer, serializer
from a3r.graph.context import Ledger, RunContext
from a3r.graph.state import PatchDecision, PatchReview, ResearchState
from a3r.study.runs import RunOutcome, RunSpec

__all__ = [
    "Ledger",
    "PatchDecision",
    "PatchReview",
    "ResearchState",
    "RunContext",
    "RunOutcome",
    "RunSpec",
    "build_graph",
    "open_checkpointer",
    "serializer",
]
