"""`FindingsScreen`: findings (of one study, or all) with the detail of the highlighted one."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.widgets import DataTable, Static

from a3r.app.tui._context import TuiContext
from a3r.app.tui._polling import RELOAD_GROUP, read_store
from a3r.app.tui._table_screen import StudyTableScreen
from a3r.app.tui._tables import fix_width, refill
from a3r.study.headline import evidence_lines, headline, verdict_label
from memory import FindingPublic

__all__ = ["FindingsScreen"]

_STATUS_STYLE = {"confirmed": "bold green", "refuted": "red", "unconfirmed": "yellow", "not run": "dim"}


def _status_cell(finding: FindingPublic) -> Text:
    """The finding's verdict label (`a3r.study.headline.verdict_label`), coloured by its first word."""
    label = verdict_label(finding.status.value, finding.evidence)
    return Text(label, style=_STATUS_STYLE.get(label.split(",")[0], ""))


class FindingsScreen(StudyTableScreen):
    """Findings (of one study, or all) with status and confidence; the highlighted one is shown in full
    below the table.

    | key    | action |
    |--------|--------|
    | ↑ ↓    | choose |
    | Escape | back   |
    """

    DEFAULT_CSS = """
    FindingsScreen #findings {
        height: 1fr;
    }
    FindingsScreen #finding {
        height: auto;
        max-height: 14;
        border-top: solid $primary-darken-2;
        padding: 0 1;
    }
    """

    TITLE_TEXT = "Findings"
    TABLE_ID = "findings"
    COLUMNS = ("id", "study", "status", "conf", "verdict")
    DETAIL = ("no finding yet", "finding")

    def __init__(self, ctx: TuiContext, study_id: int | None = None) -> None:
        super().__init__(ctx, study_id)
        self._findings: dict[str, FindingPublic] = {}
        self._lines: dict[str, str] = {}  # the one plain line of each finding (`a3r.study.headline`)

    def _read(self) -> tuple[list[FindingPublic], dict[str, str]]:
        store = self.ctx.store
        studies = [store.get_study(self.study_id)] if self.study_id is not None else store.studies()
        findings = [finding for study in studies for finding in store.findings(study.id)]
        asked = {study.id: study for study in studies}
        lines = {
            str(f.id): headline(
                f.statement,
                f.evidence,
                question=asked[f.study_id].question,
                kind=asked[f.study_id].kind,
                status=f.status.value,
            )
            for f in findings
        }
        return findings, lines

    @work(exclusive=True, group=RELOAD_GROUP)
    async def reload(self) -> None:
        """Re-read the findings (a store read in a worker thread)."""
        read = await read_store(self, self._read)
        if read is None:
            return
        findings, self._lines = read
        self._findings = {str(f.id): f for f in findings}
        labels = [_status_cell(f) for f in findings]
        # the verdict column: what the id, study, status (its longest label) and conf columns leave;
        # the plain line wraps there whole (its interval included), the derivation shows below
        room = max(20, self.size.width - 25 - max((len(label) for label in labels), default=11))
        table = self.table
        fix_width(table, len(self.COLUMNS) - 1, room)
        refill(
            table,
            (
                (
                    str(f.id),
                    (
                        str(f.id),
                        str(f.study_id),
                        label,
                        f"{f.confidence:.2f}",
                        self._lines[str(f.id)],
                    ),
                )
                for f, label in zip(findings, labels, strict=True)
            ),
            height=None,
        )
        if table.row_count:
            key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
            self._show(key.value)

    @on(DataTable.RowHighlighted, "#findings")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show(event.row_key.value)

    def _show(self, key: str | None) -> None:
        finding = self._findings.get(key or "")
        if finding is None:
            return
        seeds = ", ".join(map(str, finding.seeds)) or "none"
        runs = ", ".join(map(str, finding.run_ids)) or "none"
        line = self._lines.get(str(finding.id), finding.statement)
        evidence = "".join(f"\n· {item}" for item in evidence_lines(finding.evidence or ""))
        self.query_one("#finding", Static).update(
            Text.assemble(
                (line, "bold"),
                f"\n{finding.statement}" if line != finding.statement else "",
                (evidence, "dim"),
                f"\nseeds {seeds} · evidence runs {runs}",
                f" · hypothesis H{finding.hypothesis_id}" if finding.hypothesis_id is not None else "",
            )
        )
