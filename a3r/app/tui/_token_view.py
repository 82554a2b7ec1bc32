"""`TokenView`: the tokens of an episode coloured by loss mask (what the trainer trains on)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static

from swarm.client import EpisodeView

__all__ = ["TokenSequence", "TokenView", "token_sequences"]

TRAINED_STYLES = ("black on green3", "black on dark_sea_green2")
"""Tokens with loss mask 1 (targets whose log-probability the trainer trains), alternating so that
neighbouring tokens stay distinguishable."""
CONTEXT_STYLES = ("grey70", "grey50")
"""Tokens with loss mask 0 (prompt, tool output, other agents' turns: context only), alternating."""


@dataclass(frozen=True, slots=True)
class TokenSequence:
    """One token sequence ready to draw.

    Attributes:
        title: What the sequence is, e.g. ``"sample 0 (calls 0-2, agent default)"``.
        pieces: Text of each token, shape (T,).
        loss_mask: 1 where the token is trained, else 0; shape (T,).
        logprobs: Behaviour logprob of each token (natural log; 0.0 outside the mask); shape (T,).
    """

    title: str
    pieces: tuple[str, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]

    @property
    def trained(self) -> int:
        """Number of tokens with loss mask 1."""
        return sum(1 for m in self.loss_mask if m)


def token_sequences(episode: EpisodeView, pieces_of: dict[int, str]) -> list[TokenSequence]:
    """The episode's merged samples (what the trainer sees) as drawable sequences.

    An episode that has no samples yet (still open, or aborted) shows its calls instead: each call's
    prompt as context and, for trainable agents, its completion as trained.

    Args:
        episode: ``GET /api/v1/episodes/{id}``.
        pieces_of: Text piece of every token id occurring in the episode.

    Raises:
        KeyError: A token id has no piece in ``pieces_of``.
    """
    sequences = []
    for sample in episode.samples:
        span = (
            f"calls {sample.calls[0]}-{sample.calls[-1]}"
            if len(sample.calls) > 1
            else f"call {sample.calls[0]}"
        )
        sequences.append(
            TokenSequence(
                title=f"sample {sample.index} ({span}, agent {sample.agent}, weight {sample.weight:.3g})",
                pieces=tuple(pieces_of[i] for i in sample.input_ids),
                loss_mask=tuple(sample.loss_mask),
                logprobs=tuple(sample.behaviour_logprobs),
            )
        )
    if sequences:
        return sequences
    for call in episode.calls:
        trained = 1 if call.trainable else 0
        sequences.append(
            TokenSequence(
                title=f"call {call.index} (agent {call.agent}, {call.finish_reason.value}; not merged yet)",
                pieces=tuple(pieces_of[i] for i in (*call.prompt_ids, *call.completion_ids)),
                loss_mask=(0,) * len(call.prompt_ids) + (trained,) * len(call.completion_ids),
                logprobs=(0.0,) * len(call.prompt_ids) + tuple(call.logprobs),
            )
        )
    return sequences


def render_tokens(sequence: TokenSequence) -> Text:
    """Rich text of a sequence: trained tokens highlighted, context tokens grey, each token's shade
    alternating with its neighbour's; newlines shown as ↵."""
    text = Text()
    for position, (piece, mask) in enumerate(zip(sequence.pieces, sequence.loss_mask, strict=True)):
        styles = TRAINED_STYLES if mask else CONTEXT_STYLES
        text.append(piece.replace("\n", "↵\n"), style=styles[position % 2])
    return text


class TokenView(VerticalScroll, can_focus=True):
    """Token-level view of one episode, one sequence at a time, coloured by loss mask.

    | key | action            |
    |-----|-------------------|
    | ]   | next sequence     |
    | [   | previous sequence |
    | ↑ ↓ PgUp PgDn | scroll  |

    Reactive attributes:
        sequences: What to show (`token_sequences` builds them from an episode).
        index: Which sequence is shown.
    """

    DEFAULT_CSS = """
    TokenView {
        height: 1fr;
        border: round $primary-darken-2;
        padding: 0 1;
    }
    TokenView:focus {
        border: round $accent;
    }
    TokenView > #token-head {
        color: $text-muted;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("right_square_bracket", "step(1)", "Next seq"),
        Binding("left_square_bracket", "step(-1)", "Prev seq"),
    ]

    class SequenceChanged(Message):
        """Another sequence is shown."""

        def __init__(self, view: TokenView, index: int) -> None:
            self.view = view
            self.index = index
            super().__init__()

    sequences: reactive[tuple[TokenSequence, ...]] = reactive(tuple)
    index: reactive[int] = reactive(0)

    def compose(self) -> ComposeResult:
        yield Static(id="token-head")
        yield Static(id="token-body")

    def on_mount(self) -> None:
        self._redraw()

    def show(self, sequences: Sequence[TokenSequence]) -> None:
        """Show these sequences, starting with the first."""
        self.sequences = tuple(sequences)
        self.index = 0

    def validate_index(self, index: int) -> int:
        return max(0, min(index, len(self.sequences) - 1))

    def watch_sequences(self) -> None:
        self._redraw()

    def watch_index(self, index: int) -> None:
        self._redraw()
        self.post_message(self.SequenceChanged(self, index))

    def action_step(self, delta: int) -> None:
        self.index += delta

    @property
    def current(self) -> TokenSequence | None:
        """The sequence shown, if any."""
        return self.sequences[self.index] if self.sequences else None

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        head, body = self.query_one("#token-head", Static), self.query_one("#token-body", Static)
        shown = self.current
        if shown is None:
            head.update("no tokens")
            body.update("")
            return
        legend = Text.assemble(
            f"{self.index + 1}/{len(self.sequences)} {shown.title} · {len(shown.pieces)} tokens, ",
            (f"{shown.trained} trained", TRAINED_STYLES[0]),
            " / ",
            ("context", CONTEXT_STYLES[0]),
        )
        head.update(legend)
        body.update(render_tokens(shown))
        self.scroll_home(animate=False)
