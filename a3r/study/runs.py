"""The run types: what the runner should execute (`RunSpec`) and what a run produced (`RunOutcome`).

Plain frozen pydantic data, shared by the research graph (its state holds them), the run executor
(`a3r.swarmops.execution`), the sweep logic (`a3r.study.research`) and the report.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from a3r.study.analysis import Diagnosis, RewardSummary
from a3r.study.plans import StabilityCriterion, TrainingSettings
from a3r.study.run_status import STORE_STATUS, RunStatusName, status_text
from a3r.study.sequential import SignalCheck

__all__ = [
    "STORE_STATUS",
    "Resizing",
    "RunOutcome",
    "RunPurpose",
    "RunSpec",
    "RunStatusName",
    "TenantStageTiming",
    "episodes_text",
    "status_text",
]

RunPurpose = Literal["preflight", "smoke", "train", "sweep"]


class Resizing(BaseModel):
    """How a training run the budget sized (`a3r.study.research.size_training`) re-plans itself after
    every step from its measured step time (`a3r.study.research.replan_training`): up to the steps and B
    asked for, within its share of the budget.

    Attributes:
        asked_steps: The steps asked for before the sizing.
        asked_batch_size: The B asked for before the sizing.
        margin_s: Seconds of the thread's budget left unplanned (`a3r.study.research.SAFETY_SHARE`).
        later_runs: Training runs after this one that share the budget left (later seeds).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    asked_steps: int
    asked_batch_size: int
    margin_s: float = 0.0
    later_runs: int = 0


