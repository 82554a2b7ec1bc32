"""The price of a run: wall seconds from its episodes at a speed in seconds per episode.

One rule for every place that prices time: the research dry run and the runner's budget (`estimate_run_s`,
`a3r.study.research.fit_budget`), the vibe dry run (`vibe_thread_s`) and the vibe sizing and its re-plan
after every step (`step_s`, `a3r.study.research.size_training`, `a3r.study.research.replan_training`).

A step is B·G episodes; an episode timed without a trainer update (a smoke run, a preflight, an assumed
speed) is priced with `UPDATE_SHARE` more for the update; a run adds `SERVER_OVERHEAD_S` and its held-out
evaluation's attempts at the same speed.

A sweep stage is priced by `stage_s` wherever it is priced (the dry run, `a3r.study.research.fit_budget`,
the re-plans of `a3r.study.stages`, the reporter's settle budget): runs on servers of their own cost the
sum of their prices, one after another; runs trained side by side as LoRA tenants of one server
(`Serving`, issue 36) cost one server start plus, per wave of at most ``max_tenants`` runs, the longer
of its slowest run and its episodes at the engine's aggregate speed (`tenant_stage_s`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from a3r.study.plans import TrainingSettings
from a3r.study.runs import RunSpec

__all__ = [
    "FALLBACK_SECONDS_PER_EPISODE",
    "SEQUENTIAL",
    "SERVER_OVERHEAD_S",
    "UPDATE_SHARE",
    "Serving",
    "TenantMeasure",
    "estimate_run_s",
    "run_s",
    "stage_s",
    "step_s",
    "tenant_stage_s",
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
    per_episode = _speed(seconds_per_episode)
    scale = 1.0
    cap = spec.params.get("max_tokens")
    if measured_tokens and isinstance(cap, int | float) and not isinstance(cap, bool):
        scale = float(cap) / measured_tokens
    return run_s(
        spec.settings, seconds_per_episode=per_episode, eval_episodes=eval_episodes, train_scale=scale
    )


def _speed(seconds_per_episode: float) -> float:
    """``seconds_per_episode``, or `FALLBACK_SECONDS_PER_EPISODE` when it is not finite or ≤ 0."""
    if math.isfinite(seconds_per_episode) and seconds_per_episode > 0:
        return seconds_per_episode
    return FALLBACK_SECONDS_PER_EPISODE


@dataclass(frozen=True)
class Serving:
    """How a sweep stage's runs are served, as their price sees it.

    Attributes:
        groups: Splits a stage's runs, in queue order, into the groups the runner serves together
            (`a3r.swarmops.tenancy.serving_groups`): two or more runs are the tenants of one server, one
            run has a server of its own. ``None``: every run has its own server, one after another.
        max_tenants: Runs resident on one tenant server at once (the memory cap,
            `a3r.swarmops.tenancy.TenantSettings.max_tenants`); more run in waves.
        batched: What a wave costs before any tenant stage was measured (`TenantMeasure`): ``True``
            where the engine batches the side-by-side runs' requests (vLLM): its slowest run; ``False``
            where they share the CPU cores (hf): the sum of their work.
    """

    groups: Callable[[Sequence[RunSpec]], list[list[RunSpec]]] | None = None
    max_tenants: int = 8
    batched: bool = False

    @property
    def tenants(self) -> bool:
        """Whether a stage's runs may be tenants of one server."""
        return self.groups is not None


SEQUENTIAL = Serving()
"""Every run on a server of its own, one after another (``--no-tenants``, the hf engine by default)."""


@dataclass(frozen=True)
class TenantMeasure:
    """What the study's tenant stages measured (`a3r.study.research.measured_tenants`), for the price of
    the next one (`tenant_stage_s`).

    Attributes:
        start_s: Seconds until a stage's tenant server was ready (median over the stages).
        seconds_per_episode: The stages' aggregate speed: seconds per episode of the engine serving the
            tenants of a wave together (the wave's own episode rates summed), median over the stages; what
            the engine made of the runs side by side (≈ one run's speed / k on an engine that batches k
            runs, ≈ one run's speed where they share the cores). ``nan``: no tenant measured a speed.
        run_s: Median wall seconds of a tenant run that ran (resident on the server; its start excluded):
            the least a wave costs. 0 when none ran.
        stages: Tenant stages measured.
    """

    start_s: float
    seconds_per_episode: float
    run_s: float
    stages: int


