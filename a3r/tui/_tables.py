"""Refreshing a `DataTable` in place: rows replaced, the cursor kept on the same record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from rich.text import Text
from textual.screen import Screen
from textual.widgets import DataTable

from memory import StoreError

__all__ = ["on_stack", "read_store", "refill", "selected_key"]

_T = TypeVar("_T")

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


def on_stack(screen: Screen[Any]) -> bool:
    """Whether ``screen`` is still on the app's screen stack (after an ``await`` it may have been
    popped, and its widgets are being removed)."""
    return screen in screen.app.screen_stack


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
