"""The study report's figures (matplotlib, Agg backend, PNG): what the evidence is, drawn so it reads
honestly.

- `plot_held_out`: the held-out mean reward before and after training, each with its 95% interval: the
  evidence a training claim rests on.
- `plot_rewards`: the smoke run's reward per group beside the training runs' reward per trainer step
  (integer step ticks; the smoke run trains nothing, so it never shares the step axis).
- `plot_parts`: one panel per reward part; a rate (every point in [0, 1]) on a fixed 0–1 scale, with
  the good direction (``goal`` up, ``violation`` down) in the panel's title.
- `plot_sweep`: held-out pass rates and last-k train reward per swept value.

Every function returns the PNG path, or ``None`` when it has nothing to draw.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from scipy import stats

from a3r.study.analysis import RewardSummary, part_scale
from a3r.study.research import ConfigVerdict
from a3r.study.runs import RunOutcome
from a3r.study.settings import value_text

__all__ = ["mean_interval", "plot_held_out", "plot_parts", "plot_rewards", "plot_sweep", "step_axis"]

LEVEL = 0.95
"""Coverage of the intervals drawn."""

GOOD_DIRECTION = {"goal": "↑ higher is better", "violation": "↓ lower is better"}
"""A reward part's role (`a3r.study.analysis.part_roles`) → the direction its title marks as good."""


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def step_axis(ax: Axes, xs: Sequence[float]) -> None:
    """Integer ticks on a step (or group) axis: `MaxNLocator` (``integer=True``) in general, and the
    steps themselves as ticks (one unit of margin each side) where they span fewer than 3 steps, where
    the locator would fall back to fractional ticks (0.945 … 1.050 around a single point)."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    steps = sorted({round(x) for x in xs if math.isfinite(x)})
    if steps and steps[-1] - steps[0] < 2:
        ax.set_xticks(range(steps[0], steps[-1] + 1))
        ax.set_xlim(steps[0] - 0.5, steps[-1] + 0.5)


def mean_interval(rewards: Sequence[float]) -> tuple[float, float]:
    """The mean of ``rewards`` and the half-width of its `LEVEL` t-interval (``nan`` below 2 values).

    Args:
        rewards: Episode rewards, treated as independent draws.
    """
    if not rewards:
        return math.nan, math.nan
    mean = statistics.fmean(rewards)
    if len(rewards) < 2:
        return mean, math.nan
    se = statistics.stdev(rewards) / math.sqrt(len(rewards))
    return mean, float(stats.t.ppf(0.5 + LEVEL / 2, len(rewards) - 1)) * se


def _held_out_points(
    outcomes: Sequence[RunOutcome], baseline: RewardSummary | None
) -> list[tuple[str, RewardSummary]]:
    smoke = next((o.eval for o in outcomes if o.purpose == "smoke" and o.eval is not None), None)
    before = [("before: smoke run", smoke)] if smoke is not None else []
    if not before and baseline is not None:
        before = [("before: untrained", baseline)]
    after = [(f"after: {o.key}", o.eval) for o in outcomes if o.purpose == "train" and o.eval is not None]
    return [(label, summary) for label, summary in before + after if summary is not None] if after else []


def plot_held_out(
    outcomes: Sequence[RunOutcome],
    baseline: RewardSummary | None,
    path: Path,
    *,
    scale: tuple[float, float] | None = None,
) -> Path | None:
    """Held-out mean reward before training (the smoke run's evaluation, else the untrained preflight)
    and after each training run, with `LEVEL` intervals over episodes and the attempt count under each.

    Args:
        scale: The rewards the template can pay (`a3r.study.analysis.reward_range`); each interval is
            clipped to it (a mean of rewards in [0, 1] is never below 0), as the verdicts' are.

    Returns:
        The PNG path, or ``None`` without a before and an after evaluation.
    """
    points = _held_out_points(outcomes, baseline)
    if len(points) < 2:
        return None
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(points)), 3.6), dpi=110)
    for i, (label, summary) in enumerate(points):
        mean, half = mean_interval(summary.rewards) if summary.rewards else (summary.mean_reward, math.nan)
        colour = "grey" if label.startswith("before") else "tab:blue"
        low, high = mean - half, mean + half
        if scale is not None:
            low, high = max(low, scale[0]), min(high, scale[1])
        ax.errorbar(
            [i],
            [mean],
            yerr=None if math.isnan(half) else [[mean - low], [high - mean]],
            fmt="o",
            color=colour,
            capsize=6,
        )
        ax.annotate(f"{mean:.3f}", (i, mean), textcoords="offset points", xytext=(9, -3), fontsize=8)
    ax.set_xticks(
        range(len(points)), [f"{label}\n(n = {summary.episodes})" for label, summary in points], fontsize=8
    )
    ax.set_xlim(-0.6, len(points) - 0.4)
    ax.set_ylabel("held-out mean reward")
    ax.set_title(f"held-out tasks: before → after training\n(mean, {int(LEVEL * 100)}% interval)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def plot_rewards(outcomes: Sequence[RunOutcome], path: Path) -> Path | None:
    """Training runs' mean train reward per trainer step (one line per run; a run without a step drawn
    per group), and beside it, on its own axis, the smoke run's reward per group: the smoke run trains
    nothing, so its points are not steps.

    Returns:
        The PNG path, or ``None`` when no run has a curve.
    """
    smoke = [o for o in outcomes if o.purpose == "smoke" and (o.curve or o.episode_curve)]
    trained = [o for o in outcomes if o.purpose != "smoke" and (o.curve or o.episode_curve)]
    if not smoke and not trained:
        return None
    panels = [p for p in (trained, smoke) if p]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(7 if len(panels) == 1 else 10, 4), dpi=110, squeeze=False, sharey=True
    )
    for ax, runs in zip(axes[0], panels, strict=True):
        for o in runs:
            if o.curve:
                ax.plot(
                    [s for s, _ in o.curve], [v for _, v in o.curve], marker="o", label=f"{o.key} (per step)"
                )
            else:  # groups are independent draws, not a time series: points, not a line
                xs = range(1, len(o.episode_curve) + 1)
                ax.plot(xs, o.episode_curve, marker="s", linestyle="none", label=f"{o.key} (per group)")
        step_axis(ax, [x for o in runs for x in _xs(o)])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_ylabel("mean reward")
    if trained:
        axes[0][0].set_title("training", fontsize=9)
        axes[0][0].set_xlabel("trainer step (or group index)")
    if smoke:
        axes[0][-1].set_title("smoke run (no training)", fontsize=9)
        axes[0][-1].set_xlabel("group of episodes")
    return _save(fig, path)


def _xs(outcome: RunOutcome) -> list[float]:
    """The x values `plot_rewards` draws for a run: its steps, else its group indices (from 1)."""
    return [float(s) for s, _ in outcome.curve] or [
        float(i) for i in range(1, len(outcome.episode_curve) + 1)
    ]


def _is_rate(curves: Mapping[str, Mapping[str, list[float]]], name: str) -> bool:
    return part_scale(v for c in curves.values() for v in c.get(name, [])) is not None


def plot_parts(
    parts: dict[str, dict[str, list[float]]], path: Path, roles: Mapping[str, str] | None = None
) -> Path | None:
    """One panel per reward part, one line per configuration and seed (`a3r.study.report.joined_parts`):
    its mean over the episodes each trainer step trained, one point per step. A rate is drawn on a fixed 0–1 scale (0.667 → 0.750
    is a small move, and looks it); a part with a role has its good direction in the title.

    Args:
        roles: Part name → role (``goal``, ``violation``, ``shaping``), `a3r.study.analysis.part_roles`.

    Returns:
        The PNG path, or ``None`` when no part was recorded.
    """
    names = sorted({name for curves in parts.values() for name in curves})
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.4), dpi=110, squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for label, curves in parts.items():
            if name in curves:
                ax.plot(range(1, len(curves[name]) + 1), curves[name], marker="o", label=label)
        good = GOOD_DIRECTION.get((roles or {}).get(name, ""), "")
        ax.set_title(f"{name}\n{good}" if good else name, fontsize=9)
        ax.set_xlabel("trainer step (its batch's episodes)", fontsize=7)
        step_axis(ax, [float(i) for c in parts.values() for i in range(1, len(c.get(name, [])) + 1)])
        if _is_rate(parts, name):
            ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)


def plot_sweep(
    configs: Sequence[ConfigVerdict],
    variable: str,
    baseline: RewardSummary | None,
    path: Path,
    *,
    stability: bool = True,
    template: str | None = None,
) -> Path | None:
    """Held-out p@1, p@2 and last-k train reward per swept value, stable values marked when
    ``stability`` (a min-stable question); a switch's values are labelled true/false (``template``:
    the study's, to resolve the setting). A series that is 0 or missing at every value is left out.

    Returns:
        The PNG path, or ``None`` when no configuration has a finite number to plot (every run failed
        to start, say): the report says what happened without a figure.
    """
    series = [
        ("train reward, last k steps", "o", [c.last_k_reward for c in configs]),
        ("held-out p@1", "s", [c.pass_at_1 for c in configs]),
        ("held-out p@2", "^", [c.pass_at_2 for c in configs]),
    ]
    series = [s for s in series if any(math.isfinite(y) and y != 0 for y in s[2])]
    if not series:
        return None
    xs = [c.value for c in configs]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for label, marker, ys in series:
        ax.plot(xs, ys, marker=marker, label=label)
    if baseline is not None and math.isfinite(baseline.mean_reward):
        ax.axhline(baseline.mean_reward, color="grey", linestyle=":", label="untrained baseline")
    for c in configs:
        if c.stable and stability:
            ax.axvline(c.value, color="green", alpha=0.15)
    if variable in ("batch_size", "group_size", "lr") and min(xs) > 0:
        ax.set_xscale("log", base=2 if variable != "lr" else 10)
        ax.set_xlim(min(xs) / 1.5, max(xs) * 1.5)  # from the values, not from the finite points alone
    labels = [value_text(variable, template, x) for x in xs]
    if any(label in ("true", "false") for label in labels):
        ax.set_xticks(xs, labels)
    ax.set_xlabel(variable + (" (green: stable on every seed)" if stability else ""))
    ax.set_ylabel("reward / pass rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)
