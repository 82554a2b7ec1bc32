"""`EpisodeScreen`: one episode token by token, coloured by loss mask."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import ClassVar, Literal

import httpx
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from a3r.app.tui._context import TuiContext
from a3r.app.tui._polling import on_stack
from a3r.app.tui._run_dir import RunDirReader
from a3r.app.tui._swarm import RunMonitor
from a3r.app.tui._token_view import TokenView, token_sequences
from a3r.app.tui._tokens import Detokenizer
from swarm.client import EpisodeView, SwarmError

__all__ = ["EpisodeScreen", "episode_pieces"]


def episode_pieces(episode: EpisodeView, detokenize: Detokenizer | None) -> dict[int, str]:
    """Text piece of every token id in the episode; ``⟨id⟩`` for each when there is no detokenizer.

    Raises:
        ValueError: The detokenizer returned a different number of pieces than ids.
    """
    ids = sorted(
        {i for call in episode.calls for i in (*call.prompt_ids, *call.completion_ids)}
        | {i for sample in episode.samples for i in sample.input_ids}
    )
    if detokenize is None:
        return {i: f"⟨{i}⟩" for i in ids}
    pieces = detokenize(ids)
    if len(pieces) != len(ids):
        raise ValueError(f"the detokenizer gave {len(pieces)} pieces for {len(ids)} token ids")
    return dict(zip(ids, pieces, strict=True))


class EpisodeScreen(Screen[None]):
    """Token-level view of one episode fetched from a swarm server (``GET /api/v1/episodes/{id}``).

    | key    | action             |
    |--------|--------------------|
    | ] [    | next / previous sequence (sample, or call before merging) |
    | ← →    | previous / next token (its id, piece, mask and logprob below the title) |
    | c      | samples ⇄ calls    |
    | g      | fetch again        |
    | Escape | back               |

    Args:
        ctx: The session context (its detokenizer turns ids into text).
        server_url: The server that recorded the episode; ``None``: read it from ``run_dir`` (a stopped
            server's pool).
        episode_id: The episode.
        run_dir: The server's run dir (``Run.run_dir``): where a3r keeps its admin token, and the pool
            of a finished run.
    """

    DEFAULT_CSS = """
    EpisodeScreen #episode-info {
        height: auto;
        max-height: 3;
        padding: 0 1;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("g", "fetch", "Fetch again"),
        Binding("c", "toggle_view", "Samples/calls"),
    ]

    def __init__(
        self, ctx: TuiContext, server_url: str | None, episode_id: str, *, run_dir: str | None = None
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.episode_id = episode_id
        self.monitor: RunMonitor | RunDirReader = (
            RunDirReader(run_dir or ".")
            if server_url is None
            else RunMonitor(
                server_url, admin_token=ctx.admin_token_for(run_dir), timeout_s=ctx.config.request_timeout_s
            )
        )
        self.title = f"Episode {episode_id}"
        self.episode: EpisodeView | None = None
        self.by: Literal["samples", "calls"] = "samples"
        self._pieces: dict[int, str] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("fetching…", id="episode-info")
        yield TokenView(id="tokens")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(TokenView).focus()
        self.action_fetch()

    async def on_unmount(self) -> None:
        await self.monitor.aclose()

    def action_fetch(self) -> None:
        self.fetch()

    @work(exclusive=True, group="episode")
    async def fetch(self) -> None:
        """Fetch the episode and turn its ids into text (in a worker thread: a tokenizer may load)."""
        info = self.query_one("#episode-info", Static)
        try:
            episode = await self.monitor.episode(self.episode_id)
        except (httpx.HTTPError, SwarmError, LookupError, sqlite3.Error) as exc:
            if on_stack(self):
                info.update(Text(f"cannot fetch {self.episode_id}: {exc}", style="bold red"))
            return
        try:
            pieces = await asyncio.to_thread(episode_pieces, episode, self.ctx.detokenize)
        except Exception as exc:  # a tokenizer that cannot load must not close the screen
            self.notify(f"showing token ids: {type(exc).__name__}: {exc}", severity="warning")
            pieces = await asyncio.to_thread(episode_pieces, episode, None)
        if not on_stack(self):
            return
        self.episode = episode
        reward = "-" if episode.reward is None else f"{episode.reward:.4g}"
        info.update(
            Text.assemble(
                (f"{episode.status.value}", "bold"),
                f" · task {episode.task_id} · reward {reward} · {len(episode.calls)} calls, "
                f"{len(episode.samples)} samples · merge ratio {episode.merge.merge_ratio:.2f}",
            )
        )
        self._pieces = pieces
        self.query_one(TokenView).show(token_sequences(episode, pieces, by=self.by))

    def action_toggle_view(self) -> None:
        """Show the episode's calls one by one, or its merged samples (what the trainer trains on)."""
        if self.episode is None:
            return
        self.by = "calls" if self.by == "samples" else "samples"
        self.query_one(TokenView).show(token_sequences(self.episode, self._pieces, by=self.by))
