"""The research graph: planner (supervisor) → coder → runner → analyst → planner …, with patch
approval by `interrupt`, a SQLite checkpointer, and the run context carrying store, provider and
servers. `a3r.session` drives it for the CLI and the TUI.

Names are imported lazily (PEP 562), so modules the nodes use (`a3r.execution`, `a3r.research`)
can import `a3r.graph.state` and `a3r.graph.context` without loading the nodes first.
"""

from __future__ import annotations

import importlib
from typing import Any

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

_HOME = {
    "Ledger": "a3r.graph.context",
    "RunContext": "a3r.graph.context",
    "PatchDecision": "a3r.graph.state",
    "PatchReview": "a3r.graph.state",
    "ResearchState": "a3r.graph.state",
    "RunOutcome": "a3r.graph.state",
    "RunSpec": "a3r.graph.state",
    "build_graph": "a3r.graph.builder",
    "open_checkpointer": "a3r.graph.builder",
    "serializer": "a3r.graph.builder",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'a3r.graph' has no attribute {name!r}")