def tenant_stage_s(
    specs: Sequence[RunSpec],
    *,
    seconds_per_episode: float,
    eval_episodes: int,
    measured_tokens: float | None = None,
    max_tenants: int = 8,
    batched: bool = False,
    measured: TenantMeasure | None = None,
) -> float:
    """Wall seconds of ``specs`` trained side by side as LoRA tenants of one server: one server start
    (measured, else `SERVER_OVERHEAD_S`) plus, per wave of at most ``max_tenants`` runs in queue order,
    the longer of

    - its slowest run: its steps and held-out evaluation at ``seconds_per_episode`` (`estimate_run_s`
      without the server start), and no less than the measured tenant run (``measured.run_s``);
    - its episodes (train, token-scaled, and held-out) at the aggregate speed of the engine: measured
      (``measured.seconds_per_episode``), else ``seconds_per_episode`` / the wave's runs where the
      engine batches them (``batched``: the wave costs its slowest run) or ``seconds_per_episode``
      where they share the cores (the wave costs the sum of its runs' work).

    Args:
        specs: The runs (one tenant server's).
        seconds_per_episode: Wall seconds per episode of one run (measured or assumed; see
            `estimate_run_s`).
        eval_episodes: Held-out attempts of each run's evaluation.
        measured_tokens: See `estimate_run_s`.
        max_tenants: Runs resident at once.
        batched: See `Serving.batched` (used only without ``measured``).
        measured: The study's measured tenant stages (`TenantMeasure`), or ``None``.
    """
    per = _speed(seconds_per_episode)
    cap = max(1, max_tenants)
    total = measured.start_s if measured is not None else SERVER_OVERHEAD_S
    floor = measured.run_s if measured is not None else 0.0
    for first in range(0, len(specs), cap):
        wave = specs[first : first + cap]
        work = [
            estimate_run_s(
                s, seconds_per_episode=per, eval_episodes=eval_episodes, measured_tokens=measured_tokens
            )
            - SERVER_OVERHEAD_S
            for s in wave
        ]
        if measured is not None and math.isfinite(measured.seconds_per_episode):
            aggregate = measured.seconds_per_episode
        else:
            aggregate = per / len(wave) if batched else per
        total += max(floor, *work, sum(work) / per * aggregate)
    return total


def stage_s(
    specs: Sequence[RunSpec],
    *,
    seconds_per_episode: float,
    eval_episodes: int,
    measured_tokens: float | None = None,
    min_run_s: float = 0.0,
    serving: Serving = SEQUENTIAL,
    measured: TenantMeasure | None = None,
) -> float:
    """Wall seconds of a sweep stage's ``specs`` as the runner serves them (``serving``): each group of
    tenants of one server by `tenant_stage_s`, each run on a server of its own by `estimate_run_s` at
    no less than ``min_run_s`` (the measured wall seconds of such a run:
    `a3r.study.research.measured_run_s`), one after another.

    Args:
        specs: The runs, in queue order.
        seconds_per_episode: See `estimate_run_s`.
        eval_episodes: Held-out attempts of each run's evaluation.
        measured_tokens: See `estimate_run_s`.
        min_run_s: The least a run on its own server costs.
        serving: How the runs are served (`SEQUENTIAL`: each on its own server).
        measured: The study's measured tenant stages, for `tenant_stage_s`.
    """

    def alone(spec: RunSpec) -> float:
        price = estimate_run_s(
            spec,
            seconds_per_episode=seconds_per_episode,
            eval_episodes=eval_episodes,
            measured_tokens=measured_tokens,
        )
        return max(min_run_s, price)

    if serving.groups is None:
        return sum(alone(s) for s in specs)
    total = 0.0
    for group in serving.groups(specs):
        if len(group) < 2:
            total += sum(alone(s) for s in group)
            continue
        total += tenant_stage_s(
            group,
            seconds_per_episode=seconds_per_episode,
            eval_episodes=eval_episodes,
            measured_tokens=measured_tokens,
            max_tenants=serving.max_tenants,
            batched=serving.batched,
            measured=measured,
        )
    return total


def vibe_thread_s(settings: TrainingSettings, *, seconds_per_episode: float, eval_episodes: int) -> float:
    """Wall seconds of a whole vibe thread at an assumed speed (its dry run): the smoke run's episodes,
    one training run per seed (`run_s`, with `UPDATE_SHARE`: the speed is not timed on training) and the
    two held-out evaluations (before and after training) of ``eval_episodes`` attempts each."""
    smoke = settings.smoke_tasks * settings.group_size * seconds_per_episode
    training = run_s(settings, seconds_per_episode=seconds_per_episode, update_share=UPDATE_SHARE)
    return smoke + len(settings.seeds) * training + 2 * eval_episodes * seconds_per_episode
