"""Knowledge store of A3R: studies, pre-registered hypotheses, experiments, runs and their metrics,
versioned code artifacts, patches with their approval trail, findings and events.

A SQLite file by default (``.a3r/memory.db``, WAL journal, foreign keys on), or any SQLAlchemy URL
(PostgreSQL for teams). The schema is migrated with Alembic when a store is opened, so a store made by
an older version upgrades in place. Secrets (API keys, bearer tokens, passwords) are redacted before
anything is written.

Example:
    >>> from memory import Store
    >>> with Store("/tmp/example.db") as store:  # doctest: +SKIP
    ...     study = store.create_study("Does a KL penalty prevent collapse on countdown?")
    ...     h = store.register_hypothesis(
    ...         study.id,
    ...         statement="KL 0.05 keeps held-out accuracy within 2 points",
    ...         expected_outcome="no drop below baseline - 2",
    ...         decision_rule="3 of 3 seeds",
    ...     )
    ...     exp = store.create_experiment(study.id, "kl-0.05", hypothesis_id=h.id)
    ...     run = store.start_run(exp.id, seed=0, config={"kl_coef": 0.05})
    ...     store.log_metrics(run.id, step=1, metrics={"reward/mean": 0.4})
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memory._db import DEFAULT_PATH
    from memory._errors import (
        IntegrityViolation,
        InvalidInput,
        InvalidTransition,
        NotFound,
        PreregistrationError,
        SchemaVersionError,
        StoreConfigError,
        StoreError,
        StoreUnavailable,
    )
    from memory._export import (
        ExperimentExport,
        MetricPointExport,
        RunExport,
        StudyExport,
        render_json,
        render_markdown,
    )
    from memory._models import (
        ArtifactKind,
        CodeArtifactPublic,
        EventLevel,
        EventPublic,
        ExperimentPublic,
        FindingPublic,
        FindingStatus,
        FindingUpdate,
        HypothesisPublic,
        MetricPointPublic,
        PatchPublic,
        PatchStatus,
        RunPublic,
        RunStatus,
        RunUpdate,
        RunWithMetrics,
        StudyPublic,
        StudyStatus,
        StudyUpdate,
    )
    from memory._secrets import REDACTED, scrub, scrub_text
    from memory._store import Store, StoreConfig
    from memory._vocabulary import NOT_METRICS

_SOURCES: dict[str, str] = {
    "ArtifactKind": "memory._vocabulary",
    "CodeArtifactPublic": "memory._models",
    "DEFAULT_PATH": "memory._vocabulary",
    "NOT_METRICS": "memory._vocabulary",
    "EventLevel": "memory._vocabulary",
    "EventPublic": "memory._models",
    "ExperimentExport": "memory._export",
    "ExperimentPublic": "memory._models",
    "FindingPublic": "memory._models",
    "FindingStatus": "memory._vocabulary",
    "FindingUpdate": "memory._models",
    "HypothesisPublic": "memory._models",
    "IntegrityViolation": "memory._errors",
    "InvalidInput": "memory._errors",
    "InvalidTransition": "memory._errors",
    "MetricPointExport": "memory._export",
    "MetricPointPublic": "memory._models",
    "NotFound": "memory._errors",
    "PatchPublic": "memory._models",
    "PatchStatus": "memory._vocabulary",
    "PreregistrationError": "memory._errors",
    "REDACTED": "memory._secrets",
    "RunExport": "memory._export",
    "RunPublic": "memory._models",
    "RunStatus": "memory._vocabulary",
    "RunUpdate": "memory._models",
    "RunWithMetrics": "memory._models",
    "SchemaVersionError": "memory._errors",
    "Store": "memory._store",
    "StoreConfig": "memory._store",
    "StoreConfigError": "memory._errors",
    "StoreError": "memory._errors",
    "StoreUnavailable": "memory._errors",
    "StudyExport": "memory._export",
    "StudyPublic": "memory._models",
    "StudyStatus": "memory._vocabulary",
    "StudyUpdate": "memory._models",
    "render_json": "memory._export",
    "render_markdown": "memory._export",
    "scrub": "memory._secrets",
    "scrub_text": "memory._secrets",
}
"""Where each public name is defined: imported on first use (PEP 562), so ``import memory`` is cheap and
command lines that never open a store (``a3r --help``) do not load SQLAlchemy and Alembic."""

__all__ = [
    "DEFAULT_PATH",
    "NOT_METRICS",
    "REDACTED",
    "ArtifactKind",
    "CodeArtifactPublic",
    "EventLevel",
    "EventPublic",
    "ExperimentExport",
    "ExperimentPublic",
    "FindingPublic",
    "FindingStatus",
    "FindingUpdate",
    "HypothesisPublic",
    "IntegrityViolation",
    "InvalidInput",
    "InvalidTransition",
    "MetricPointExport",
    "MetricPointPublic",
    "NotFound",
    "PatchPublic",
    "PatchStatus",
    "PreregistrationError",
    "RunExport",
    "RunPublic",
    "RunStatus",
    "RunUpdate",
    "RunWithMetrics",
    "SchemaVersionError",
    "Store",
    "StoreConfig",
    "StoreConfigError",
    "StoreError",
    "StoreUnavailable",
    "StudyExport",
    "StudyPublic",
    "StudyStatus",
    "StudyUpdate",
    "render_json",
    "render_markdown",
    "scrub",
    "scrub_text",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access and cache the name in this package."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
