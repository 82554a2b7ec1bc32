"""`DecisionDialog`: confirm an approval or a rejection and write the note that goes with it."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from a3r.app.tui._decision import Decision
from memory import PatchPublic

__all__ = ["DecisionDialog"]


class DecisionDialog(ModalScreen[Decision | None]):
    """Modal dialog dismissed with the `Decision`, or ``None`` when cancelled.

    A rejection needs a note (the analyst reads it to revise the patch); an approval may have one.

    | key    | action                   |
    |--------|--------------------------|
    | Enter  | confirm (in the note)    |
    | Escape | cancel                   |
    | Tab    | note → confirm → cancel  |

    Args:
        patch: The patch decided on.
        approve: ``True`` to approve, ``False`` to reject.
    """

    DEFAULT_CSS = """
    DecisionDialog {
        align: center middle;
    }
    DecisionDialog > #dialog {
        padding: 0 1;
        width: 72;
        max-width: 100%;
        height: auto;
        border: thick $background 80%;
        background: $surface;
    }
    DecisionDialog #question, DecisionDialog #problem {
        width: 1fr;
        height: auto;
    }
    DecisionDialog #problem {
        color: $error;
    }
    DecisionDialog #buttons {
        height: auto;
        align-horizontal: center;
    }
    DecisionDialog Button {
        margin: 0 2;
        min-width: 14;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, patch: PatchPublic, approve: bool) -> None:
        self.patch = patch
        self.approve = approve
        super().__init__()

    def compose(self) -> ComposeResult:
        verb = "Approve" if self.approve else "Reject"
        target = f"patch #{self.patch.id} to {self.patch.artifact_name} v{self.patch.base_version}"
        placeholder = "note (optional)" if self.approve else "note: why is it rejected? (required)"
        with Vertical(id="dialog"):
            yield Label(f"{verb} {target}?", id="question")
            yield Input(placeholder=placeholder, id="note")
            yield Label("", id="problem")
            with Horizontal(id="buttons"):
                yield Button(verb, variant="success" if self.approve else "error", id="confirm")
                yield Button("Cancel", variant="primary", id="cancel")

    @on(Input.Submitted, "#note")
    @on(Button.Pressed, "#confirm")
    def confirm(self) -> None:
        """Dismiss with the decision, unless a rejection has no note."""
        note = self.query_one("#note", Input).value.strip() or None
        if not self.approve and note is None:
            self.query_one("#problem", Label).update("A rejection needs a note for the analyst.")
            self.query_one("#note", Input).focus()
            return
        self.dismiss(Decision(approved=self.approve, note=note))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
