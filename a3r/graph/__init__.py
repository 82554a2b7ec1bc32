"""The research graph: planner (supervisor) → coder → runner → analyst → planner …, with patch
approval by `interrupt`, a SQLite checkpointer, and the run context carrying store, provider and
servers. `a3r.session` drives it for the CLI and the TUI.
"""

from a3r.graph.builder import build_graph, open_checkpointer, serializer
from a3r.graph.context import Ledger, RunContext
from a3r.graph.state import PatchDecision, PatchReview, ResearchState, RunOutcome, RunSpec

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
