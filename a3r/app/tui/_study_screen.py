"""`StudyScreen`: one study: its plan and hypotheses, its runs with reward curves, its event log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.console import Group, RenderableType
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Footer, Header, RichLog, Static, TabbedContent, TabPane

from a3r.app.metric_text import KEY_METRICS, number_text
from a3r.app.tui._context import TuiContext
from a3r.app.tui._metric_names import reward_history
from a3r.app.tui._polling import RELOAD_GROUP, PollingScreen, read_store
from a3r.app.tui._reward_curve import RewardCurve
from a3r.app.tui._run_dir import tenant_text
from a3r.app.tui._run_screen import RunScreen
from a3r.app.tui._tables import Cell, refill, selected_key
from a3r.study.headline import conclusion_line
from memory import (
    NOT_METRICS,
    CodeArtifactPublic,
    EventPublic,
    ExperimentPublic,
    FindingPublic,
    HypothesisPublic,
    RunWithMetrics,
    StudyPublic,
)

__all__ = ["StudyScreen", "metrics_text"]

_LEVEL_STYLE = {"debug": "dim", "info": "", "warning": "yellow", "error": "bold red"}


def metrics_text(values: dict[str, float] | None, width: int = 40) -> str:
    """``name=value`` pairs, the key metrics first (`a3r.app.metric_text.KEY_METRICS`' order: reward, eval,
    loss, kl …, then the rest by name), each at a readable precision (`a3r.app.metric_text.number_text`), cut
    to ``width`` characters; fields that are not measurements (`memory.NOT_METRICS`) left out."""
    values = {name: value for name, value in (values or {}).items() if name not in NOT_METRICS}
    first = [name for name in KEY_METRICS if name in values]
    names = first + sorted(name for name in values if name not in first)
    text = "  ".join(f"{name}={number_text(values[name])}" for name in names)
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True)
class _Snapshot:
    study: StudyPublic
    hypotheses: list[HypothesisPublic]
    experiments: list[ExperimentPublic]
    artifacts: list[CodeArtifactPublic]
    runs: list[RunWithMetrics]
    events: list[EventPublic]
    findings: list[FindingPublic]


class StudyScreen(PollingScreen):
    """One study in three tabs: plan, runs (with the reward curve of the highlighted run), events.

    | key     | action                              |
    |---------|-------------------------------------|
    | 1 2 3   | plan, runs, events tab              |
    | Enter   | on a run: open the run              |
    | p       | pending approvals of this study     |
    | f       | findings of this study              |
    | Escape  | back to the studies                 |

    Args:
        ctx: The session context.
        study_id: The study shown.
    """

    DEFAULT_CSS = """
    StudyScreen #runs {
        height: 1fr;
    }
    StudyScreen #plan {
        padding: 0 1;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("1", "tab('plan')", "Plan"),
        Binding("2", "tab('runs-tab')", "Runs"),
        Binding("3", "tab('events-tab')", "Events"),
        Binding("p", "approvals", "Approvals"),
        Binding("f", "findings", "Findings"),
    ]

    def __init__(self, ctx: TuiContext, study_id: int) -> None:
        super().__init__(ctx)
        self.study_id = study_id
        self.title = f"Study {study_id}"
        self._last_event_id: int | None = None
        self._runs: dict[str, RunWithMetrics] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial="runs-tab"):
            with TabPane("Plan", id="plan"), VerticalScroll(id="plan-scroll", can_focus=True):
                yield Static(id="plan-text")
            with TabPane("Runs", id="runs-tab"):
                yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
                yield RewardCurve(id="study-curve")
            with TabPane("Events", id="events-tab"):
                yield RichLog(id="events", max_lines=self.ctx.config.event_tail, wrap=True, markup=False)
        yield Footer()

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#runs", DataTable)
        table.add_columns("run", "name", "experiment", "seed", "status", "step", "latest metrics")
        self.query_one(RewardCurve).placeholder = "no run yet"
        table.focus()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        focus = {"plan": "#plan-scroll", "runs-tab": "#runs", "events-tab": "#events"}
        self.query_one(focus[event.pane.id or "runs-tab"]).focus()

    def action_approvals(self) -> None:
        from a3r.app.tui._approvals_screen import ApprovalsScreen

        self.app.push_screen(ApprovalsScreen(self.ctx, study_id=self.study_id))

    def action_findings(self) -> None:
        from a3r.app.tui._findings_screen import FindingsScreen

        self.app.push_screen(FindingsScreen(self.ctx, study_id=self.study_id))

    def _read(self) -> _Snapshot:
        store = self.ctx.store
        return _Snapshot(
            study=store.get_study(self.study_id),
            hypotheses=store.hypotheses(self.study_id),
            experiments=store.experiments(self.study_id),
            artifacts=store.artifacts(self.study_id),
            runs=store.study_runs(self.study_id),
            events=store.events(
                study_id=self.study_id, after_id=self._last_event_id, limit=self.ctx.config.event_tail
            )
            if self._last_event_id is not None
            else store.events(study_id=self.study_id)[-self.ctx.config.event_tail :],
            findings=store.findings(self.study_id),
        )

    @work(exclusive=True, group=RELOAD_GROUP)
    async def reload(self) -> None:
        """Re-read the study (a store read in a worker thread) and update the three tabs."""
        snapshot = await read_store(self, self._read)
        if snapshot is None:
            return
        self.sub_title = f"{snapshot.study.status.value} · {snapshot.study.question}"
        self.query_one("#plan-text", Static).update(_plan(snapshot))
        experiments = {exp.id: exp.name for exp in snapshot.experiments}
        self._runs = {str(run.id): run for run in snapshot.runs}
        table: DataTable[Cell] = self.query_one("#runs", DataTable)
        room = max(40, self.size.width - 60)  # what the other columns leave of the screen's width
        refill(
            table,
            (
                (
                    str(run.id),
                    (
                        str(run.id),
                        " · ".join(x for x in (run.name or "", tenant_text(run.config)) if x),
                        experiments.get(run.experiment_id, str(run.experiment_id)),
                        "" if run.seed is None else str(run.seed),
                        _status_text(run),
                        "" if run.latest_step is None else str(run.latest_step),
                        metrics_text(run.latest_metrics or run.final_metrics, room),
                    ),
                )
                for run in snapshot.runs
            ),
        )
        log = self.query_one("#events", RichLog)
        for event in snapshot.events:
            stamp = event.created_at.strftime("%H:%M:%S")
            run = f" run {event.run_id}" if event.run_id is not None else ""
            log.write(Text(f"{stamp} {event.level.value:<7}{run} {event.message}", _LEVEL_STYLE[event.level]))
            self._last_event_id = event.id
        self.load_curve(selected_key(table))

    @on(DataTable.RowHighlighted, "#runs")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.load_curve(event.row_key.value)

    @on(DataTable.RowSelected, "#runs")
    def _selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.app.push_screen(RunScreen(self.ctx, int(event.row_key.value)))

    @work(exclusive=True, group="curve")
    async def load_curve(self, run_key: str | None) -> None:
        """Draw the reward curve of one run from its metric history in the store."""
        curve = self.query_one(RewardCurve)
        if run_key is None:
            curve.show("reward", [])  # no run in the table: the placeholder says so
            return
        run_id = int(run_key)
        read = await read_store(self, lambda: reward_history(self.ctx.store, run_id))
        if read is None:
            return
        name, values = read
        run = self._runs.get(run_key)
        label = f"run {run_id}" + (f" ({run.name})" if run is not None and run.name else "")
        curve.placeholder = "no metric recorded yet"
        curve.show(f"{label} {name}", values)


