"""Typed state of the research graph, with its reducers.

The state holds only plain data (pydantic models and builtins) so that checkpoints deserialise with
an explicit allow-list (`STATE_TYPES`): clients, the store and the provider travel in the run context
(`a3r.graph.context.RunContext`), never here.

Reducers: ``outcomes``, ``decisions`` and ``log`` append (``operator.add``); ``artifacts`` merges
dicts; every other key is replaced by the node that writes it.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from a3r.analysis import Diagnosis, DiagnosisKind, RewardSummary
from a3r.plans import (
    HypothesisDraft,
    PlanDraft,
    StabilityCriterion,
    SweepSpec,
    TrainingSettings,
)

__all__ = [
    "STATE_TYPES",
    "PatchDecision",
    "PatchReview",
    "ResearchState",
    "RunOutcome",
    "RunSpec",
    "first_hypothesis",
    "merge_dicts",
]

Mode = Literal["vibe", "research"]
RunPurpose = Literal["preflight", "smoke", "train", "sweep"]
RunStatusName = Literal["finished", "crashed", "hung", "budget", "failed_to_start", "needs_attention"]


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
        wall_s: Wall time in seconds.
        curve: ``(step, mean train reward)`` per trainer step (``GET /api/v1/metrics``).
        episode_curve: Mean reward of successive train groups (client records), for runs without steps.
        eval: Held-out rewards (p@1, p@2, mean) when evaluated.
        train: Train-episode rewards summary.
        diagnoses: Detections (crash, zero signal, collapse...).
        final_metrics: Last trainer-step metrics.
        run_dir: Files of the run.
        seconds_per_episode: Measured client throughput (for budget scheduling).
        seconds_per_step: Measured trainer cadence (``nan`` without steps).
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


class PatchReview(BaseModel):
    """The payload of a patch-approval interrupt (what a human sees), with the allowed actions.

    Resume the graph with ``Command(resume={"action": "approve" | "reject", "by": ..., "note": ...})``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    patch_id: int
    file: str
    diff: str
    rationale: str
    diagnosis: str
    proposed_by: str
    actions: tuple[Literal["approve", "reject"], ...] = ("approve", "reject")


class PatchDecision(BaseModel):
    """A decision on a patch (from a human through the interrupt, or ``--auto-approve``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    patch_id: int
    action: Literal["approve", "reject"]
    by: str = "user"
    note: str | None = None


def merge_dicts(left: dict[str, int] | None, right: dict[str, int] | None) -> dict[str, int]:
    """Reducer: keys of ``right`` overwrite those of ``left``."""
    return {**(left or {}), **(right or {})}


class ResearchState(TypedDict, total=False):
    """State of one thread (one ``a3r vibe`` or ``a3r research`` invocation).

    Keys: ``request`` (the user's sentence), ``mode``, ``force`` (research: go on when the baseline is
    zero), ``overrides`` (`TrainingSettings` fields the user fixed on the command line), ``study_id``, ``hypothesis_ids``, ``plan``, ``workspace`` (folder of the rendered code),
    ``artifacts`` (file → store artifact id), ``queue`` (runs to do, head first), ``outcomes`` (one
    per executed run), ``pending_patch`` (the patch awaiting a decision), ``decisions``, ``stage``,
    ``baseline`` (preflight held-out rewards), ``conclusion``, ``report`` (path), ``log``.
    """

    request: str
    mode: Mode
    force: bool
    overrides: dict[str, Any]
    study_id: int
    hypothesis_ids: list[int]
    plan: PlanDraft
    workspace: str
    artifacts: Annotated[dict[str, int], merge_dicts]
    queue: list[RunSpec]
    outcomes: Annotated[list[RunOutcome], operator.add]
    pending_patch: PatchReview | None
    decisions: Annotated[list[PatchDecision], operator.add]
    stage: str
    baseline: RewardSummary | None
    conclusion: str | None
    report: str | None
    log: Annotated[list[str], operator.add]


def first_hypothesis(state: ResearchState) -> int | None:
    """Id of the thread's first registered hypothesis (the one its runs test), if any."""
    ids = state.get("hypothesis_ids") or []
    return ids[0] if ids else None


STATE_TYPES: tuple[type, ...] = (
    RunSpec,
    RunOutcome,
    PatchReview,
    PatchDecision,
    PlanDraft,
    TrainingSettings,
    HypothesisDraft,
    SweepSpec,
    StabilityCriterion,
    RewardSummary,
    Diagnosis,
    DiagnosisKind,
)
"""Every non-builtin type stored in the state: the checkpointer's deserialisation allow-list."""
