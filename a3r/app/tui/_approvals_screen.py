"""`ApprovalsScreen`: the patches waiting for a human decision."""

from __future__ import annotations

from datetime import UTC, datetime

from textual import on, work
from textual.widgets import DataTable, Static

from a3r.app.tui._context import TuiContext
from a3r.app.tui._patch_screen import PatchScreen
from a3r.app.tui._polling import RELOAD_GROUP, read_store
from a3r.app.tui._table_screen import StudyTableScreen
from a3r.app.tui._tables import cut, refill
from memory import PatchPublic

__all__ = ["ApprovalsScreen", "age_text"]


def age_text(since: datetime, now: datetime | None = None) -> str:
    """How long ago ``since`` was, in the largest whole unit (``"42s"``, ``"5m"``, ``"3h"``, ``"2d"``)."""
    seconds = max(0, int(((now or datetime.now(UTC)) - since).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class ApprovalsScreen(StudyTableScreen):
    """Pending patches (of one study, or all), oldest first; Enter reviews one.

    | key    | action               |
    |--------|----------------------|
    | Enter  | review the patch     |
    | Escape | back                 |
    """

    DEFAULT_CSS = """
    ApprovalsScreen #pending {
        height: 1fr;
    }
    """

    TITLE_TEXT = "Pending approvals"
    TABLE_ID = "pending"
    COLUMNS = ("patch", "study", "artifact", "by", "age", "rationale")
    NOTE = ("No patch waits for a decision.", "none-pending")

    def __init__(self, ctx: TuiContext, study_id: int | None = None) -> None:
        super().__init__(ctx, study_id)
        self._patches: dict[str, PatchPublic] = {}

    @work(exclusive=True, group=RELOAD_GROUP)
    async def reload(self) -> None:
        """Re-read the pending patches (a store read in a worker thread)."""
        patches = await read_store(self, lambda: self.ctx.store.pending_patches(self.study_id))
        if patches is None:
            return
        self._patches = {str(p.id): p for p in patches}
        room = max(20, self.size.width - 50)  # the rationale's first line; the review shows it all
        self.query_one("#none-pending", Static).display = not patches
        refill(
            self.table,
            (
                (
                    str(p.id),
                    (
                        str(p.id),
                        str(p.study_id),
                        f"{p.artifact_name} v{p.base_version}",
                        p.proposed_by,
                        age_text(p.created_at),
                        cut(p.rationale.splitlines()[0] if p.rationale else "", room),
                    ),
                )
                for p in patches
            ),
        )

    @on(DataTable.RowSelected, "#pending")
    def _selected(self, event: DataTable.RowSelected) -> None:
        patch = self._patches.get(event.row_key.value or "")
        if patch is not None:
            self.app.push_screen(PatchScreen(self.ctx, patch))
