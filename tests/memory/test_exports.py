"""The public names of `memory` (a change here is an API change: update dependants)."""

from __future__ import annotations

import subprocess
import sys

import memory


def test_exported_members() -> None:
    assert sorted(memory.__all__) == sorted(
        [
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
    )
    for name in memory.__all__:
        assert getattr(memory, name) is not None
        if isinstance(getattr(memory, name), type):
            assert getattr(memory, name).__module__.startswith("memory")


def test_error_tree() -> None:
    for error in (
        memory.NotFound,
        memory.InvalidTransition,
        memory.InvalidInput,
        memory.IntegrityViolation,
        memory.StoreConfigError,
        memory.SchemaVersionError,
        memory.StoreUnavailable,
    ):
        assert issubclass(error, memory.StoreError)
    assert issubclass(memory.NotFound, LookupError)
    assert issubclass(memory.PreregistrationError, memory.InvalidTransition)
    for error in (
        memory.InvalidTransition,
        memory.InvalidInput,
        memory.IntegrityViolation,
        memory.StoreConfigError,
    ):
        assert issubclass(error, ValueError)
    assert issubclass(memory.StoreUnavailable, ConnectionError)


def test_memory_imports_neither_a3r_nor_swarm() -> None:
    code = "import sys, memory; print(sorted(m for m in sys.modules if m.split('.')[0] in ('a3r', 'swarm')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_store_config_builds_the_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = memory.StoreConfig(location=str(tmp_path / "x.db"), busy_timeout_s=5)
    with config.open() as store:
        assert store.create_study("q").id == 1
    assert memory.StoreConfig.model_validate_json(config.model_dump_json()) == config
