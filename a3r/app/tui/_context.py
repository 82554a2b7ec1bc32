"""What every screen of the TUI shares: the store, the settings, the detokenizer and the decision path."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from a3r.app.tui._config import TuiConfig
from a3r.app.tui._decision import Decision, DecisionHook
from a3r.app.tui._tokens import Detokenizer
from a3r.swarmops.credentials import read_admin_token
from memory import PatchPublic, Store

__all__ = ["DecisionHookError", "TuiContext"]

_R = TypeVar("_R")


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
        on_decision: Called after each decision was recorded (see `a3r.app.tui.DecisionHook`).
    """

    store: Store
    config: TuiConfig
    detokenize: Detokenizer | None = None
    on_decision: DecisionHook | None = None

    def admin_token_for(self, run_dir: str | None) -> str | None:
        """The admin token for a run's server: ``--admin-token`` (or ``SWARM_ADMIN_TOKEN``) when given,
        else the one a3r wrote, mode 0600, into the run's server dir (`a3r.swarmops.credentials`)."""
        token = self.config.admin_token
        return token.get_secret_value() if token is not None else read_admin_token(run_dir)

    async def decide(self, patch_id: int, decision: Decision) -> PatchPublic:
        """Record a decision in the store (in a worker thread) and log it as a study event.

        Returns:
            The patch as recorded (status ``approved`` or ``rejected``).

        Raises:
            memory.InvalidTransition: The patch was decided already (by someone else).
            memory.StoreError: The store cannot be written.
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
        return patch

    async def call_hook(self, patch: PatchPublic, decision: Decision) -> None:
        """Call ``on_decision(patch.id, decision.approved, decision.note)``, if there is a hook.

        A coroutine function is awaited on the loop; a plain function runs in a daemon thread of its
        own (it may block for long, e.g. resume a graph that trains until its next interrupt; quitting
        the TUI does not wait for it).

        Raises:
            DecisionHookError: The hook raised.
        """
        hook = self.on_decision
        if hook is None:
            return
        try:
            if inspect.iscoroutinefunction(hook):
                await hook(patch.id, decision.approved, decision.note)
            else:
                result = await _in_daemon_thread(hook, patch.id, decision.approved, decision.note)
                if inspect.isawaitable(result):
                    await result
        except Exception as exc:
            raise DecisionHookError(patch, exc) from exc


async def _in_daemon_thread(fn: Callable[..., _R], *args: object) -> _R:
    """Run ``fn(*args)`` in a new daemon thread and await its result (or exception)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_R] = loop.create_future()

    def target() -> None:
        try:
            value = fn(*args)
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_reject, future, exc)
        else:
            loop.call_soon_threadsafe(_resolve, future, value)

    threading.Thread(target=target, name="a3r-tui-on-decision", daemon=True).start()
    return await future


def _resolve(future: asyncio.Future[_R], value: _R) -> None:
    if not future.done():  # not cancelled meanwhile (the app quit)
        future.set_result(value)


def _reject(future: asyncio.Future[_R], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
