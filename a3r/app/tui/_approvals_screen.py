"""`ApprovalsScreen`: the patches waiting for a human decision."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Header, Static

from a3r.app.tui._context import TuiContext
from a3r.app.tui._patch_screen import PatchScreen
from a3r.app.tui._polling import RELOAD_GROUP, PollingScreen, read_store
from a3r.app.tui._tables import Cell, refill
from memory import PatchPublic

__all__ = ["ApprovalsScreen", "age_text"]


def age_text(since: datetime, now: datetime | None = None) -> str:
    """How long ago ``since`` was, in the largest whole unit (``"42s"``, ``"5m"``, ``"3h"``, ``"2d"``)."""
    seconds = max(0, int(((now or datetime.now(UTC)) - since).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class ApprovalsScreen(PollingScreen):
    """Pending patches, oldest first; Enter reviews one.

    | key    | action               |
    |--------|----------------------|
    | Enter  | review the patch     |
    | Escape | back                 |

    Args:
        ctx: The session context.
        study_id: Only patches of this study (``None``: of every study).
    """

    DEFAULT_CSS = """
    ApprovalsScreen #pending {
        height: 1fr;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, ctx: TuiContext, study_id: int | None = None) -> None:
        super().__init__(ctx)
        self.study_id = study_id
        self.title = "Pending approvals" + (f" of study {study_id}" if study_id is not None else "")
        self._patches: dict[str, PatchPublic] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("No patch waits for a decision.", id="none-pending")
        yield DataTable(id="pending", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#pending", DataTable)
        table.add_columns("patch", "study", "artifact", "by", "age", "rationale")

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
            self.query_one("#pending", DataTable),
            (
                (
                    str(p.id),
                    (
                        str(p.id),
                        str(p.study_id),
                        f"{p.artifact_name} v{p.base_version}",
                        p.proposed_by,
                        age_text(p.created_at),
                        _cut(p.rationale.splitlines()[0] if p.rationale else "", room),
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


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
