"""`StudiesScreen`: every study with its status, runs and pending patches (the home screen)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from textual import on, work
from textual.widgets import DataTable, Static

from a3r.app.tui._context import TuiContext
from a3r.app.tui._polling import RELOAD_GROUP, read_store
from a3r.app.tui._study_screen import StudyScreen
from a3r.app.tui._table_screen import TableScreen
from a3r.app.tui._tables import cut, refill
from memory import RunStatus, StudyPublic

__all__ = ["StudiesScreen"]


@dataclass(frozen=True)
class _Snapshot:
    studies: list[StudyPublic]
    runs: Counter[int]
    running: Counter[int]
    pending: Counter[int]


class StudiesScreen(TableScreen):
    """The list of studies; Enter opens one.

    | key   | action                  |
    |-------|-------------------------|
    | Enter | open the study          |
    | p     | pending approvals       |
    | f     | findings of all studies |
    | q     | quit                    |
    """

    TABLE_ID = "studies"
    COLUMNS = ("id", "status", "kind", "runs", "running", "pending", "question")
    NOTE = ("No study yet: start one with `a3r research` or `a3r vibe`.", "empty")

    def __init__(self, ctx: TuiContext) -> None:
        super().__init__(ctx)
        self.title = "A3R"
        self.sub_title = "studies"

    def _read(self) -> _Snapshot:
        store = self.ctx.store
        runs = store.runs()
        return _Snapshot(
            studies=store.studies(),
            runs=Counter(run.study_id for run in runs),
            running=Counter(run.study_id for run in runs if run.status is RunStatus.running),
            pending=Counter(patch.study_id for patch in store.pending_patches()),
        )

    @work(exclusive=True, group=RELOAD_GROUP)
    async def reload(self) -> None:
        """Re-read the studies (a store read in a worker thread)."""
        snapshot = await read_store(self, self._read)
        if snapshot is None:
            return
        self.query_one("#empty", Static).display = not snapshot.studies
        waiting = sum(snapshot.pending.values())
        self.sub_title = f"studies · {waiting} patch(es) await approval (p)" if waiting else "studies"
        room = max(20, self.size.width - 50)
        refill(
            self.table,
            (
                (
                    str(study.id),
                    (
                        str(study.id),
                        study.status.value,
                        study.kind,
                        str(snapshot.runs[study.id]),
                        str(snapshot.running[study.id]),
                        str(snapshot.pending[study.id]),
                        cut(study.question, room),
                    ),
                )
                for study in snapshot.studies
            ),
        )

    @on(DataTable.RowSelected, "#studies")
    def _selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.app.push_screen(StudyScreen(self.ctx, int(event.row_key.value)))
