"""`PollingScreen`: a screen that re-reads its data while it is shown, and only then."""

from __future__ import annotations

from textual.screen import Screen

from a3r.tui._context import TuiContext

__all__ = ["PollingScreen"]


class PollingScreen(Screen[None]):
    """Base of the TUI's screens: calls `reload` when shown and every ``refresh_s`` while current.

    Screens under the current one in the stack do not poll (no store reads nor HTTP requests for what
    nobody sees); they reload as soon as they are shown again.

    Args:
        ctx: The session context.
    """

    def __init__(self, ctx: TuiContext) -> None:
        super().__init__()
        self.ctx = ctx

    def on_mount(self) -> None:
        # Textual calls the on_mount of every class in the MRO: subclasses need not call this one.
        self.set_interval(self.ctx.config.refresh_s, self._tick)

    def on_screen_resume(self) -> None:
        self.reload()

    def _tick(self) -> None:
        if self.is_current:
            self.reload()

    def reload(self) -> object:
        """Re-read what the screen shows; screens override this with an exclusive worker."""
        return None
