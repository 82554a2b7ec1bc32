"""What every screen of the TUI shares: the store, the settings, the detokenizer and the decision path."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass

from a3r.tui._config import TuiConfig
from a3r.tui._decision import Decision, DecisionHook
from a3r.tui._tokens import Detokenizer
from memory import PatchPublic, Store

__all__ = ["DecisionHookError", "TuiContext"]


class DecisionHookError(RuntimeError):
    """The ``on_decision`` hook failed; the decision itself is recorded in the store."""

    def __init__(self, patch: PatchPublic, cause: BaseException) -> None:
        super().__init__(
            f"patch {patch.id} {patch.status.value} in the store, but on_decision failed: "
            f"{type(cause).__name__}: {cause}"
        )
        self.patch = patch


@dataclass(frozen=True)
class TuiContext:
    """Shared state of one TUI session (read-only; the store is the state).

    Attributes:
        store: The knowledge store.
        config: Settings.
        detokenize: Token ids to text pieces for the token view; ``None`` shows ids.
        on_decision: Called after each decision was recorded (see `a3r.tui.DecisionHook`).
    """

    store: Store
    config: TuiConfig
    detokenize: Detokenizer | None = None
    on_decision: DecisionHook | None = None

    async def decide(self, patch_id: int, decision: Decision) -> PatchPublic:
        """Record a decision in the store, log it as a study event, then call ``on_decision``.

        The store write runs in a worker thread (the UI keeps drawing); a synchronous hook too.

        Returns:
            The patch as recorded (status ``approved`` or ``rejected``).

        Raises:
            memory.InvalidTransition: The patch was decided already (by someone else).
            memory.StoreError: The store cannot be written.
            DecisionHookError: The hook raised; the decision is recorded nonetheless.
        """
        reviewer = self.config.reviewer
        patch = await asyncio.to_thread(
            self.store.decide_patch, patch_id, approve=decision.approved, by=reviewer, note=decision.note
        )
        message = f"patch {patch.id} ({patch.artifact_name}) {patch.status.value} by {reviewer}"
        await asyncio.to_thread(
            self.store.log_event,
            message + (f": {decision.note}" if decision.note else ""),
            study_id=patch.study_id,
        )
        hook = self.on_decision
        if hook is None:
            return patch
        try:
            if inspect.iscoroutinefunction(hook):
                await hook(patch.id, decision.approved, decision.note)
            else:
                result = await asyncio.to_thread(hook, patch.id, decision.approved, decision.note)
                if inspect.isawaitable(result):
                    await result
        except Exception as exc:
            raise DecisionHookError(patch, exc) from exc
        return patch