def _status_text(run: RunWithMetrics) -> Text:
    style = {"running": "bold cyan", "finished": "green", "failed": "bold red", "cancelled": "yellow"}
    return Text(run.status.value, style=style.get(run.status.value, ""))


def _plan(snapshot: _Snapshot) -> RenderableType:
    study = snapshot.study
    parts: list[RenderableType] = [
        Text.assemble(("Question ", "bold"), study.question),
        Text.assemble(("Status ", "bold"), f"{study.status.value} ({study.kind})"),
    ]
    if study.conclusion:  # the one plain line first, the conclusion it was read from below it
        line = conclusion_line(study.conclusion, snapshot.findings, question=study.question, kind=study.kind)
        parts.append(Text.assemble(("Verdict ", "bold"), (line, "bold")))
        if line != study.conclusion:
            parts.append(Text.assemble(("Derivation ", "bold"), (study.conclusion, "dim")))
    parts.append(Text("Hypotheses", style="bold underline"))
    for h in snapshot.hypotheses:
        parts.append(Text(f"H{h.id}. {h.statement}"))
        parts.append(Text(f"    expect: {h.expected_outcome}\n    decide: {h.decision_rule}", style="dim"))
    if not snapshot.hypotheses:
        parts.append(Text("none registered", style="italic"))
    parts.append(Text("Experiments", style="bold underline"))
    for exp in snapshot.experiments:
        tests = f" tests H{exp.hypothesis_id}" if exp.hypothesis_id is not None else ""
        template = f" [{exp.template}]" if exp.template else ""
        n_runs = sum(1 for run in snapshot.runs if run.experiment_id == exp.id)
        parts.append(Text(f"E{exp.id} {exp.name}{template}{tests}, {n_runs} run(s)"))
        if exp.description:
            parts.append(Text(f"    {exp.description}", style="dim"))
    if not snapshot.experiments:
        parts.append(Text("none planned", style="italic"))
    latest: dict[str, CodeArtifactPublic] = {}
    for artifact in snapshot.artifacts:
        latest[artifact.name] = artifact
    if latest:
        parts.append(Text("Code", style="bold underline"))
        parts.extend(Text(f"{a.kind.value} {a.name} v{a.version}") for a in latest.values())
    return Group(*parts)
