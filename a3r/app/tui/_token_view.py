"""`TokenView`: the tokens of an episode, each with its id, text piece, loss mask and logprob.

Trained tokens (loss mask 1) are coloured by their behaviour logprob (green where the policy was sure,
red where it was not); context tokens are grey. A cursor selects one token, whose id, piece, mask and
logprob the line under the title spells out. Sequences are the episode's merged samples (what the
trainer sees) or its calls one by one (OpenAI and Anthropic calls alike: both are recorded as token ids).

A sample a teacher scored (on-policy distillation, issue 38) carries the teacher's logprob of each
token it scored: the selected token's line gives it beside the student's, with their difference
(student − teacher: the token's reverse-KL estimate, the negative of its distillation advantage), and
``t`` lays the tokens out one per row with both logprobs side by side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static

from swarm.client import EpisodeView

__all__ = ["TokenSequence", "TokenView", "token_sequences"]

LOGPROB_BANDS: tuple[tuple[float, str, tuple[str, str]], ...] = (
    (math.log(0.9), "p ≥ 0.9", ("black on green3", "black on dark_sea_green2")),
    (math.log(0.5), "p ≥ 0.5", ("black on yellow3", "black on khaki1")),
    (math.log(0.1), "p ≥ 0.1", ("black on orange3", "black on light_salmon1")),
    (-math.inf, "p < 0.1", ("white on red3", "white on indian_red")),
)
"""Bands of a trained token's behaviour logprob: the lowest logprob of the band, its label, and its
two styles (alternating so that neighbouring tokens stay distinguishable)."""
TRAINED_STYLES = tuple(style for _, _, styles in LOGPROB_BANDS for style in styles)
"""Every style of a token with loss mask 1 (a target whose log-probability the trainer trains)."""
CURSOR_STYLE = "reverse bold"
"""Laid over the selected token."""
CONTEXT_STYLES = ("grey70", "grey50")
"""Tokens with loss mask 0 (prompt, tool output, other agents' turns: context only), alternating."""


@dataclass(frozen=True, slots=True)
class TokenSequence:
    """One token sequence ready to draw.

    Attributes:
        title: What the sequence is, e.g. ``"sample 0 (calls 0-2, agent default)"``.
        pieces: Text of each token, shape (T,).
        ids: Token id of each token, shape (T,).
        loss_mask: 1 where the token is trained, else 0; shape (T,).
        logprobs: Behaviour logprob of each token (natural log; 0.0 outside the mask); shape (T,).
        teacher_logprobs: The teacher's logprob of each token (natural log; ``None`` where it scored
            none, e.g. context tokens), shape (T,); ``()`` when no teacher scored the sequence.
    """

    title: str
    pieces: tuple[str, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    ids: tuple[int, ...] = ()
    teacher_logprobs: tuple[float | None, ...] = ()

    @property
    def trained(self) -> int:
        """Number of tokens with loss mask 1."""
        return sum(1 for m in self.loss_mask if m)

    @property
    def scored(self) -> int:
        """Number of tokens the teacher scored."""
        return sum(1 for t in self.teacher_logprobs if t is not None)

    def teacher_at(self, position: int) -> float | None:
        """The teacher's logprob of the token at ``position``, or ``None`` where it scored none."""
        return self.teacher_logprobs[position] if position < len(self.teacher_logprobs) else None


def _call_sequences(episode: EpisodeView, pieces_of: dict[int, str], note: str) -> list[TokenSequence]:
    sequences = []
    for call in episode.calls:
        trained = 1 if call.trainable else 0
        ids = (*call.prompt_ids, *call.completion_ids)
        sequences.append(
            TokenSequence(
                title=f"call {call.index} (agent {call.agent}, {call.finish_reason.value}{note})",
                pieces=tuple(pieces_of[i] for i in ids),
                loss_mask=(0,) * len(call.prompt_ids) + (trained,) * len(call.completion_ids),
                logprobs=(0.0,) * len(call.prompt_ids) + tuple(call.logprobs),
                ids=tuple(ids),
                teacher_logprobs=(
                    (None,) * len(call.prompt_ids) + tuple(call.teacher_logprobs)
                    if call.teacher_logprobs is not None
                    else ()
                ),
            )
        )
    return sequences


def token_sequences(
    episode: EpisodeView, pieces_of: dict[int, str], *, by: Literal["samples", "calls"] = "samples"
) -> list[TokenSequence]:
    """The episode's merged samples (what the trainer sees), or its calls, as drawable sequences.

    An episode that has no samples yet (still open, or aborted) shows its calls instead: each call's
    prompt as context and, for trainable agents, its completion as trained.

    Args:
        episode: ``GET /api/v1/episodes/{id}``.
        pieces_of: Text piece of every token id occurring in the episode.
        by: ``samples`` (the merged sequences the trainer trains on) or ``calls`` (each model call).

    Raises:
        KeyError: A token id has no piece in ``pieces_of``.
    """
    if by == "calls":
        return _call_sequences(episode, pieces_of, "")
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
                ids=tuple(sample.input_ids),
                teacher_logprobs=tuple(sample.teacher_logprobs or ()),
            )
        )
    if sequences:
        return sequences
    open_ = episode.status.value in ("open", "prepared")
    return _call_sequences(episode, pieces_of, "; not merged yet" if open_ else "; no merged samples stored")


