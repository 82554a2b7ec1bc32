"""`TableScreen`: a polling screen built around one row-cursor `DataTable`; `StudyTableScreen`: one
of those listing the records of one study or of every study."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Header, Static

from a3r.app.tui._context import TuiContext
from a3r.app.tui._polling import PollingScreen
from a3r.app.tui._tables import Cell

__all__ = ["StudyTableScreen", "TableScreen"]


class TableScreen(PollingScreen):
    """Header, the table (``#TABLE_ID``, columns `COLUMNS`, row cursor, zebra stripes) with an optional
    `Static` above it (`NOTE`) and one below it (`DETAIL`), footer.

    Subclasses set `TABLE_ID` and `COLUMNS` and fill the table in `reload`.

    Args:
        ctx: The session context.
    """

    TABLE_ID: ClassVar[str]
    """Widget id of the table."""
    COLUMNS: ClassVar[tuple[str, ...]]
    """Column labels, left to right."""
    NOTE: ClassVar[tuple[str, str] | None] = None
    """``(text, widget id)`` of a `Static` above the table (e.g. what to say while it is empty)."""
    DETAIL: ClassVar[tuple[str, str] | None] = None
    """``(text, widget id)`` of a `Static` below the table (e.g. the highlighted row in full)."""

    def compose(self) -> ComposeResult:
        yield Header()
        if self.NOTE is not None:
            yield Static(self.NOTE[0], id=self.NOTE[1])
        yield DataTable(id=self.TABLE_ID, cursor_type="row", zebra_stripes=True)
        if self.DETAIL is not None:
            yield Static(self.DETAIL[0], id=self.DETAIL[1])
        yield Footer()

    def on_mount(self) -> None:
        # Textual calls the on_mount of every class in the MRO (`PollingScreen`'s starts the polling).
        self.table.add_columns(*self.COLUMNS)

    @property
    def table(self) -> DataTable[Cell]:
        """The screen's table."""
        table: DataTable[Cell] = self.query_one(f"#{self.TABLE_ID}", DataTable)
        return table


class StudyTableScreen(TableScreen):
    """A `TableScreen` of one study's records, or of every study's; Escape goes back.

    Subclasses set `TITLE_TEXT` too; the title is it, followed by `` of study N`` when filtered.

    Args:
        ctx: The session context.
        study_id: Only records of this study (``None``: of every study).
    """

    TITLE_TEXT: ClassVar[str]
    """Title of the screen when it lists every study's records."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, ctx: TuiContext, study_id: int | None = None) -> None:
        super().__init__(ctx)
        self.study_id = study_id
        self.title = self.TITLE_TEXT + (f" of study {study_id}" if study_id is not None else "")
