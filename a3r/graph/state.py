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

from pydantic import BaseModel, ConfigDict

from a3r.study.analysis import Diagnosis, DiagnosisKind, RewardSummary
from a3r.study.design import PriorFinding
from a3r.study.plans import (
    HypothesisDraft,
    PlanDraft,
    StabilityCriterion,
    SweepSpec,
    TrainingSettings,
)
from a3r.study.runs import Resizing, RunOutcome, RunSpec
from a3r.study.sequential import SignalCheck
from a3r.study.stages import Stage

__all__ = [
    "STATE_TYPES",
    "PatchDecision",
    "PatchReview",
    "PatchState",
    "PlanState",
    "RequestState",
    "ResearchState",
    "ResultState",
    "RunsState",
    "StudyState",
    "first_hypothesis",
    "merge_dicts",
]

Mode = Literal["vibe", "research"]


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


class RequestState(TypedDict, total=False):
    """What the user asked: ``request`` (the sentence), ``mode``, ``force`` (research: go on when the
    preflight finds no signal), ``overrides`` (`TrainingSettings` fields fixed on the command line)."""

    request: str
    mode: Mode
    force: bool
    overrides: dict[str, Any]


class PlanState(TypedDict, total=False):
    """What the planner decided: ``study_id`` and ``hypothesis_ids`` (store records), ``plan`` (after
    the vibe sizing it carries the sized steps and B), ``workspace`` (folder of the rendered code),
    ``artifacts`` (file → store artifact id), ``sizing`` (how the training run was fitted to the budget,
    `a3r.study.research.size_training`)."""

    study_id: int
    hypothesis_ids: list[int]
    plan: PlanDraft
    workspace: str
    artifacts: Annotated[dict[str, int], merge_dicts]
    sizing: str | None


class RunsState(TypedDict, total=False):
    """The runs: ``queue`` (to do, head first), ``outcomes`` (one per executed or reused run) and ``ran``."""

    queue: list[RunSpec]
    outcomes: Annotated[list[RunOutcome], operator.add]
    ran: int
    """Outcomes the runner's last step added: 1, or the runs of a stage run as tenants together."""


class StudyState(TypedDict, total=False):
    """Where a research study stands (`a3r.study.stages.StudyProgress` is read from these): ``stage``
    (`Stage`; a checkpoint from before the type stored a plain string, which `Stage` reads back),
    ``baseline`` (preflight held-out rewards), ``priors`` (findings of earlier studies whose runs this
    one reuses), ``refine_rounds`` (refine stages run), ``dropped`` (coarse values the budget left out,
    re-admitted when the measured speed fits them), ``budget_cuts`` (what the budget skipped or cut, with
    its numbers, for the report), ``unstarted`` (``(value, seed)`` of the planned sweep runs a budget
    re-plan dropped before they started: the report lists each as not run unless it ran later)."""

    stage: Stage
    baseline: RewardSummary | None
    priors: list[PriorFinding]
    refine_rounds: int
    dropped: list[float]
    budget_cuts: Annotated[list[str], operator.add]
    unstarted: Annotated[list[tuple[float, int]], operator.add]


class PatchState(TypedDict, total=False):
    """Reward patches: ``pending_patch`` (the one awaiting a decision) and ``decisions``."""

    pending_patch: PatchReview | None
    decisions: Annotated[list[PatchDecision], operator.add]


class ResultState(TypedDict, total=False):
    """What the thread ends with: ``conclusion``, ``report`` (path) and ``log`` (every line said)."""

    conclusion: str | None
    report: str | None
    log: Annotated[list[str], operator.add]


class ResearchState(RequestState, PlanState, RunsState, StudyState, PatchState, ResultState, total=False):
    """State of one thread (one ``a3r vibe`` or ``a3r research`` invocation): one flat dict whose keys
    are grouped by who writes them (the request, the plan, the runs, the study's stages, patches, the
    result). Flat, so that checkpoints written before the grouping load unchanged."""


def first_hypothesis(state: ResearchState) -> int | None:
    """Id of the thread's first registered hypothesis (the one its runs test), if any."""
    ids = state.get("hypothesis_ids") or []
    return ids[0] if ids else None


STATE_TYPES: tuple[type, ...] = (
    RunSpec,
    Resizing,
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
    SignalCheck,
    PriorFinding,
    Stage,
)
"""Every non-builtin type stored in the state: the checkpointer's deserialisation allow-list."""
