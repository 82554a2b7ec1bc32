"""Tables of the knowledge store and the create/public/update models around them.

One study (a research question) holds hypotheses, experiments (each run several times with different
seeds), code artifacts (versioned workflow/reward/data/report code) with the patches proposed against
them, findings and an event log::

    Study ─┬─ Hypothesis ──────────────┐ (tested by)
           ├─ Experiment ─── Run ─┬─ MetricPoint
           │                      └─ Event
           ├─ CodeArtifact ─── Patch
           ├─ Finding ─── FindingEvidence ─── Run
           └─ Event

For each record there is a ``*Base`` model with the fields callers provide, the table model, a
``*Create`` model validating new records, a ``*Public`` model returned by the store (detached from any
session, safe to keep), and an ``*Update`` model for the fields that may change. All timestamps are
aware UTC datetimes. Free-text, URL and JSON columns scrub secrets on write (`memory._secrets`).
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from pydantic import field_validator
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel

from memory._secrets import ScrubbedJSON, ScrubbedString, ScrubbedText
from memory._vocabulary import ArtifactKind, EventLevel, FindingStatus, PatchStatus, RunStatus, StudyStatus

__all__ = [
    "ArtifactKind",
    "CodeArtifact",
    "CodeArtifactPublic",
    "Event",
    "EventLevel",
    "EventPublic",
    "Experiment",
    "ExperimentCreate",
    "ExperimentPublic",
    "Finding",
    "FindingCreate",
    "FindingEvidence",
    "FindingPublic",
    "FindingStatus",
    "FindingUpdate",
    "Hypothesis",
    "HypothesisCreate",
    "HypothesisPublic",
    "MetricPoint",
    "MetricPointPublic",
    "Patch",
    "PatchPublic",
    "PatchStatus",
    "Run",
    "RunCreate",
    "RunPublic",
    "RunStatus",
    "RunUpdate",
    "RunWithMetrics",
    "Study",
    "StudyCreate",
    "StudyPublic",
    "StudyStatus",
    "StudyUpdate",
    "metadata",
    "utcnow",
]

# The store keeps its tables in its own registry so that other SQLModel users in the same process
# (the swarm pool, tests) never mix tables into its metadata or its migrations.
_registry = registry()


class StoreModel(SQLModel, registry=_registry):
    """Root of every model in the store (tables and data models)."""


metadata = _registry.metadata
"""Metadata holding exactly the store's tables; the target of the Alembic migrations."""


def utcnow() -> datetime:
    """Current time as an aware UTC datetime (the only kind stored)."""
    return datetime.now(UTC)


def _str_enum(enum_cls: type[enum.Enum]) -> sa.Enum:
    # Stored as VARCHAR holding the value (no native PostgreSQL ENUM type), so that adding a member
    # later needs no migration.
    return sa.Enum(
        enum_cls,
        native_enum=False,
        create_constraint=False,
        length=16,
        values_callable=lambda members: [member.value for member in members],
    )


def _json(nullable: bool = False) -> Any:
    return ScrubbedJSON(none_as_null=True) if nullable else ScrubbedJSON()


# ----------------------------------------------------------------------------------------- Study
class StudyBase(StoreModel):
    """Fields a caller gives when registering a study."""

    question: str = Field(min_length=1, sa_type=ScrubbedText)
    """The research question, in one sentence."""
    kind: str = Field(default="research", max_length=32)
    """What drives the study, e.g. ``"research"`` (the graph) or ``"vibe"`` (interactive)."""


class Study(StudyBase, table=True):
    """A research question and its outcome (table ``study``)."""

    id: int | None = Field(default=None, primary_key=True)
    status: StudyStatus = Field(default=StudyStatus.open, sa_type=_str_enum(StudyStatus))
    conclusion: str | None = Field(default=None, sa_type=ScrubbedText)
    """What was concluded, once ``status`` is ``concluded``."""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class StudyCreate(StudyBase):
    """Input of `Store.create_study`."""


class StudyPublic(StudyBase):
    """A study as the store returns it."""

    id: int
    status: StudyStatus
    conclusion: str | None
    created_at: datetime
    updated_at: datetime


class StudyUpdate(StoreModel):
    """Changes to a study; only the fields set are applied."""

    question: str | None = Field(default=None, min_length=1)
    status: StudyStatus | None = None
    conclusion: str | None = None


# ------------------------------------------------------------------------------------ Hypothesis
class HypothesisBase(StoreModel):
    """Fields of a pre-registered hypothesis."""

    statement: str = Field(min_length=1, sa_type=ScrubbedText)
    """What is claimed, e.g. "a KL penalty of 0.05 avoids collapse on countdown"."""
    expected_outcome: str = Field(min_length=1, sa_type=ScrubbedText)
    """What the runs should show if the statement holds."""
    decision_rule: str = Field(min_length=1, sa_type=ScrubbedText)
    """How results decide, fixed in advance, e.g. "held-out accuracy +2 points on 3 of 3 seeds"."""


class Hypothesis(HypothesisBase, table=True):
    """A hypothesis registered before the runs that test it (table ``hypothesis``)."""

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", index=True)
    registered_at: datetime = Field(default_factory=utcnow)


