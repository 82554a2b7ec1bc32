"""How screens refresh: `PollingScreen` re-reads while shown, `read_store` reads off the UI thread, and
`on_stack` tells a worker whether its screen is still there to draw on after an ``await``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from textual.screen import Screen

from a3r.app.tui._context import TuiContext
from memory import StoreError

__all__ = ["RELOAD_GROUP", "PollingScreen", "on_stack", "read_store"]

RELOAD_GROUP = "store"
"""Worker group of every screen's `PollingScreen.reload` (``@work(exclusive=True, group=RELOAD_GROUP)``)."""

_T = TypeVar("_T")


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
        # A poll still in flight (a slow server, a busy store) is left to finish rather than
        # restarted, or a server slower than ``refresh_s`` would never be shown.
        if self.is_current and not self.polling:
            self.reload()

    @property
    def polling(self) -> bool:
        """Whether a `reload` of this screen is still running."""
        return any(
            worker.node is self and worker.group == RELOAD_GROUP and not worker.is_finished
            for worker in self.workers
        )

    def reload(self) -> object:
        """Re-read what the screen shows; screens override this with an exclusive worker."""
        return None


def on_stack(screen: Screen[Any]) -> bool:
    """Whether ``screen`` is still on the app's screen stack and the app still runs (after an ``await``
    it may have been popped, or the app may be shutting down: Textual then removes every screen's
    widgets while the screens are still on the stack, so a worker that only checked the stack would
    look up widgets that are gone)."""
    return screen.app.is_running and screen.is_running and screen in screen.app.screen_stack


async def read_store(screen: Screen[Any], read: Callable[[], _T]) -> _T | None:
    """Run a store read in a worker thread for ``screen``.

    Returns:
        The result; ``None`` when the store failed (shown as a notification) or when the screen left
        the stack meanwhile (nothing left to draw on).
    """
    try:
        result = await asyncio.to_thread(read)
    except StoreError as exc:
        screen.notify(str(exc), title="store", severity="error")
        return None
    return result if on_stack(screen) else None
