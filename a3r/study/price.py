"""The price of a run: wall seconds from its episodes at a speed in seconds per episode.

One rule for every place that prices time: the research dry run and the runner's budget (`estimate_run_s`,
`a3r.study.research.fit_budget`), the vibe dry run (`vibe_thread_s`) and the vibe sizing and its re-plan
after every step (`step_s`, `a3r.study.research.size_training`, `a3r.study.research.replan_training`).

A step is B·G episodes; an episode timed without a trainer update (a smoke run, a preflight, an assumed
speed) is priced with `UPDATE_SHARE` more for the update; a run adds `SERVER_OVERHEAD_S` and its held-out
evaluation's attempts at the same speed.
"""

from __future__ import annotations

import math

from a3r.study.plans import TrainingSettings
from a3r.study.runs import RunSpec

__all__ = [
    "FALLBACK_SECONDS_PER_EPISODE",
    "SERVER_OVERHEAD_S",
    "UPDATE_SHARE",
    "estimate_run_s",
    "run_s",
    "step_s",
    "vibe_thread_s",
]

SERVER_OVERHEAD_S = 20.0
"""Seconds to start, checkpoint and stop a server, added to every run's price."""

UPDATE_SHARE = 0.3
"""Seconds of a trainer update as a share of the step's rollout seconds, measured on 2 CPU cores with
LoRA on bf16 weights (who-is-the-spy: 23–28 s of update per ≈ 98 s of rollouts, a3r/README.md
§Measured); used until a run has measured its own steps."""

FALLBACK_SECONDS_PER_EPISODE = 2.0
"""Seconds per episode a sweep run is priced at when no speed is known (not finite or ≤ 0)."""


def step_s(
    batch_size: int, group_size: int, seconds_per_episode: float, *, update_share: float = 0.0
) -> float:
    """Wall seconds of one trainer step: B·G episodes at ``seconds_per_episode``, plus ``update_share``
    of that for the update (`UPDATE_SHARE` when the speed was timed without updates, 0 when it was timed
    on training runs whose episodes already carry their updates)."""
    return batch_size * group_size * seconds_per_episode * (1 + update_share)


def run_s(
    settings: TrainingSettings,
    *,
    seconds_per_episode: float,
    eval_episodes: int = 0,
    steps: int | None = None,
    batch_size: int | None = None,
    update_share: float = 0.0,
    train_scale: float = 1.0,
) -> float:
    """Wall seconds of one training run: `SERVER_OVERHEAD_S` + its steps (`step_s`) + its held-out
    evaluation.

    Args:
        settings: The run's training settings (steps, B, G).
        seconds_per_episode: Wall seconds per episode (measured or assumed).
        eval_episodes: Held-out attempts of its evaluation.
        steps: Steps to price instead of ``settings.steps``.
        batch_size: B to price instead of ``settings.batch_size``.
        update_share: See `step_s`.
        train_scale: Factor on the training episodes' seconds (a token cap other than the one the speed
            was measured at: `estimate_run_s`).
    """
    b = settings.batch_size if batch_size is None else batch_size
    n = settings.steps if steps is None else steps
    per_step = step_s(b, settings.group_size, seconds_per_episode * train_scale, update_share=update_share)
    return SERVER_OVERHEAD_S + n * per_step + seconds_per_episode * eval_episodes


def estimate_run_s(
    spec: RunSpec, *, seconds_per_episode: float, eval_episodes: int, measured_tokens: float | None = None
) -> float:
    """Wall seconds a sweep run should take (`run_s` at the speed its stage measured, whose episodes
    carry their updates): the dry run's estimate (`a3r.study.design`) and the runner's budget
    (`a3r.study.research.fit_budget`) both use it.

    Args:
        spec: The run.
        seconds_per_episode: Measured (or assumed) wall seconds per episode; not finite or ≤ 0:
            `FALLBACK_SECONDS_PER_EPISODE`.
        eval_episodes: Held-out attempts of its evaluation.
        measured_tokens: The response-token cap ``max_tokens`` at which ``seconds_per_episode`` was
            measured (`a3r.study.research.token_cap`). A run whose ``params`` set another cap has its
            training episodes priced at ``seconds_per_episode`` × its cap / this (generation time ∝
            tokens: an upper bound when responses run to the cap); its evaluation runs the frozen
            evaluator at the original cap.
    """
    per_episode = (
        seconds_per_episode
        if math.isfinite(seconds_per_episode) and seconds_per_episode > 0
        else FALLBACK_SECONDS_PER_EPISODE
    )
    scale = 1.0
    cap = spec.params.get("max_tokens")
    if measured_tokens and isinstance(cap, int | float) and not isinstance(cap, bool):
        scale = float(cap) / measured_tokens
    return run_s(
        spec.settings, seconds_per_episode=per_episode, eval_episodes=eval_episodes, train_scale=scale
    )


def vibe_thread_s(settings: TrainingSettings, *, seconds_per_episode: float, eval_episodes: int) -> float:
    """Wall seconds of a whole vibe thread at an assumed speed (its dry run): the smoke run's episodes,
    one training run per seed (`run_s`, with `UPDATE_SHARE`: the speed is not timed on training) and the
    two held-out evaluations (before and after training) of ``eval_episodes`` attempts each."""
    smoke = settings.smoke_tasks * settings.group_size * seconds_per_episode
    training = run_s(settings, seconds_per_episode=seconds_per_episode, update_share=UPDATE_SHARE)
    return smoke + len(settings.seeds) * training + 2 * eval_episodes * seconds_per_episode
