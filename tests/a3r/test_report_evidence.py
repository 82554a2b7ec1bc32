"""What the report's figures, one-line verdict, episode counts and export say, as a fresh user reads
them (issue 34's fresh-user check): integer step ticks, held-out intervals within the reward's range,
a settling command on every line, training episodes counted per run, strict JSON exports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from a3r.study import plots
from a3r.study.analysis import RewardSummary
from a3r.study.runs import RunOutcome


def _captured(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plots module saves (kept open for the test to read)."""
    figures: list[Any] = []

    def keep(fig: Any, path: Path) -> Path:
        figures.append(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def _run(key: str, purpose: str, **fields: Any) -> RunOutcome:
    return RunOutcome(key=key, run_id=1, purpose=purpose, status="finished", reason="", **fields)  # type: ignore[arg-type]


def _integers(ticks: Any) -> bool:
    return len(ticks) > 0 and all(float(t).is_integer() for t in ticks)


def test_every_step_axis_has_integer_ticks_also_with_one_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _captured(monkeypatch)
    outcomes = [
        _run("smoke", "smoke", episode_curve=[0.5]),
        _run("train-s0", "train", steps=1, curve=[(1, 0.25)]),
    ]
    plots.plot_rewards(outcomes, tmp_path / "r.png")
    plots.plot_parts({"seed 0": {"format_ok": [0.5]}}, tmp_path / "p.png")
    axes = [ax for fig in figures for ax in fig.axes]
    assert len(axes) == 3
    for ax in axes:
        ax.figure.canvas.draw()
        visible = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert _integers(visible), ax.get_xticks()
    plt.close("all")


def test_held_out_intervals_stay_within_the_rewards_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _captured(monkeypatch)
    rewards = [0.0] * 15 + [1.0]
    summary = RewardSummary(
        tasks=4, episodes=16, mean_reward=1 / 16, pass_at_1=0.0, pass_at_2=0.0, rewards=rewards
    )
    outcomes = [_run("smoke", "smoke", eval=summary), _run("train-s0", "train", eval=summary)]
    plots.plot_held_out(outcomes, None, tmp_path / "h.png", scale=(0.0, 1.0))
    (ax,) = figures[0].axes
    lows = [seg[:, 1].min() for coll in ax.collections for seg in coll.get_segments()]
    assert lows and min(lows) >= 0.0
    plt.close("all")
