"""Refreshing a `DataTable` in place: rows replaced, the cursor kept on the same record."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.text import Text
from textual.widgets import DataTable

__all__ = ["Cell", "cut", "refill", "selected_key"]

Cell = str | Text


def refill(table: DataTable[Cell], rows: Iterable[tuple[str, Sequence[Cell]]]) -> None:
    """Replace the rows of ``table`` by ``(key, cells)`` pairs, keeping the cursor on the same key
    when it is still there (else on the same row number)."""
    before = selected_key(table)
    row_number = table.cursor_row
    table.clear()
    keys = []
    for key, cells in rows:
        table.add_row(*cells, key=key)
        keys.append(key)
    if not keys:
        return
    target = keys.index(before) if before in keys else min(row_number, len(keys) - 1)
    table.move_cursor(row=max(target, 0), animate=False)


def selected_key(table: DataTable[Cell]) -> str | None:
    """Key of the row under the cursor, or ``None`` when the table is empty."""
    if table.row_count == 0:
        return None
    row_key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
    return row_key.value


def cut(text: str, width: int) -> str:
    """``text`` as it fits in ``width`` characters: cut with an ellipsis (``…``) when longer."""
    return text if len(text) <= width else text[: width - 1] + "…"
