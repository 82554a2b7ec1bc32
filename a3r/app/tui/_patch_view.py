"""`PatchView`: one patch for review: rationale, syntax-highlighted diff and the evidence it cites."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Button, OptionList, Static
from textual.widgets.option_list import Option

from a3r.app.tui._evidence import PatchEvidence
from memory import PatchPublic, PatchStatus

__all__ = ["PatchView"]


class PatchView(Widget):
    """Review of one patch; asks for a decision by key or button.

    | key    | action                                 |
    |--------|----------------------------------------|
    | a      | approve (asks for an optional note)    |
    | r      | reject (asks for a note)               |
    | Tab    | move between text, episodes, buttons   |
    | Enter  | on a cited episode: open its tokens    |

    The widget only asks: it posts `DecisionRequested` and `EpisodeOpened`; the screen decides what
    happens (the approval dialog, the store write).

    Reactive attributes:
        patch: The patch shown.
        evidence: What its rationale cites, resolved against the store.
    """

    DEFAULT_CSS = """
    PatchView {
        height: 1fr;
    }
    PatchView > #patch-text {
        height: 1fr;
        border: round $primary-darken-2;
        padding: 0 1;
    }
    PatchView > #patch-text:focus {
        border: round $accent;
    }
    PatchView > #patch-episodes {
        height: auto;
        max-height: 5;
    }
    PatchView > #patch-buttons {
        height: 3;
        align-horizontal: center;
    }
    PatchView > #patch-buttons > Button {
        margin: 0 2;
        min-width: 16;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "decide(True)", "Approve"),
        Binding("r", "decide(False)", "Reject"),
    ]

    class DecisionRequested(Message):
        """The reviewer asked to approve or reject the patch (not yet confirmed nor recorded)."""

        def __init__(self, view: PatchView, patch_id: int, approve: bool) -> None:
            self.view = view
            self.patch_id = patch_id
            self.approve = approve
            super().__init__()

    class EpisodeOpened(Message):
        """The reviewer chose a cited episode to look at, token by token."""

        def __init__(self, view: PatchView, episode_id: str, server_url: str | None) -> None:
            self.view = view
            self.episode_id = episode_id
            self.server_url = server_url
            super().__init__()

    patch: reactive[PatchPublic | None] = reactive(None)
    evidence: reactive[PatchEvidence] = reactive(PatchEvidence)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="patch-text", can_focus=True):
            yield Static(id="patch-body")
        yield OptionList(id="patch-episodes")
        with Horizontal(id="patch-buttons"):
            yield Button("Approve (a)", id="approve", variant="success")
            yield Button("Reject (r)", id="reject", variant="error")

    def on_mount(self) -> None:
        self._redraw()

    def watch_patch(self) -> None:
        self._redraw()

    def watch_evidence(self) -> None:
        self._redraw()

    def action_decide(self, approve: bool) -> None:
        if self.patch is not None and self.patch.status is PatchStatus.pending:
            self.post_message(self.DecisionRequested(self, self.patch.id, approve))
        elif self.patch is not None:
            self.notify(f"patch {self.patch.id} is already {self.patch.status.value}", severity="warning")

    @on(Button.Pressed, "#approve")
    def _approve(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_decide(True)

    @on(Button.Pressed, "#reject")
    def _reject(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_decide(False)

    @on(OptionList.OptionSelected, "#patch-episodes")
    def _open_episode(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.EpisodeOpened(self, event.option.id, self.evidence.server_url))

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        self.query_one("#patch-body", Static).update(self.body())
        episodes = self.query_one("#patch-episodes", OptionList)
        episodes.clear_options()
        episodes.add_options(Option(f"episode {ep} (Enter: tokens)", id=ep) for ep in self.evidence.episodes)
        episodes.display = bool(self.evidence.episodes)
        if self.evidence.episodes:
            episodes.highlighted = 0
        pending = self.patch is not None and self.patch.status is PatchStatus.pending
        for button in self.query(Button):
            button.disabled = not pending

    def body(self) -> RenderableType:
        """Header, rationale, diff and evidence of the patch as one rich renderable."""
        patch = self.patch
        if patch is None:
            return Text("no patch")
        head = Text.assemble(
            (f"Patch #{patch.id}", "bold"),
            f" · {patch.artifact_kind.value} {patch.artifact_name} v{patch.base_version}",
            f" · by {patch.proposed_by} · ",
            (patch.status.value, "bold yellow" if patch.status is PatchStatus.pending else "bold"),
        )
        if patch.decided_by:
            head.append(f" by {patch.decided_by}")
        if patch.note:
            head.append(f" · note: {patch.note}")
        parts: list[RenderableType] = [
            head,
            Text("Rationale", style="bold underline"),
            Text(patch.rationale),
            Text("Diff", style="bold underline"),
            _diff_text(patch.diff),
            Text("Evidence cited", style="bold underline"),
            self._evidence_table(),
        ]
        return Group(*parts)

    def _evidence_table(self) -> RenderableType:
        evidence = self.evidence
        if not evidence.runs and not evidence.episodes and not evidence.missing_runs:
            return Text("the rationale cites no run and no episode", style="italic")
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        table.add_column("run", justify="right")
        table.add_column("status")
        table.add_column("seed", justify="right")
        table.add_column("step", justify="right")
        table.add_column("metrics", overflow="fold")
        for run in evidence.runs:
            shown = {
                name: value
                for name, value in run.latest_metrics.items()
                if not evidence.metrics or name in evidence.metrics
            }
            table.add_row(
                str(run.id),
                run.status.value,
                "" if run.seed is None else str(run.seed),
                "" if run.latest_step is None else str(run.latest_step),
                "  ".join(f"{name}={value:.4g}" for name, value in shown.items()) or "-",
            )
        for run_id in evidence.missing_runs:
            table.add_row(str(run_id), Text("not a run of this study", style="red"), "", "", "")
        if not evidence.episodes:
            return table
        where = evidence.server_url or "no server recorded: cannot open"
        return Group(table, Text(f"{len(evidence.episodes)} episode(s) cited, from {where}"))


def _diff_text(diff: str) -> Text:
    """A unified diff highlighted by Pygments' ``diff`` lexer, folding long lines (no background)."""
    text = Syntax(diff, "diff", theme="ansi_dark").highlight(diff)
    text.no_wrap = False
    text.overflow = "fold"
    return text
