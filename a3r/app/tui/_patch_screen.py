"""`PatchScreen`: review one patch and decide; the decision goes to the store and to ``on_decision``."""

from __future__ import annotations

from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header

from a3r.app.tui._context import TuiContext
from a3r.app.tui._decision import Decision
from a3r.app.tui._decision_dialog import DecisionDialog
from a3r.app.tui._episode_screen import EpisodeScreen
from a3r.app.tui._evidence import gather_evidence
from a3r.app.tui._patch_view import PatchView
from a3r.app.tui._polling import on_stack, read_store
from memory import PatchPublic

__all__ = ["PatchScreen"]


class PatchScreen(Screen[None]):
    """Review of one patch (`PatchView`), the approval dialog, and the decision.

    On ``a`` or ``r`` (or the buttons) the `DecisionDialog` asks for confirmation and a note; a
    worker awaits it, posts `DecisionTaken` to the app (which records it with `TuiContext.decide`, then
    calls ``on_decision``) and goes back to the list.

    | key    | action                         |
    |--------|--------------------------------|
    | a      | approve                        |
    | r      | reject                         |
    | Escape | back without deciding          |

    Args:
        ctx: The session context.
        patch: The patch to review.
    """

    class DecisionTaken(Message):
        """The reviewer confirmed a decision (posted to the app, which records it and calls the hook)."""

        def __init__(self, patch: PatchPublic, decision: Decision) -> None:
            self.patch = patch
            self.decision = decision
            super().__init__()

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, ctx: TuiContext, patch: PatchPublic) -> None:
        super().__init__()
        self.ctx = ctx
        self.patch = patch
        self.title = f"Patch #{patch.id}"
        self.sub_title = f"{patch.artifact_name} · study {patch.study_id}"

    def compose(self) -> ComposeResult:
        yield Header()
        yield PatchView(id="patch")
        yield Footer()

    def on_mount(self) -> None:
        view = self.query_one(PatchView)
        view.patch = self.patch
        view.query_one("#patch-text").focus()
        self.load_evidence()

    @work(exclusive=True, group="evidence")
    async def load_evidence(self) -> None:
        """Re-read the patch and resolve the evidence its rationale cites."""
        read = await read_store(
            self,
            lambda: (self.ctx.store.get_patch(self.patch.id), gather_evidence(self.ctx.store, self.patch)),
        )
        if read is None:
            return
        view = self.query_one(PatchView)
        self.patch, view.evidence = read
        view.patch = self.patch

    @on(PatchView.DecisionRequested)
    def _decision_requested(self, event: PatchView.DecisionRequested) -> None:
        self.decide(event.approve)

    @work(exclusive=True, group="decision")
    async def decide(self, approve: bool) -> None:
        """Ask for confirmation and a note; hand the decision to the app and go back to the list."""
        decision = await self.app.push_screen_wait(DecisionDialog(self.patch, approve))
        if decision is None or not on_stack(self):
            return
        # Posted to the app, whose worker outlives this screen: the store write and the hook happen
        # even if the reviewer leaves at once.
        self.app.post_message(self.DecisionTaken(self.patch, decision))
        self.dismiss(None)

    @on(PatchView.EpisodeOpened)
    def _episode_opened(self, event: PatchView.EpisodeOpened) -> None:
        if event.server_url is None:
            self.notify(
                "no run of this study recorded a server to fetch the episode from", severity="warning"
            )
            return
        self.app.push_screen(EpisodeScreen(self.ctx, event.server_url, event.episode_id))
