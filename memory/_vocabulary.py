"""The store's plain vocabulary, cheap to import: the lifecycle enums and the default location.

Kept apart from the tables (`memory._models`, which load SQLAlchemy and SQLModel) so a command line can
offer ``--status running`` or print the default store path without loading the database layer.
"""

from __future__ import annotations

import enum
from pathlib import Path

__all__ = [
    "DEFAULT_PATH",
    "NOT_METRICS",
    "ArtifactKind",
    "EventLevel",
    "FindingStatus",
    "PatchStatus",
    "RunStatus",
    "StudyStatus",
]

DEFAULT_PATH = Path(".a3r") / "memory.db"
"""Where the store lives when no location is configured (relative to the working directory)."""

NOT_METRICS = frozenset({"created_at"})
"""Numeric fields of a trainer's step row that are not measurements (``created_at``: a Unix time stamp):
never logged as metrics, and left out where a store written before this shows a run's metrics
(``a3r runs``, ``a3r export``)."""


class StudyStatus(enum.StrEnum):
    """Lifecycle of a study."""

    open = "open"
    """Registered; experiments are being planned or run."""
    concluded = "concluded"
    """Finished with a conclusion."""
    abandoned = "abandoned"
    """Stopped without a conclusion (e.g. the question was ill-posed)."""


class RunStatus(enum.StrEnum):
    """Lifecycle of a run: ``running`` then one of the three terminal states."""

    running = "running"
    """Started and not yet finished."""
    finished = "finished"
    """Completed; ``final_metrics`` holds its results."""
    failed = "failed"
    """Crashed or was killed; ``error`` says why."""
    cancelled = "cancelled"
    """Stopped on purpose before completion."""


class ArtifactKind(enum.StrEnum):
    """What a code artifact is."""

    workflow = "workflow"
    """Agent workflow code run by the client for each episode."""
    reward = "reward"
    """Reward function scoring episodes."""
    data = "data"
    """Dataset builder."""
    report = "report"
    """A written report (Markdown)."""


class PatchStatus(enum.StrEnum):
    """Lifecycle of a patch: ``pending`` → ``approved`` → ``applied``, or ``pending`` → ``rejected``."""

    pending = "pending"
    """Proposed; waiting for a human (or policy) decision."""
    approved = "approved"
    """Accepted; not yet applied to the artifact."""
    rejected = "rejected"
    """Refused; final."""
    applied = "applied"
    """Applied; a new artifact version holds the result. Final."""


class FindingStatus(enum.StrEnum):
    """How far a finding is established."""

    unconfirmed = "unconfirmed"
    """Seen, not yet replicated."""
    confirmed = "confirmed"
    """Replicated across seeds as the decision rule demands."""
    refuted = "refuted"
    """Contradicted by later evidence."""
    not_run = "not_run"
    """Nothing ran for it (no completed run: cut by the budget, never started, or failed to start): no
    claim either way; its statement says why. Stores written before this member hold such findings as
    ``unconfirmed`` with confidence 0 (readers tell them apart by their evidence)."""

    @property
    def label(self) -> str:
        """How a person reads the status: its value with spaces (``not run``, ``confirmed``)."""
        return self.value.replace("_", " ")


class EventLevel(enum.StrEnum):
    """Severity of an event (the ``logging`` levels)."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