def trained_style(logprob: float, position: int) -> str:
    """The style of a trained token: its logprob's band (`LOGPROB_BANDS`), alternating by position."""
    for floor, _, styles in LOGPROB_BANDS:
        if logprob >= floor:
            return styles[position % 2]
    return LOGPROB_BANDS[-1][2][position % 2]  # nan


def render_tokens(sequence: TokenSequence, cursor: int | None = None) -> Text:
    """Rich text of a sequence: trained tokens coloured by logprob, context tokens grey, each token's
    shade alternating with its neighbour's; newlines shown as ↵; the token at ``cursor`` reversed."""
    text = Text()
    for position, (piece, mask) in enumerate(zip(sequence.pieces, sequence.loss_mask, strict=True)):
        logprob = sequence.logprobs[position]
        style = trained_style(logprob, position) if mask else CONTEXT_STYLES[position % 2]
        start = len(text)
        text.append(piece.replace("\n", "↵\n"), style=style)
        if position == cursor:
            text.stylize(CURSOR_STYLE, start, max(start + 1, len(text)))
    return text


def token_line(sequence: TokenSequence, position: int) -> Text:
    """One line on the token at ``position``: its index, id, piece, loss mask and logprob."""
    piece = sequence.pieces[position]
    token_id = sequence.ids[position] if sequence.ids else None
    mask = sequence.loss_mask[position]
    logprob = sequence.logprobs[position]
    parts: list[str | tuple[str, str]] = [
        f"token {position + 1}/{len(sequence.pieces)} · id {'?' if token_id is None else token_id} · ",
        (repr(piece), "bold"),
        " · ",
    ]
    if mask:
        parts += [
            ("trained", trained_style(logprob, 0)),
            f" · logprob {logprob:.3f} (p {math.exp(logprob):.3f})",
        ]
    else:
        parts += [("context", CONTEXT_STYLES[0]), " (not trained: no logprob)"]
    teacher = sequence.teacher_at(position)
    if teacher is not None:
        parts += [
            " · teacher ",
            (f"{teacher:.3f}", trained_style(teacher, 0)),
            f" (p {math.exp(teacher):.3f}) · student − teacher {logprob - teacher:+.3f}",
        ]
    elif sequence.teacher_logprobs and mask:
        parts.append(" · teacher: not scored")
    return Text.assemble(*parts)


def token_rows(sequence: TokenSequence, cursor: int | None = None) -> Text:
    """The tokens one per row: position, id, piece, mask, the student's logprob and, where the teacher
    scored the token, its logprob and student − teacher (nats); the row at ``cursor`` reversed."""
    text = Text(f"{'#':>5} {'id':>6}  {'piece':<16} {'mask':>4} {'student':>8} {'teacher':>8} {'s − t':>7}\n")
    for position, (piece, mask) in enumerate(zip(sequence.pieces, sequence.loss_mask, strict=True)):
        logprob = sequence.logprobs[position]
        teacher = sequence.teacher_at(position)
        token_id = sequence.ids[position] if sequence.ids else "?"
        start = len(text)
        text.append(f"{position + 1:>5} {token_id:>6}  ")
        shown = repr(piece)[:16]
        text.append(f"{shown:<16}", style=trained_style(logprob, 0) if mask else CONTEXT_STYLES[0])
        student = f"{logprob:>8.3f}" if mask else f"{'·':>8}"
        if teacher is None:
            text.append(f" {mask:>4} {student} {'·':>8} {'·':>7}\n")
        else:
            text.append(f" {mask:>4} {student} ")
            text.append(f"{teacher:>8.3f}", style=trained_style(teacher, 0))
            text.append(f" {logprob - teacher:>+7.3f}\n")
        if position == cursor:
            text.stylize(CURSOR_STYLE, start, len(text) - 1)
    return text