class HypothesisCreate(HypothesisBase):
    """Input of `Store.register_hypothesis`."""


class HypothesisPublic(HypothesisBase):
    """A hypothesis as the store returns it."""

    id: int
    study_id: int
    registered_at: datetime


# ------------------------------------------------------------------------------------ Experiment
class ExperimentBase(StoreModel):
    """Fields a caller gives when creating an experiment."""

    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", sa_type=ScrubbedText)
    template: str | None = Field(default=None, max_length=200)
    """Task template the experiment uses (a folder name under ``templates/``), if any."""


class Experiment(ExperimentBase, table=True):
    """A set of runs (usually one per seed) under one configuration (table ``experiment``)."""

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", index=True)
    hypothesis_id: int | None = Field(default=None, foreign_key="hypothesis.id")
    """The hypothesis the experiment tests; may only be set before its first run."""
    created_at: datetime = Field(default_factory=utcnow)


class ExperimentCreate(ExperimentBase):
    """Input of `Store.create_experiment`."""


class ExperimentPublic(ExperimentBase):
    """An experiment as the store returns it."""

    id: int
    study_id: int
    hypothesis_id: int | None
    created_at: datetime


# ------------------------------------------------------------------------------------------- Run
class RunBase(StoreModel):
    """Fields a caller gives when starting a run."""

    name: str = Field(default="", max_length=200)
    config: dict[str, Any] = Field(default_factory=dict, sa_type=_json())
    """Full configuration of the run (scrubbed of secrets when stored)."""
    seed: int | None = None
    """Random seed of the run."""
    server_url: str | None = Field(default=None, max_length=500, sa_type=ScrubbedString(500))
    """Base URL of the swarm server the run trained on."""
    run_dir: str | None = Field(default=None, max_length=1000)
    """Directory holding the run's files (logs, checkpoints)."""
    git_commit: str | None = Field(default=None, max_length=64)
    """Commit of the code the run used (added by revision 0002)."""


class Run(RunBase, table=True):
    """One training/evaluation run against a swarm server (table ``run``)."""

    id: int | None = Field(default=None, primary_key=True)
    experiment_id: int = Field(foreign_key="experiment.id", index=True)
    status: RunStatus = Field(default=RunStatus.running, sa_type=_str_enum(RunStatus), index=True)
    """Indexed (revision 0002) for the runner's and the TUI's "what is running" queries."""
    final_metrics: dict[str, float] | None = Field(default=None, sa_type=_json(nullable=True))
    """Metrics at the end of the run, by name."""
    error: str | None = Field(default=None, sa_type=ScrubbedText)
    """Why the run failed, when ``status`` is ``failed``."""
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class RunCreate(RunBase):
    """Input of `Store.start_run`."""


class RunPublic(RunBase):
    """A run as the store returns it."""

    id: int
    experiment_id: int
    status: RunStatus
    final_metrics: dict[str, float] | None
    error: str | None
    started_at: datetime
    finished_at: datetime | None


class RunWithMetrics(RunPublic):
    """A run with the latest value of each metric it logged (highest step wins)."""

    study_id: int
    latest_metrics: dict[str, float] = Field(default_factory=dict)
    latest_step: int | None = None
    """Highest step of any metric point, or ``None`` when none was logged."""


class RunUpdate(StoreModel):
    """Changes to a run's descriptive fields; only the fields set are applied."""

    name: str | None = Field(default=None, max_length=200)
    config: dict[str, Any] | None = None
    seed: int | None = None
    server_url: str | None = Field(default=None, max_length=500)
    run_dir: str | None = Field(default=None, max_length=1000)
    git_commit: str | None = Field(default=None, max_length=64)


