"""Refreshing a `DataTable` in place: rows replaced, the cursor kept on the same record."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.text import Text
from textual.widgets import DataTable

__all__ = ["Cell", "cut", "fix_width", "refill", "selected_key"]

Cell = str | Text


def refill(
    table: DataTable[Cell], rows: Iterable[tuple[str, Sequence[Cell]]], *, height: int | None = 1
) -> None:
    """Replace the rows of ``table`` by ``(key, cells)`` pairs, keeping the cursor on the same key
    when it is still there (else on the same row number).

    Args:
        table: The table.
        rows: ``(key, cells)`` pairs, top to bottom.
        height: Lines of each row; ``None``: as many as its cells take (text wrapped in a column of
            fixed width, see `fix_width`).
    """
    before = selected_key(table)
    row_number = table.cursor_row
    table.clear()
    keys = []
    for key, cells in rows:
        table.add_row(*cells, key=key, height=height)
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


def fix_width(table: DataTable[Cell], column: int, width: int) -> None:
    """Give the ``column``-th column of ``table`` a fixed ``width`` (cells): its text wraps there, in
    rows of automatic height (`refill` with ``height=None``), instead of widening the column."""
    found = table.ordered_columns[column]
    if found.auto_width or found.width != width:
        found.auto_width, found.width = False, width
        table.refresh(layout=True)


def cut(text: str, width: int) -> str:
    """``text`` as it fits in ``width`` characters: cut with an ellipsis (``…``) when longer."""
    return text if len(text) <= width else text[: width - 1] + "…"
