"""The ``a3r`` command line.

Commands are registered on the Typer ``app``; `main` is the console-script entry point. To add a
command, decorate a function with ``@app.command()`` in this module (or in a module imported here).

Store commands (read the knowledge store; ``--store`` takes a SQLite path or a SQLAlchemy URL):

| command                 | what it prints                                          |
|-------------------------|---------------------------------------------------------|
| ``a3r runs``            | runs with status, seed and latest metrics (rich table)   |
| ``a3r findings``        | findings with status, confidence and evidence runs       |
| ``a3r export STUDY``    | a whole study as Markdown (default) or JSON              |
| ``a3r tui``             | the terminal UI: studies, runs, episodes, approvals      |

User mistakes (unknown study, missing store, malformed URL) end with exit code 1 and one line on
stderr, never a traceback.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.core
from rich.console import Console
from rich.table import Table
from rich.text import Text

from a3r.app.metric_text import KEY_METRICS, number_text
from a3r.study.headline import headline, verdict_label
from a3r.study.run_status import STORE_STATUS
from a3r.study.wording import counted
from memory import (
    DEFAULT_PATH,
    NOT_METRICS,
    FindingStatus,
    RunStatus,
)  # plain enums: no database layer loaded
from swarm.client.console_script import console_app

if TYPE_CHECKING:
    from memory import Store

__all__ = ["app", "main"]

_RESEARCH_MODULE = "a3r.app.commands"
_RESEARCH_COMMANDS = ("vibe", "research", "resume")
"""Commands defined in `a3r.app.commands`, imported only when one of them runs (or shows its own help):
that module loads the research agent (LangGraph, SciPy, Matplotlib), seconds that ``a3r --help``, a typo
and the store commands must not pay."""


def _docstrings(module: str, names: tuple[str, ...]) -> dict[str, str]:
    """The docstrings of the functions ``names`` in ``module``'s source, read without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return {}
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    return {
        node.name: ast.get_docstring(node) or ""
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in names
    }


class _LazyGroup(typer.core.TyperGroup):
    """The ``a3r`` group: the research commands are listed from their docstrings and imported on use.

    Until one of them is resolved, each is a placeholder holding its help text, so the listing, the
    "did you mean" hint of a typo and the store commands never import `a3r.app.commands`.
    """

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._listing = False
        for name, doc in _docstrings(_RESEARCH_MODULE, _RESEARCH_COMMANDS).items():
            self.commands[name] = typer.core.TyperCommand(name, help=doc)
        self._placeholders = set(_RESEARCH_COMMANDS) & set(self.commands)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in self._placeholders and not self._listing:
            self._load_research_commands()
        return super().get_command(ctx, cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """List each command with its docstring's whole first paragraph, wrapped (click would cut it)."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.commands[name]
            if not command.hidden:
                rows.append((name, " ".join((command.help or "").split("\n\n")[0].split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def _load_research_commands(self) -> None:
        from a3r.app.commands import register

        research = typer.Typer(**_PLAIN_HELP)
        research.callback()(lambda: None)  # a group even with one command
        register(research)
        loaded = typer.main.get_group(research)
        for name in self._placeholders:
            self.commands[name] = loaded.commands[name]
        self._placeholders = set()


_PLAIN_HELP: dict[str, Any] = {
    "rich_markup_mode": None,  # click's plain listing, as `swarm serve`: no ``<bool>`` beside flags
    "context_settings": {"max_content_width": 10_000},  # wrap at the terminal's width, not at 80
}
"""Help settings of every ``a3r`` command: click's plain formatter (``--flag TYPE  help``, wrapped help
text, whole flag names) at the terminal's width. Typer's boxed table shows ``<bool>`` beside on/off flags
and loads rich's help layer, which ``a3r --help`` need not pay."""

app = console_app(
    "a3r", "A3R: agentic RL of LLMs, run by an autonomous research agent.", cls=_LazyGroup, **_PLAIN_HELP
)


StoreOption = Annotated[
    str,
    typer.Option(
        "--store",
        "-s",
        help="Knowledge store: path of a SQLite file or a SQLAlchemy URL.",
        show_default=True,
    ),
]
_DEFAULT_STORE = str(DEFAULT_PATH)


