"""What the report's figures, one-line verdict, episode counts and export say, as a fresh user reads
them (issue 34's fresh-user check): integer step ticks, held-out intervals within the reward's range,
a settling command on every line, training episodes counted per run, strict JSON exports."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest

from a3r.study import plots
from a3r.study.analysis import RewardSummary
from a3r.study.headline import MAX_CHARS, NOT_RUN, budget_advice, headline
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


def _effect(verdict: str, *, unit: str, n: int, more: int | None, **numbers: float) -> dict[str, Any]:
    return (
        {"estimate": 0.0, "low": math.nan, "high": math.nan}
        | numbers
        | {
            "verdict": verdict,
            "n": n,
            "unit": unit,
            "more_needed": more,
        }
    )


def test_the_line_ends_with_what_settles_it_when_only_the_held_out_effect_has_an_interval() -> None:
    """Found by a fresh user: the train effect had no interval (nothing would settle it) while the
    held-out one said "≈ 40 more episodes would settle it"; the line ended without a command."""
    evidence = {
        "effect": _effect("unconfirmed", unit="steps", n=4, more=None),
        "held_out_effect": _effect("unconfirmed", unit="episodes", n=16, more=40, low=-0.33, high=0.33),
    }
    line = headline(
        "d", json.dumps(evidence), question="train arithmetic level=1", kind="vibe", status="unconfirmed"
    )
    assert len(line) <= MAX_CHARS and line.endswith("; settle: ≈ 40 more episodes"), line
    assert "held-out Δ +0.000 (95% CI -0.330…+0.330)" in line


@pytest.mark.parametrize("budget_s", [401.0, 600.0, 10.0])
def test_a_study_the_budget_stopped_ends_with_the_budget_that_would_let_it_run(budget_s: float) -> None:
    question = "train arithmetic level=1"
    stopped = (
        "stopped: the smoke run smoke ended budget: wall-time budget of 401 s spent at step 0; "
        + budget_advice(budget_s)
    )
    minutes = max(1, math.ceil(2 * budget_s / 60))
    line = headline(stopped, None, question=question, kind="vibe", status="unconfirmed")
    assert line.startswith("stopped: the smoke run smoke ended budget")
    assert (
        line.endswith(f"; settle: a3r vibe '{question}' --budget-minutes {minutes}")
        and len(line) <= MAX_CHARS
    )
    not_run = {"effect": _effect("unconfirmed", unit="steps", n=0, more=None, estimate=math.nan)}
    statement = f"hypothesis not run: not estimated; the budget ran out before a trainer step: {budget_advice(budget_s)}"
    line = headline(statement, not_run, question=question * 8, kind="vibe", status="unconfirmed")
    assert line.startswith(NOT_RUN + ": train reward Δ not estimated")
    assert (
        line.endswith(f"; settle: a3r vibe <same request> --budget-minutes {minutes}")
        and len(line) <= MAX_CHARS
    )


def _pool(server_dir: Path, trained_at: dict[int, int]) -> None:
    """A server's pool whose steps each trained ``trained_at[step]`` finished train episodes, plus two
    finished after the last step (untrained)."""
    from swarm.pool import Pool, StoredEpisode
    from swarm.protocol import EpisodeKind, EpisodeStatus

    server_dir.mkdir(parents=True)
    pool = Pool(server_dir / "pool.db")
    ids = iter(range(1000))
    for step, n in [*trained_at.items(), (0, 2)]:
        names = [f"e{next(ids)}" for _ in range(n)]
        for name in names:
            episode = StoredEpisode(id=name, task_id="t", client_id="c", kind=EpisodeKind.TRAIN,
                                    status=EpisodeStatus.FINISHED, created_at=0.0, finished_at=1.0,
                                    metrics={"goal": 1.0})  # fmt: skip
            pool.add(episode, [])
        if step:
            pool.mark_trained(names, step)
    pool.close()


def test_a_run_on_a_shared_server_counts_the_episodes_its_own_steps_trained(tmp_path: Path) -> None:
    """Found by a fresh user: a continuation on the smoke run's and first run's server read
    ``train-s0-c | finished | 4 | 0`` (4 steps on 0 episodes; its client finished none, the steps trained
    the earlier clients' episodes), and the log ``reached step 4 (steps 4, 0 episodes…)``."""
    from types import SimpleNamespace

    from a3r.study.plans import TrainingSettings
    from a3r.study.runs import RunSpec, episodes_text
    from a3r.swarmops.execution import _outcome

    root = tmp_path / "study"
    _pool(root / "servers" / "main-s0", {1: 4, 2: 4, 3: 4, 4: 4})
    spec = RunSpec(
        key="train-s0-c", purpose="train", server_key="main-s0", settings=TrainingSettings(steps=4)
    )
    run: Any = SimpleNamespace(
        spec=spec, run_id=3, started=0.0, run_dir=root, handle=SimpleNamespace(process=object()),
        ws=SimpleNamespace(server_dir=lambda key: root / "servers" / key),
    )  # fmt: skip
    outcome = _outcome(
        run, "finished", "reached step 4", rows=[], episodes=[], last_step=4, start_step=1, client_s=1.0,
        seconds_per_step=1.0, diagnoses=[], eval_summary=None, eval_s=0.0,
    )  # fmt: skip
    assert (outcome.episodes, outcome.trained_episodes) == (12, 12)  # steps 2–4, not step 1's, not the tail
    assert episodes_text(outcome) == "12" and outcome.parts == {"goal": [1.0, 1.0, 1.0]}
    first = _outcome(
        run, "finished", "reached step 1", rows=[], episodes=[], last_step=1, start_step=0, client_s=1.0,
        seconds_per_step=1.0, diagnoses=[], eval_summary=None, eval_s=0.0,
    )  # fmt: skip
    assert (first.episodes, first.trained_episodes) == (4, 4)  # step 1's, not the continuation's steps


def test_a_smoke_run_that_ate_the_budget_is_said_once_and_plainly() -> None:
    """Found by a fresh user: "-105 s left for training … so training runs 1 of the 4 steps (≈ 996 s) …
    warning: 1 step are fewer than…" after a smoke run that took 819 s of the 818 s left."""
    from a3r.study.plans import TrainingSettings
    from a3r.study.research import size_training

    settings = TrainingSettings(steps=4, batch_size=1, group_size=2)
    for budget_s in (61.0, 300.0):  # the reserve and margin take it all; or leave less than one step
        sizing = size_training(
            settings, seconds_per_episode=300.0, budget_s=budget_s, reserve_s=30, margin_s=60
        )
        note = sizing.note
        assert sizing.steps == 1 and not re.search(r"-[\d,]+ s", note), note
        assert "not one of the 4 steps fits" in note and note.count("the smoke run used the time") == 1, note
        assert "training runs" not in note and "warning" not in note, note
    one = size_training(TrainingSettings(steps=4, batch_size=1, group_size=2), seconds_per_episode=30.0,
                        budget_s=200.0, reserve_s=30, margin_s=60)  # fmt: skip
    assert one.steps == 1 and "1 step is fewer than" in one.note and " are fewer" not in one.note
    assert f"training runs 1 of the 4 steps (≈ {one.seconds_per_step:,.0f} s)" in one.note
    assert one.seconds_per_step <= one.available_s  # what it says it runs fits in what it says is left