class TokenView(VerticalScroll, can_focus=True):
    """Token-level view of one episode, one sequence at a time, coloured by loss mask and logprob.

    | key | action            |
    |-----|-------------------|
    | ]   | next sequence     |
    | [   | previous sequence |
    | ← → | previous / next token (the line under the title describes it) |
    | Home End | first / last token |
    | t   | tokens as text, or one per row with the student's and the teacher's logprob |
    | ↑ ↓ PgUp PgDn | scroll  |

    Reactive attributes:
        sequences: What to show (`token_sequences` builds them from an episode).
        index: Which sequence is shown.
        cursor: Which token of it is selected.
        rows: Whether the tokens are laid out one per row (`token_rows`) rather than as text.
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
        Binding("right", "move(1)", "Next token", show=False),
        Binding("left", "move(-1)", "Prev token", show=False),
        Binding("home", "move(-1000000000)", "First token", show=False),
        Binding("end", "move(1000000000)", "Last token", show=False),
        Binding("t", "toggle_rows", "Rows/text"),
    ]

    class SequenceChanged(Message):
        """Another sequence is shown."""

        def __init__(self, view: TokenView, index: int) -> None:
            self.view = view
            self.index = index
            super().__init__()

    sequences: reactive[tuple[TokenSequence, ...]] = reactive(tuple)
    index: reactive[int] = reactive(0)
    cursor: reactive[int] = reactive(0)
    rows: reactive[bool] = reactive(False)

    def compose(self) -> ComposeResult:
        yield Static(id="token-head")
        yield Static(id="token-line")
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
        self.cursor = 0
        self._redraw()
        self.post_message(self.SequenceChanged(self, index))

    def validate_cursor(self, cursor: int) -> int:
        shown = self.current
        return max(0, min(cursor, len(shown.pieces) - 1)) if shown is not None else 0

    def watch_cursor(self) -> None:
        self._redraw(scroll=False)

    def watch_rows(self) -> None:
        self._redraw(scroll=False)

    def action_toggle_rows(self) -> None:
        self.rows = not self.rows

    def action_step(self, delta: int) -> None:
        self.index += delta

    def action_move(self, delta: int) -> None:
        self.cursor += delta

    @property
    def current(self) -> TokenSequence | None:
        """The sequence shown, if any."""
        return self.sequences[self.index] if self.sequences else None

    def _redraw(self, *, scroll: bool = True) -> None:
        if not self.is_mounted:
            return
        head, body = self.query_one("#token-head", Static), self.query_one("#token-body", Static)
        line = self.query_one("#token-line", Static)
        shown = self.current
        if shown is None or not shown.pieces:
            head.update("no tokens")
            line.update("")
            body.update("")
            return
        bands = [(f" {label} ", styles[0]) for _, label, styles in LOGPROB_BANDS]
        legend = Text.assemble(
            f"{self.index + 1}/{len(self.sequences)} {shown.title} · {len(shown.pieces)} tokens, "
            f"{shown.trained} trained, by logprob:",
            *bands,
            " / ",
            ("context", CONTEXT_STYLES[0]),
        )
        if shown.teacher_logprobs:
            legend.append(f" · teacher scored {shown.scored} tokens (t: logprobs side by side)")
        head.update(legend)
        cursor = min(self.cursor, len(shown.pieces) - 1)
        line.update(token_line(shown, cursor))
        body.update(token_rows(shown, cursor) if self.rows else render_tokens(shown, cursor))
        if scroll:
            self.scroll_home(animate=False)