class ExportFormat(enum.StrEnum):
    """Output formats of ``a3r export``."""

    md = "md"
    """Markdown report."""
    json = "json"
    """Everything, as JSON (artifact contents included)."""


def _fail(message: str) -> typer.Exit:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"error: {message}", markup=False)
    return typer.Exit(code=1)


@contextlib.contextmanager
def _open_store(location: str) -> Iterator[Store]:
    """Open an existing store; store errors raised inside the block become one line and exit code 1."""
    from memory import Store, StoreError

    try:
        with Store(location, create=False) as store:
            yield store
    except StoreError as exc:
        raise _fail(str(exc)) from None


def _no_store_yet(location: str) -> bool:
    """Whether ``location`` is a SQLite file that does not exist yet (nothing recorded: an empty listing)."""
    if "://" in location:
        return False
    if Path(location).expanduser().exists():
        return False
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"nothing recorded yet: no store at {location} (a3r vibe / a3r research create it)", style="dim"
    )
    return True


def _metrics_text(values: dict[str, float] | None) -> str:
    values = {name: value for name, value in (values or {}).items() if name not in NOT_METRICS}
    shown = [name for name in KEY_METRICS if name in values]
    shown += [n for n in values if n not in KEY_METRICS and ("reward" in n or n.startswith("eval"))]
    text = "  ".join(f"{name}={number_text(values[name])}" for name in shown)
    hidden = len(values) - len(shown)
    return text + (f"  (+{hidden} in a3r export)" if hidden else "")


def _status_text(status: str, error: str | None) -> str:
    """The store's status with how a3r says the run ended (``cancelled (budget)``), as the report does."""
    ended = (error or "").split(":", 1)[0]
    return f"{status} ({ended})" if ended in STORE_STATUS and ended != status else status


@app.command()
def runs(
    store: StoreOption = _DEFAULT_STORE,
    study: Annotated[int | None, typer.Option("--study", help="Only runs of this study.")] = None,
    status: Annotated[RunStatus | None, typer.Option("--status", help="Only runs with this status.")] = None,
) -> None:
    """List runs with their status, seed and latest metric values."""
    if _no_store_yet(store):  # the one line says so; an empty table under it would only repeat it
        return
    with _open_store(store) as opened:
        rows = opened.study_runs(study) if study is not None else opened.runs()
        if status is not None:
            rows = [row for row in rows if row.status is status]
    table = Table(title=f"Runs{f' of study {study}' if study is not None else ''}")
    for column in ("run", "study", "experiment", "name", "seed", "status", "step", "metrics"):
        # the two text columns share the room the terminal leaves; ids and status keep their width
        table.add_column(column, overflow="fold", ratio={"name": 1, "metrics": 2}.get(column))
    for row in rows:
        table.add_row(
            str(row.id),
            str(row.study_id),
            str(row.experiment_id),
            row.name,
            "" if row.seed is None else str(row.seed),
            _status_text(row.status.value, row.error),
            "" if row.latest_step is None else str(row.latest_step),
            _metrics_text({**(row.latest_metrics or {}), **(row.final_metrics or {})}),
        )
    _print_table(table)


