"""`RewardCurve`: a metric's history drawn as a sparkline, with its y axis (highest value at the top,
lowest at the bottom) beside it and its last, lowest and highest value and step count above it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Label, Sparkline

__all__ = ["RewardCurve"]


class RewardCurve(Widget):
    """A metric's per-step history drawn in the terminal (textual's `Sparkline`).

    When there are more steps than columns, each column shows the mean of the steps it covers; a
    constant series (one step included) is a flat line at the bottom. A title wider than the widget ends
    in an ellipsis (``…``), never in a silently cut number. Set `values` (oldest first) and `metric` to
    update it; non-finite values are dropped.

    Reactive attributes:
        metric: Name shown in the title line, e.g. ``"reward/mean"``.
        values: The metric's values, oldest first.
        placeholder: Text shown instead of the curve while there are no values.
    """

    DEFAULT_CSS = """
    RewardCurve {
        height: 4;
        width: 1fr;
    }
    RewardCurve > Label {
        width: 1fr;
        height: 1;
        color: $text-muted;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    RewardCurve > Horizontal {
        height: 3;
    }
    RewardCurve #axis {
        width: auto;
        max-width: 9;
        height: 3;
        color: $text-muted;
        padding: 0 1 0 0;
    }
    RewardCurve Sparkline {
        height: 3;
        width: 1fr;
    }
    """

    metric: reactive[str] = reactive("reward")
    values: reactive[tuple[float, ...]] = reactive(tuple)
    placeholder: reactive[str] = reactive("no data yet")

    def compose(self) -> ComposeResult:
        yield Label(id="title")
        with Horizontal():
            yield Label(id="axis")
            yield Sparkline([], summary_function=statistics.fmean, id="curve")

    def on_mount(self) -> None:
        self._redraw()

    def show(self, metric: str, values: Sequence[float]) -> None:
        """Set the metric name and its values together (oldest first)."""
        self.metric = metric
        self.values = tuple(float(v) for v in values if math.isfinite(v))

    def watch_metric(self) -> None:
        self._redraw()

    def watch_values(self) -> None:
        self._redraw()

    def watch_placeholder(self) -> None:
        self._redraw()

    @property
    def title_text(self) -> str:
        """The title line: metric, last value, range and number of steps."""
        if not self.values:
            return f"{self.metric}: {self.placeholder}"
        last, low, high = self.values[-1], min(self.values), max(self.values)
        return f"{self.metric}  last {last:.4g}  min {low:.4g}  max {high:.4g}  ({len(self.values)} steps)"

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        self.query_one("#title", Label).update(self.title_text)
        self.query_one("#axis", Label).update(self.axis_text)
        # textual draws one value as a full-height bar and any other constant series as its bottom line:
        # a single step is drawn as two equal ones, so a constant reads as flat whatever its length.
        self.query_one("#curve", Sparkline).data = list(self.values) * (2 if len(self.values) == 1 else 1)

    @property
    def axis_text(self) -> str:
        """The y axis beside the curve: its highest value on the top line, its lowest on the bottom."""
        if not self.values:
            return ""
        return f"{max(self.values):.3g}\n\n{min(self.values):.3g}"