class TenantStageTiming(BaseModel):
    """The measured wall time of a sweep stage run as tenants of one server (`a3r.swarmops.tenancy.
    execute_stage`), kept on each of its runs' outcomes: what the next stage's price is measured from
    (`a3r.study.research.measured_tenants`), since a tenant's own wall time overlaps the others'.

    Attributes:
        wall_s: Seconds from the server's start to its stop, every run's held-out evaluation included.
        start_s: Of those, the seconds until the server was ready (``swarm serve --tenants`` and, on
            vLLM, its engine start).
        runs: Runs of the stage.
        waves: Runs resident at once at most (`a3r.swarmops.tenancy.TenantSettings.max_tenants`) divide
            the runs into this many waves: ⌈runs / places⌉.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    wall_s: float
    start_s: float
    runs: int
    waves: int = 1


class RunSpec(BaseModel):
    """One run the runner should execute.

    Attributes:
        key: Unique within the thread (``smoke``, ``train-s0``, ``coarse-batch_size=4-s1``): the
            idempotency key of the run's store record and its run dir.
        purpose: ``preflight`` (held-out eval of the untrained model, training off), ``smoke`` (a few
            episodes through the workflow), ``train`` (training to ``settings.steps``) or ``sweep`` (a
            training run of a sweep, then a held-out eval).
        seed: Run seed (data order of the client, the server's sampling seed).
        settings: Training settings.
        stage: Sweep stage (``coarse``/``refine``) or ``""``.
        value: The swept value of a sweep run.
        server_key: Runs with the same server key share one live server (smoke then train; a hot-swapped
            client continues on it).
        keep_server: Leave the server running after this run (a later run continues on it).
        start_step: For a continuation: the policy step the server had reached.
        early_stop: Stop the client early when the live detectors see a patchable problem.
        stability: Thresholds of the collapse detectors (the plan's stability criterion).
        params: Template parameters this run overrides (a study varying a template knob): the run
            trains with a copy of the workflow with these values; held-out evaluation keeps the frozen
            original.
        reward_patch: The approved reward patch whose reward this run trains on (a continuation after
            the patch, and the continuations after it); ``None`` for the reward as first written.
        resize: How the run re-plans its steps and B after every step (a training run the budget
            sized); ``None``: it trains ``settings`` as they are.
        tenant: The LoRA tenant it trains as on its stage's shared server (``server_key``), set by the
            executor (`a3r.swarmops.tenancy`); ``None``: the server's one policy.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    purpose: RunPurpose
    seed: int = 0
    settings: TrainingSettings = Field(default_factory=TrainingSettings)
    stage: str = ""
    value: float | None = None
    server_key: str = ""
    keep_server: bool = False
    start_step: int = 0
    early_stop: bool = False
    stability: StabilityCriterion = Field(default_factory=StabilityCriterion)
    params: dict[str, bool | int | float | str | None] = Field(default_factory=dict)
    reward_patch: int | None = None
    resize: Resizing | None = None
    tenant: str | None = None

    def outcome_fields(self) -> dict[str, Any]:
        """The fields a run's `RunOutcome` copies from its spec."""
        return {
            "key": self.key,
            "purpose": self.purpose,
            "seed": self.seed,
            "stage": self.stage,
            "value": self.value,
            "reward_patch": self.reward_patch,
            "planned_steps": self.settings.steps,
        }


class RunOutcome(BaseModel):
    """What a run produced (every number comes from the server API or the client's files).

    Attributes:
        key: The spec's key.
        run_id: Store id of the run.
        purpose: The spec's purpose.
        seed: The spec's seed.
        stage: The spec's sweep stage.
        value: The spec's swept value.
        status: How it ended.
        reason: One readable line.
        steps: Policy step reached on the server.
        episodes: Finished train episodes.
        trained_episodes: Of those, the ones a trainer step of this run consumed (trained, or dropped
            as zero-signal); the rest finished after the last batch was taken. ``None``: not counted
            (a smoke run, an outcome recorded before this was).
        wall_s: Wall time in seconds.
        curve: ``(step, mean train reward)`` per trainer step (``GET /api/v1/metrics``).
        episode_curve: Mean reward of successive train groups (client records), for runs without steps.
        eval: Held-out rewards (p@1, p@2, mean) when evaluated.
        train: Train-episode rewards summary.
        diagnoses: Detections (crash, zero signal, collapse...).
        final_metrics: Last trainer-step metrics.
        run_dir: Files of the run.
        seconds_per_episode: Measured client throughput: the client's wall seconds per finished train
            episode (server start and evaluation left out; for budget scheduling).
        seconds_per_step: Measured trainer cadence (``nan`` without steps).
        eval_s: Seconds its held-out evaluation took (``nan`` when none ran).
        parts: Curves of the reward's parts (`a3r.study.analysis.part_curves`: one point per trainer
            step, over the episodes it consumed), by metric name.
        signal: A preflight's sequential futility test after its last look (`a3r.study.sequential`).
        reward_patch: The spec's reward patch (``None``: the reward as first written).
        overhead_s: The thread's wall seconds around the run that ``wall_s`` leaves out, counted
            against its budget too (`a3r.study.research.spent_s`): since the previous run ended (or
            the thread started or resumed) — planning, the code check, analysis — and after ``wall_s``
            was taken, e.g. stopping the run's server. 0 for a reused prior run.
        shared_s: Of ``wall_s``, the seconds it ran side by side with another run of its stage that
            counts them (tenants of one server, `a3r.swarmops.tenancy`): left out of the thread's spent
            time, so that a stage's concurrent runs count its wall time once.
        tenant: The LoRA tenant it trained as on its stage's shared server (``None``: a server of its own).
        tenant_server: That server's key (``coarse-tenants``).
        tenant_stage: The measured time of the tenant stage it ran in (the same on every run of it;
            ``None``: a server of its own, or an outcome recorded before this was).
        planned_steps: The trainer steps its spec planned (``settings.steps``): a run the budget stopped
            before them is not a completed run (`a3r.study.stability.not_run_reason`). ``None``: not
            recorded (an outcome stored before this was).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    run_id: int
    purpose: RunPurpose = "train"
    seed: int = 0
    stage: str = ""
    value: float | None = None
    status: RunStatusName
    reason: str
    steps: int = 0
    episodes: int = 0
    trained_episodes: int | None = None
    wall_s: float = 0.0
    curve: list[tuple[int, float]] = Field(default_factory=list)
    episode_curve: list[float] = Field(default_factory=list)
    eval: RewardSummary | None = None
    train: RewardSummary | None = None
    diagnoses: list[Diagnosis] = Field(default_factory=list)
    final_metrics: dict[str, float] = Field(default_factory=dict)
    run_dir: str = ""
    seconds_per_episode: float = float("nan")
    seconds_per_step: float = float("nan")
    parts: dict[str, list[float]] = Field(default_factory=dict)
    eval_s: float = float("nan")
    reward_patch: int | None = None
    signal: SignalCheck | None = None
    overhead_s: float = 0.0
    shared_s: float = 0.0
    tenant: str | None = None
    tenant_server: str | None = None
    tenant_stage: TenantStageTiming | None = None
    planned_steps: int | None = None


def episodes_text(outcome: RunOutcome) -> str:
    """A run's finished train episodes for the report's runs table and the runner's log line, the ones
    no step of the run trained marked apart: ``16 (+3 untrained)``; its trained ones where it finished
    none itself (a continuation on the same server trains what earlier clients finished)."""
    trained = outcome.trained_episodes
    if trained is None or trained >= outcome.episodes:
        return str(outcome.episodes)
    return f"{trained} (+{outcome.episodes - trained} untrained)"
