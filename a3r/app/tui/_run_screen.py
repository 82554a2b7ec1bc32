"""`RunScreen`: one run: its stored metrics and, live from its swarm server, status, metrics and episodes."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import DataTable, Footer, Header, Static

from a3r.app.tui._context import TuiContext
from a3r.app.tui._episode_screen import EpisodeScreen
from a3r.app.tui._metric_names import reward_history, reward_metric
from a3r.app.tui._polling import RELOAD_GROUP, PollingScreen, on_stack, read_store
from a3r.app.tui._reward_curve import RewardCurve
from a3r.app.tui._run_dir import RunDirReader, run_client_id, run_tenant, tenant_text
from a3r.app.tui._swarm import LiveRun, RunMonitor
from a3r.app.tui._tables import Cell, refill
from memory import RunPublic, RunStatus

__all__ = ["RunScreen"]

_LIVE_METRICS = ("loss", "kl", "clip_frac", "entropy", "grad_norm", "lr")


class RunScreen(PollingScreen):
    """One run: stored reward curve, and live data polled from ``Run.server_url``.

    The server is polled from an exclusive async worker every ``refresh_s`` seconds (one poll at a
    time; a slow server never blocks the screen).

    | key    | action                                   |
    |--------|------------------------------------------|
    | Enter  | on an episode: token-level view          |
    | Escape | back                                     |

    Args:
        ctx: The session context.
        run_id: The run shown.
    """

    DEFAULT_CSS = """
    RunScreen #run-info {
        height: auto;
        max-height: 3;
        padding: 0 1;
    }
    RunScreen #curves {
        height: 4;
        padding: 0 1;
    }
    RunScreen #stored-curve {
        margin-right: 3;  /* the two panels' titles and curves never run together */
    }
    RunScreen #live-status {
        height: auto;
        max-height: 2;
        padding: 0 1;
    }
    RunScreen #episodes {
        height: 1fr;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, ctx: TuiContext, run_id: int) -> None:
        super().__init__(ctx)
        self.run_id = run_id
        self.title = f"Run {run_id}"
        self.monitor: RunMonitor | RunDirReader | None = None
        self.live: LiveRun | None = None
        self.run_dir: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="run-info")
        with Horizontal(id="curves"):
            yield RewardCurve(id="stored-curve")
            yield RewardCurve(id="live-curve")
        yield Static(id="live-status")
        yield DataTable(id="episodes", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#episodes", DataTable)
        table.add_columns("episode", "task", "status", "reward")
        self.query_one("#live-curve", RewardCurve).placeholder = "waiting for the server"

    async def on_unmount(self) -> None:
        if self.monitor is not None:
            await self.monitor.aclose()

    def _read(self) -> tuple[RunPublic, tuple[str, list[float]]]:
        return self.ctx.store.get_run(self.run_id), reward_history(self.ctx.store, self.run_id)

    @work(exclusive=True, group=RELOAD_GROUP)
    async def reload(self) -> None:
        """Re-read the run from the store, then poll its server (both off the UI thread)."""
        read = await read_store(self, self._read)
        if read is None:
            return
        run, (name, values) = read
        self.sub_title = f"{run.name or 'unnamed'} · {run.status.value}"
        info = Text.assemble(
            ("status ", "bold"),
            run.status.value,
            ("  seed ", "bold"),
            "-" if run.seed is None else str(run.seed),
            ("  server ", "bold"),
            run.server_url or "none recorded",
        )
        if tenant_text(run.config):  # one of a stage's runs trained side by side on one server
            info.append(f"  ({tenant_text(run.config)}, tenant {run.config['tenant']})")
        if run.error:
            info.append(f"\nerror: {run.error}", style="red")
        self.query_one("#run-info", Static).update(info)
        self.query_one("#stored-curve", RewardCurve).show(f"stored {name}", values)
        monitor = await self._source(run)
        if monitor is None:
            self.query_one("#live-curve", RewardCurve).placeholder = "no server recorded"
            self.query_one("#live-status", Static).update("no live data: the run recorded no server")
            return
        live = await monitor.poll()
        if on_stack(self):
            self.show_live(live)

    async def _source(self, run: RunPublic) -> RunMonitor | RunDirReader | None:
        """Where the run's data comes from: its server while it runs, its server's run dir once it ended
        (switching when it ends), else the recorded server; ``None`` when the run recorded neither."""
        ended = run.status is not RunStatus.running and RunDirReader.holds_a_run(run.run_dir)
        if ended and not isinstance(self.monitor, RunDirReader):
            if self.monitor is not None:
                await self.monitor.aclose()
            self.monitor = RunDirReader(
                str(run.run_dir), client_id=run_client_id(run.name, run.config), tenant=run_tenant(run.config)
            )
        elif self.monitor is None and run.server_url is not None:
            self.monitor = RunMonitor(
                run.server_url,
                admin_token=self.ctx.admin_token_for(run.run_dir),
                timeout_s=self.ctx.config.request_timeout_s,
                client_id=run_client_id(run.name, run.config),
                tenant=run_tenant(run.config),
            )
        self.run_dir = run.run_dir
        return self.monitor

    def show_live(self, live: LiveRun) -> None:
        """Draw one poll of the server."""
        self.live = live
        status = self.query_one("#live-status", Static)
        if live.status is None and isinstance(self.monitor, RunDirReader):
            steps = len(live.metrics or [])
            line = Text.assemble(
                ("ended ", "bold"), f"read from {self.monitor.url}: {steps} steps, newest episodes below"
            )
            if live.error:
                line.append(f"\n{live.error}", style="red")
            status.update(line)
        elif live.status is None:
            status.update(Text(live.error or "no answer", style="bold red"))
        else:
            st = live.status
            line = Text.assemble(
                ("live ", "bold"),
                f"{st.state.value} · policy step {st.step} · {st.model} · episodes ",
                f"open {st.episodes.open} finished {st.episodes.finished} "
                f"aborted {st.episodes.aborted} trained {st.episodes.trained}",
            )
            last = (live.metrics or [{}])[-1] if live.metrics else {}
            shown = [f"{k}={last[k]:.4g}" for k in _LIVE_METRICS if isinstance(last.get(k), int | float)]
            if shown:
                line.append("\n" + "  ".join(shown))
            elif live.metrics is None:
                line.append("\nthe server serves no per-step metrics", style="dim")
            if live.error:
                line.append(f"\n{live.error}", style="red")
            status.update(line)
        curve = self.query_one("#live-curve", RewardCurve)
        if live.metrics:
            name = reward_metric(key for row in live.metrics for key in row if key != "step") or "reward_mean"
            curve.show(f"live {name}", live.series(name))
        else:
            curve.placeholder = "no training steps yet" if live.status is not None else "server unreachable"
        refill(
            self.query_one("#episodes", DataTable),
            (
                (
                    ep.episode_id,
                    (
                        ep.episode_id,
                        ep.task_id,
                        ep.status,
                        "" if ep.reward is None else f"{ep.reward:.4g}",
                    ),
                )
                for ep in live.episodes
            ),
        )

    @on(DataTable.RowSelected, "#episodes")
    def _selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is None or self.monitor is None:
            return
        url = None if isinstance(self.monitor, RunDirReader) else self.monitor.url
        self.app.push_screen(EpisodeScreen(self.ctx, url, event.row_key.value, run_dir=self.run_dir))
