"""A human decision on a patch and the hook that hands it to whoever waits for it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Decision", "DecisionHook"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What the reviewer decided about one patch.

    Attributes:
        approved: ``True`` approves the patch, ``False`` rejects it.
        note: The reviewer's comment (required for a rejection, optional for an approval).
    """

    approved: bool
    note: str | None = None


DecisionHook = Callable[[int, bool, str | None], Awaitable[None] | None]
"""``on_decision(patch_id, approved, note)``: called once per decision, after the store recorded it.

A plain function runs in a worker thread (it may block, e.g. resume a LangGraph thread); a coroutine
function runs on the TUI's event loop. An exception it raises is shown to the user; the decision stays
recorded in the store either way.
"""
