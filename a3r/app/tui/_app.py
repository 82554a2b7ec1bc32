"""`A3RApp`: the Textual application."""

from __future__ import annotations

import asyncio
from typing import ClassVar, TypedDict

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType

from a3r.app.tui._approvals_screen import ApprovalsScreen
from a3r.app.tui._config import TuiConfig
from a3r.app.tui._context import DecisionHookError, TuiContext
from a3r.app.tui._decision import Decision, DecisionHook
from a3r.app.tui._findings_screen import FindingsScreen
from a3r.app.tui._patch_screen import PatchScreen
from a3r.app.tui._polling import read_store
from a3r.app.tui._studies_screen import StudiesScreen
from a3r.app.tui._study_screen import StudyScreen
from a3r.app.tui._tokens import Detokenizer
from memory import InvalidTransition, PatchPublic, Store, StoreError

__all__ = ["A3RApp", "AppOptions"]


class AppOptions(TypedDict, total=False):
    """The keyword arguments of `A3RApp` (their meaning is documented there), for functions that pass
    them on (`a3r.app.tui.run_tui`)."""

    config: TuiConfig | None
    on_decision: DecisionHook | None
    detokenize: Detokenizer | None
    study_id: int | None
    approvals: bool


class A3RApp(App[None]):
    """Oversight of studies and runs, and approval of patches, in the terminal.

    Starts on the list of studies (or on one study). New pending patches are announced as they
    appear; the header counts those waiting.

    | key    | where        | action                            |
    |--------|--------------|-----------------------------------|
    | p      | everywhere   | pending approvals                 |
    | f      | everywhere   | findings                          |
    | Enter  | lists        | open the highlighted row          |
    | Escape | any screen   | back                              |
    | q      | everywhere   | quit                              |
    | a / r  | a patch      | approve / reject (asks for a note)|

    Args:
        store: The knowledge store (the app does not close it).
        config: Settings; defaults when ``None``.
        on_decision: Called as ``on_decision(patch_id, approved, note)`` after each decision was
            written to the store (see `a3r.app.tui.DecisionHook`).
        detokenize: Token ids to text for the episode view; ``None`` shows ids.
        study_id: Open this study first (``Escape`` goes to the list).
        approvals: Open the pending approvals first.
    """

    TITLE = "A3R"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("p", "approvals", "Approvals"),
        Binding("f", "findings", "Findings"),
    ]

    def __init__(
        self,
        store: Store,
        *,
        config: TuiConfig | None = None,
        on_decision: DecisionHook | None = None,
        detokenize: Detokenizer | None = None,
        study_id: int | None = None,
        approvals: bool = False,
    ) -> None:
        super().__init__()
        self.ctx = TuiContext(store, config or TuiConfig(), detokenize=detokenize, on_decision=on_decision)
        self._start_study = study_id
        self._start_approvals = approvals
        self._announced: set[int] = set()
        self._first_poll_done = False
        self._hook_lock = asyncio.Lock()

    def on_mount(self) -> None:
        self.push_screen(StudiesScreen(self.ctx))
        if self._start_study is not None:
            self.push_screen(StudyScreen(self.ctx, self._start_study))
        if self._start_approvals:
            self.push_screen(ApprovalsScreen(self.ctx, study_id=self._start_study))
        self.watch_pending()
        self.set_interval(self.ctx.config.refresh_s, self.watch_pending)

    def action_approvals(self) -> None:
        if not isinstance(self.screen, ApprovalsScreen):
            self.push_screen(ApprovalsScreen(self.ctx))

    def action_findings(self) -> None:
        if not isinstance(self.screen, FindingsScreen):
            self.push_screen(FindingsScreen(self.ctx))

    def on_patch_screen_decision_taken(self, message: PatchScreen.DecisionTaken) -> None:
        self.record_decision(message.patch, message.decision)

    @work(group="decisions")
    async def record_decision(self, patch: PatchPublic, decision: Decision) -> None:
        """Write a decision to the store, then call ``on_decision`` (hook calls one at a time, in order).

        A patch decided meanwhile by someone else is reported and left as it is; no hook is called.
        """
        try:
            recorded = await self.ctx.decide(patch.id, decision)
        except InvalidTransition as exc:
            self.notify(str(exc), title="already decided", severity="error", timeout=10)
            return
        except StoreError as exc:
            self.notify(str(exc), title="store", severity="error", timeout=10)
            return
        self.notify(
            f"patch {recorded.id} {recorded.status.value} by {recorded.decided_by}", title="decision recorded"
        )
        async with self._hook_lock:
            try:
                await self.ctx.call_hook(recorded, decision)
            except DecisionHookError as exc:
                self.notify(str(exc), title="on_decision", severity="error", timeout=15)

    @work(exclusive=True, group="pending")
    async def watch_pending(self) -> None:
        """Announce patches that started waiting for a decision."""
        pending = await read_store(self.screen, self.ctx.store.pending_patches)
        if pending is None:
            return
        fresh = [patch for patch in pending if patch.id not in self._announced]
        self._announced.update(patch.id for patch in fresh)
        if len(fresh) > 1 and not self._first_poll_done:  # the backlog at start-up: one line
            self.notify(f"{len(fresh)} patches await approval: press p", title="approval needed")
        else:
            for patch in fresh:
                self.notify(
                    f"patch #{patch.id} to {patch.artifact_name} (study {patch.study_id}) awaits approval: press p",
                    title="approval needed",
                )
        self._first_poll_done = True