# ------------------------------------------------------------------------------------ MetricPoint
class MetricPoint(StoreModel, table=True):
    """One scalar metric of a run at one training step."""

    __table_args__ = (sa.Index("ix_metricpoint_run_name_step", "run_id", "name", "step"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="run.id")
    step: int
    """Trainer step (optimizer updates done so far)."""
    name: str = Field(max_length=200)
    """Metric name, e.g. ``"reward/mean"``, ``"kl"``, ``"clip_ratio"``."""
    value: float
    recorded_at: datetime = Field(default_factory=utcnow)


class MetricPointPublic(StoreModel):
    """A metric point as the store returns it."""

    id: int
    run_id: int
    step: int
    name: str
    value: float
    recorded_at: datetime


# ----------------------------------------------------------------------------------- CodeArtifact
class CodeArtifact(StoreModel, table=True):
    """One version of a piece of code (or a report) of a study; versions count from 1 per name."""

    __table_args__ = (sa.UniqueConstraint("study_id", "name", "version", name="uq_codeartifact_version"),)

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", index=True)
    kind: ArtifactKind = Field(sa_type=_str_enum(ArtifactKind))
    name: str = Field(max_length=200)
    """Stable name across versions, e.g. ``"reward.py"``."""
    version: int
    content: str = Field(sa_type=ScrubbedText)
    sha256: str = Field(max_length=64)
    """Hex SHA-256 of ``content`` as stored (UTF-8)."""
    created_at: datetime = Field(default_factory=utcnow)


class CodeArtifactPublic(StoreModel):
    """An artifact version as the store returns it."""

    id: int
    study_id: int
    kind: ArtifactKind
    name: str
    version: int
    content: str
    sha256: str
    created_at: datetime


# ------------------------------------------------------------------------------------------ Patch
class Patch(StoreModel, table=True):
    """A proposed change to one version of a code artifact, with its decision trail."""

    id: int | None = Field(default=None, primary_key=True)
    artifact_id: int = Field(foreign_key="codeartifact.id", index=True)
    """The artifact version the diff applies to."""
    base_version: int
    diff: str = Field(sa_type=ScrubbedText)
    """Unified diff against the base version."""
    rationale: str = Field(sa_type=ScrubbedText)
    """Why the change is proposed (the analyst's diagnosis)."""
    proposed_by: str = Field(default="analyst", max_length=100)
    status: PatchStatus = Field(default=PatchStatus.pending, sa_type=_str_enum(PatchStatus), index=True)
    decided_by: str | None = Field(default=None, max_length=100)
    decided_at: datetime | None = None
    note: str | None = Field(default=None, sa_type=ScrubbedText)
    """The decider's comment."""
    applied_at: datetime | None = None
    result_artifact_id: int | None = Field(default=None, foreign_key="codeartifact.id")
    """The artifact version produced by applying the patch."""
    created_at: datetime = Field(default_factory=utcnow)


class PatchPublic(StoreModel):
    """A patch as the store returns it, with the study, name and kind of its artifact."""

    id: int
    artifact_id: int
    base_version: int
    diff: str
    rationale: str
    proposed_by: str
    status: PatchStatus
    decided_by: str | None
    decided_at: datetime | None
    note: str | None
    applied_at: datetime | None
    result_artifact_id: int | None
    created_at: datetime
    study_id: int
    artifact_name: str
    artifact_kind: ArtifactKind


# ---------------------------------------------------------------------------------------- Finding
class FindingBase(StoreModel):
    """Fields of a finding."""

    statement: str = Field(min_length=1, sa_type=ScrubbedText)
    evidence: str = Field(default="", sa_type=ScrubbedText)
    """Summary of the evidence; the runs themselves are linked through `FindingEvidence`."""
    confidence: float = Field(ge=0.0, le=1.0)
    """Subjective probability that the statement holds, in [0, 1]."""
    status: FindingStatus = Field(default=FindingStatus.unconfirmed, sa_type=_str_enum(FindingStatus))
    seeds: list[int] = Field(default_factory=list, sa_type=_json())
    """Seeds on which the finding replicated."""
    hypothesis_id: int | None = Field(default=None, foreign_key="hypothesis.id")
    """The hypothesis the finding bears on, if any."""


class Finding(FindingBase, table=True):
    """What a study established, with its confidence and status (table ``finding``)."""

    id: int | None = Field(default=None, primary_key=True)
    study_id: int = Field(foreign_key="study.id", index=True)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class FindingEvidence(StoreModel, table=True):
    """Link: a run that is evidence for a finding."""

    finding_id: int = Field(foreign_key="finding.id", primary_key=True)
    run_id: int = Field(foreign_key="run.id", primary_key=True)


class FindingCreate(FindingBase):
    """Input of `Store.add_finding`."""

    run_ids: list[int] = Field(default_factory=list)
    """Runs that are evidence for the finding."""

    @field_validator("seeds", "run_ids")
    @classmethod
    def _unique_sorted(cls, values: list[int]) -> list[int]:
        return sorted(set(values))


class FindingPublic(FindingBase):
    """A finding as the store returns it, with the ids of its evidence runs."""

    id: int
    study_id: int
    created_at: datetime
    updated_at: datetime
    run_ids: list[int] = Field(default_factory=list)


class FindingUpdate(StoreModel):
    """Changes to a finding; only the fields set are applied."""

    statement: str | None = Field(default=None, min_length=1)
    evidence: str | None = None
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    status: FindingStatus | None = None
    seeds: list[int] | None = None
    run_ids: list[int] | None = None
    """Replaces the linked evidence runs when given."""


# ------------------------------------------------------------------------------------------ Event
class Event(StoreModel, table=True):
    """A timestamped message about a study or a run (crashes, decisions, analyst notes)."""

    __table_args__ = (
        sa.CheckConstraint("study_id IS NOT NULL OR run_id IS NOT NULL", name="ck_event_subject"),
    )

    id: int | None = Field(default=None, primary_key=True)
    study_id: int | None = Field(default=None, foreign_key="study.id", index=True)
    run_id: int | None = Field(default=None, foreign_key="run.id", index=True)
    created_at: datetime = Field(default_factory=utcnow)
    level: EventLevel = Field(default=EventLevel.info, sa_type=_str_enum(EventLevel))
    message: str = Field(sa_type=ScrubbedText)


class EventPublic(StoreModel):
    """An event as the store returns it."""

    id: int
    study_id: int | None
    run_id: int | None
    created_at: datetime
    level: EventLevel
    message: str
