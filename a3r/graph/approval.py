"""Patch approval: the graph stops on `interrupt` with a typed `PatchReview` payload until a human
(or ``--auto-approve``) decides; an approved patch is applied to the workspace and the training
client is hot-swapped (a continuation run restarts ``swarm run`` with the patched files on the same
server, which keeps its weights and step).

Everything here runs again when the graph resumes (the node restarts from its top), so every side
effect checks first: the decision is recorded only while the patch is pending, the file is written only
if it does not hold the new content yet, the patch is marked applied only while approved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from a3r.graph.analyst import _spec_of, continuation, pending_patch_file
from a3r.graph.context import RunContext
from a3r.graph.state import PatchDecision, ResearchState
from a3r.study.patches import apply_patch
from memory import PatchStatus

__all__ = ["approve", "parse_decision"]


def parse_decision(raw: Any, patch_id: int) -> PatchDecision:
    """Read a resume value: ``"approve"``/``"reject"``, a mapping with ``action``, ``by``, ``note``, or the
    TUI's ``{"patch_id", "approved": bool, "note"}``.

    Raises:
        ValueError: An unknown action.
    """
    if isinstance(raw, PatchDecision):
        return raw
    if isinstance(raw, str):
        raw = {"action": raw}
    if isinstance(raw, dict) and "action" not in raw and isinstance(raw.get("approved"), bool):
        raw = {**raw, "action": "approve" if raw["approved"] else "reject"}  # the TUI's resume value
    if not isinstance(raw, dict) or raw.get("action") not in ("approve", "reject"):
        raise ValueError(f"a patch decision must be 'approve' or 'reject', got {raw!r}")
    return PatchDecision(
        patch_id=patch_id, action=raw["action"], by=str(raw.get("by") or "user"), note=raw.get("note")
    )


def approve(state: ResearchState, runtime: Runtime[RunContext]) -> Command[Literal["runner"]]:
    """Wait for the decision on the pending patch, then apply it (or not) and continue training."""
    ctx = runtime.context
    review = state.get("pending_patch")
    assert review is not None
    if ctx.auto_approve:
        decision = PatchDecision(patch_id=review.patch_id, action="approve", by="policy:auto-approve")
    else:
        decision = parse_decision(interrupt(review), review.patch_id)
    patch = ctx.store.get_patch(review.patch_id)
    if patch.status is PatchStatus.pending:
        patch = ctx.store.decide_patch(
            review.patch_id, approve=decision.action == "approve", by=decision.by, note=decision.note
        )
    else:  # decided in the store already (the TUI, or this node before a crash): the store is the truth
        decision = PatchDecision(
            patch_id=review.patch_id,
            action="reject" if patch.status is PatchStatus.rejected else "approve",
            by=patch.decided_by or decision.by,
            note=patch.note,
        )
    ws = Path(state["workspace"])
    outcome = state["outcomes"][-1]
    if decision.action == "approve":
        pending = json.loads(pending_patch_file(ws, review.patch_id).read_text(encoding="utf-8"))
        apply_patch(ws, pending["file"], base=pending["base"], new=pending["new"])
        if patch.status is PatchStatus.approved:
            ctx.store.mark_patch_applied(review.patch_id, content=pending["new"])
        follow = continuation(
            outcome,
            _spec_of(state, outcome),
            suffix=f"p{review.patch_id}",
            early_stop=False,
            reward_patch=review.patch_id,
        )
        line = f"approval: patch {review.patch_id} approved by {decision.by} and applied to {review.file}; client hot-swapped ({follow.key})"
    else:
        follow = continuation(
            outcome, _spec_of(state, outcome), suffix=f"r{review.patch_id}", early_stop=False
        )
        line = f"approval: patch {review.patch_id} rejected by {decision.by}; training continues unchanged ({follow.key})"
    ctx.store.log_event(line, study_id=state["study_id"])
    ctx.say(line)
    queue = list(state.get("queue") or [])
    return Command(
        goto="runner",
        update={"pending_patch": None, "decisions": [decision], "queue": [follow, *queue], "log": [line]},
    )