def _print_table(table: Table) -> None:
    """Print ``table`` at the terminal's width (or ``COLUMNS``), cells folding inside their columns, so
    an 80-column terminal shows a table, not 200-character rows wrapped into a mess. Piped output with
    no ``COLUMNS`` keeps 200 columns: one row per line for ``grep``."""
    console = Console(soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(soft_wrap=False, width=200)
    console.print(table)


def _ids_text(ids: list[int], unit: str) -> str:
    """``2 seeds: 0,1``: a count first, so a lone seed ``0`` does not read as "no seeds"."""
    return f"{counted(len(ids), unit)}: {','.join(map(str, ids))}" if ids else "none"


@app.command()
def findings(
    store: StoreOption = _DEFAULT_STORE,
    study: Annotated[int | None, typer.Option("--study", help="Only findings of this study.")] = None,
    status: Annotated[
        FindingStatus | None, typer.Option("--status", help="Only findings with this status.")
    ] = None,
) -> None:
    """List findings with their status, confidence, seeds and evidence runs."""
    if _no_store_yet(store):  # the one line says so; an empty table under it would only repeat it
        return
    with _open_store(store) as opened:
        # get_study raises NotFound for an unknown study, reported as one line by _open_store.
        studies = {s.id: s for s in ([opened.get_study(study)] if study is not None else opened.studies())}
        rows = [row for study_id in studies for row in opened.findings(study_id, status=status)]
    table = Table(title="Findings")
    for column in (
        "finding",
        "study",
        "status",
        "confidence",
        "verdict, then its derivation",
        "seeds",
        "runs",
    ):
        table.add_column(column, overflow="fold", ratio=1 if column.startswith("verdict") else None)
    for row in rows:
        asked = studies[row.study_id]
        stored = row.status.value
        line = headline(row.statement, row.evidence, question=asked.question, kind=asked.kind, status=stored)
        text = Text(line, style="bold")
        if line != row.statement:
            text.append("\n" + row.statement, style="dim")
        table.add_row(
            str(row.id),
            str(row.study_id),
            verdict_label(stored, row.evidence),
            f"{row.confidence:.2f}",
            text,
            _ids_text(row.seeds, "seeds"),
            ",".join(map(str, row.run_ids)),
        )
    _print_table(table)


@app.command()
def export(
    study: Annotated[int, typer.Argument(help="Id of the study to export.")],
    store: StoreOption = _DEFAULT_STORE,
    format: Annotated[ExportFormat, typer.Option("--format", "-f", help="Output format.")] = ExportFormat.md,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write to this file instead of stdout.")
    ] = None,
) -> None:
    """Export everything recorded about a study, as Markdown or JSON."""
    with _open_store(store) as opened:
        exported = opened.export_study(study)
    from memory import render_json, render_markdown

    text = (render_json if format is ExportFormat.json else render_markdown)(exported)
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc.strerror}") from None
    typer.echo(f"wrote {out}", err=True)


@app.command()
def tui(
    store: StoreOption = _DEFAULT_STORE,
    study: Annotated[int | None, typer.Option("--study", help="Open this study first.")] = None,
    approvals: Annotated[bool, typer.Option("--approvals", help="Open the pending approvals first.")] = False,
    refresh: Annotated[float, typer.Option("--refresh", help="Seconds between two refreshes.")] = 2.0,
    reviewer: Annotated[
        str | None, typer.Option("--reviewer", help="Name recorded with decisions (default: login name).")
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            "--admin-token",
            envvar="SWARM_ADMIN_TOKEN",
            help=(
                "Control token of swarm servers a3r did not start. Prefer env SWARM_ADMIN_TOKEN: a value"
                " given here shows in `ps`. Runs a3r started need none (their token is read from the"
                " server's run dir, admin.token, mode 0600)."
            ),
            show_default=False,
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", help="Model directory or .gguf for the token view (default: embedded)."),
    ] = None,
) -> None:
    """Oversee studies and runs, and approve or reject patches, in the terminal (Textual TUI)."""
    from pydantic import ValidationError

    from a3r.app.tui import HFDetokenizer, TuiConfig, run_tui

    try:
        options = {"refresh_s": refresh, "admin_token": admin_token, "reviewer": reviewer}
        settings = TuiConfig.model_validate({k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        problem = exc.errors()[0]
        flag = {"refresh_s": "--refresh", "reviewer": "--reviewer"}.get(str(problem["loc"][0]), "option")
        raise _fail(f"invalid {flag}: {problem['msg']}") from None
    if store == _DEFAULT_STORE and _no_store_yet(store):  # a fresh folder: say what creates one
        return
    with _open_store(store) as opened:
        if study is not None:
            opened.get_study(study)  # NotFound becomes one line
        run_tui(
            opened, config=settings, detokenize=HFDetokenizer(tokenizer), study_id=study, approvals=approvals
        )


def main() -> None:
    """Entry point of the ``a3r`` console script."""
    from swarm.client.console_script import run_console_script

    run_console_script(app, prog_name="a3r")


if __name__ == "__main__":
    main()
