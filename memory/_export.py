"""Export of a whole study: one serialisable model (JSON) and its Markdown rendering."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sized
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from memory._models import (
    CodeArtifactPublic,
    EventPublic,
    ExperimentPublic,
    FindingPublic,
    HypothesisPublic,
    PatchPublic,
    RunWithMetrics,
    StudyPublic,
)

__all__ = [
    "ExperimentExport",
    "MetricPointExport",
    "RunExport",
    "StudyExport",
    "render_json",
    "render_markdown",
]


class MetricPointExport(BaseModel):
    """One metric point of an exported run (its run is the enclosing `RunExport`)."""

    step: int
    name: str
    value: float
    recorded_at: datetime


class RunExport(RunWithMetrics):
    """A run with every metric point it logged, ordered by step then insertion.

    ``metric_points`` is what `Store.import_study` restores the per-step curves from; an export written
    before it existed reads with an empty list.
    """

    metric_points: list[MetricPointExport] = Field(default_factory=list)


class ExperimentExport(ExperimentPublic):
    """An experiment with its runs."""

    runs: list[RunExport] = Field(default_factory=list)


class StudyExport(BaseModel):
    """Everything recorded about one study; ``model_dump(mode="json")`` is the JSON export.

    `Store.import_study` is its inverse (ids are assigned anew; see there for what a re-import merges).
    """

    schema_revision: str | None
    """Store schema revision the export was read from."""
    exported_at: datetime
    study: StudyPublic
    hypotheses: list[HypothesisPublic]
    experiments: list[ExperimentExport]
    artifacts: list[CodeArtifactPublic]
    """Every version of every artifact, content included."""
    patches: list[PatchPublic]
    findings: list[FindingPublic]
    events: list[EventPublic]


def _cell(value: object) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return [*lines, ""]


def _metrics(values: dict[str, float] | None) -> str:
    return ", ".join(f"{name}={value:.4g}" for name, value in (values or {}).items())


def _fence(content: str) -> str:
    # A fence longer than any backtick run in the content, so code holding ``` renders intact.
    longest = max((len(run) for run in re.findall(r"`+", content)), default=0)
    return "`" * max(3, longest + 1)


def _finite(value: object) -> object:
    """``value`` with every NaN or infinite float inside it replaced by ``None`` (JSON's ``null``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _finite_json(value: object, **dumps: Any) -> str:
    """``json.dumps`` of ``value`` with NaN and infinities written as ``null``: always valid JSON.

    Python's ``json`` writes ``NaN`` by default, which no strict JSON reader (browsers, ``jq``) accepts.
    ``dumps`` are `json.dumps`'s keyword arguments (``indent``, ``ensure_ascii``).
    """
    return json.dumps(_finite(value), allow_nan=False, **dumps)


def _evidence_text(evidence: str) -> str:
    """A finding's evidence for the report: JSON evidence re-written without NaN, other text as it is."""
    try:
        parsed = json.loads(evidence)
    except ValueError:
        return evidence
    return _finite_json(parsed, ensure_ascii=False) if isinstance(parsed, dict | list) else evidence


INLINE_DATA_LINES = 20
"""A data artifact (``tasks.jsonl``) longer than this is summarised in the Markdown report (line count,
first lines); the JSON export names every data artifact instead of inlining it (`render_json`)."""


def _stored_as(artifact: CodeArtifactPublic) -> str:
    """Where a data artifact's content is and what identifies it: ``tasks.jsonl v1 in the store (327
    lines, 60,932 bytes, sha256 …)``."""
    size = len(artifact.content.encode())
    lines = len(artifact.content.splitlines())
    return (
        f"{artifact.name} v{artifact.version} in the store ({lines:,} lines, {size:,} bytes, "
        f"sha256 {artifact.sha256})"
    )


def _artifact_section(artifact: CodeArtifactPublic, study_id: int) -> list[str]:
    content = artifact.content.rstrip("\n")
    lines = content.splitlines()
    title = f"### {artifact.name} v{artifact.version} ({artifact.kind.value}, sha256 {artifact.sha256[:12]})"
    note: list[str] = []
    if artifact.kind.value == "data" and len(lines) > INLINE_DATA_LINES:
        note = [
            f"The first {INLINE_DATA_LINES} lines below; the whole file is {_stored_as(artifact)}.",
            "",
        ]
        content = "\n".join(lines[:INLINE_DATA_LINES])
    fence = _fence(content)
    language = "python" if artifact.name.endswith(".py") else ""
    return [title, "", *note, f"{fence}{language}", content, fence, ""]


def _heading(title: str, items: Sized, *, empty: str = "None.") -> list[str]:
    """A level-2 heading ``## title``, then ``empty`` as its paragraph when the section has no items."""
    return [f"## {title}", ""] + ([empty, ""] if not items else [])


def _header(export: StudyExport) -> list[str]:
    study = export.study
    out = [f"# Study {study.id}: {study.question}", ""]
    out += [
        f"- Kind: {study.kind}",
        f"- Status: {study.status.value}",
        f"- Created: {study.created_at:%Y-%m-%d %H:%M} UTC",
        f"- Exported: {export.exported_at:%Y-%m-%d %H:%M} UTC (schema {export.schema_revision})",
        "",
    ]
    if study.conclusion:
        out += ["## Conclusion", "", study.conclusion, ""]
    out += _heading("Hypotheses", export.hypotheses, empty="None registered.")
    for hypothesis in export.hypotheses:
        out += [
            f"### H{hypothesis.id}: {hypothesis.statement}",
            "",
            f"- Registered: {hypothesis.registered_at:%Y-%m-%d %H:%M:%S} UTC",
            f"- Expected outcome: {hypothesis.expected_outcome}",
            f"- Decision rule: {hypothesis.decision_rule}",
            "",
        ]
    return out


def _experiments(export: StudyExport) -> list[str]:
    out = _heading("Experiments", export.experiments)
    for experiment in export.experiments:
        tests = f" (tests H{experiment.hypothesis_id})" if experiment.hypothesis_id else ""
        out += [f"### E{experiment.id}: {experiment.name}{tests}", ""]
        if experiment.description:
            out += [experiment.description, ""]
        if not experiment.runs:
            out += ["No runs.", ""]
            continue
        out += _table(
            ["run", "name", "seed", "status", "final metrics", "latest metrics (step)"],
            [
                [
                    run.id,
                    run.name,
                    run.seed,
                    run.status.value,
                    _metrics(run.final_metrics),
                    f"{_metrics(run.latest_metrics)} ({run.latest_step})" if run.latest_metrics else "",
                ]
                for run in experiment.runs
            ],
        )
    return out


def _findings_and_patches(export: StudyExport) -> list[str]:
    out = _heading("Findings", export.findings)
    for finding in export.findings:
        out += [
            f"- **{finding.status.label}** (confidence {finding.confidence:.2f}): {finding.statement}"
            + (f" — runs {', '.join(map(str, finding.run_ids))}" if finding.run_ids else "")
            + (f"; seeds {', '.join(map(str, finding.seeds))}" if finding.seeds else "")
        ]
        if finding.evidence:
            out += [f"  - Evidence: {_evidence_text(finding.evidence)}"]
    out += ["", *_heading("Patches", export.patches)]
    if export.patches:
        out += _table(
            ["patch", "artifact", "base", "status", "decided by", "rationale"],
            [
                [p.id, p.artifact_name, f"v{p.base_version}", p.status.value, p.decided_by, p.rationale]
                for p in export.patches
            ],
        )
    return out


def _readable(value: object) -> object:
    """``value`` for `render_json`: `_finite`, and each string holding JSON (a finding's evidence, an
    event's detail) re-written without NaN the same way, so a strict parse of it succeeds too."""
    if isinstance(value, str):
        return _evidence_text(value) if value[:1] in ("{", "[") else value
    if isinstance(value, dict):
        return {key: _readable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_readable(item) for item in value]
    return _finite(value)


def render_json(export: StudyExport) -> str:
    """A study export as strict JSON for a person or a tool (``a3r export --format json``): no ``NaN``
    or infinity anywhere, also inside strings that hold JSON (non-finite numbers are ``null``); a data
    artifact (``tasks.jsonl``) is named, not inlined: its ``content`` is ``null`` and ``stored_as`` says
    which version of which file it is, its size and sha256 (the store keeps the content;
    `Store.export_study` returns it whole, for `Store.import_study`).

    Returns:
        Indented JSON text ending in a newline, which ``json.loads(text, parse_constant=…)`` raising on
        every constant parses, and so does each string in it that holds JSON.
    """
    data: Any = _readable(export.model_dump(mode="json"))
    for artifact, dumped in zip(export.artifacts, data["artifacts"], strict=True):
        if artifact.kind.value == "data":
            dumped.update(content=None, stored_as=_stored_as(artifact))
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def render_markdown(export: StudyExport) -> str:
    """Render a study export as a Markdown report.

    Sections: question and status, hypotheses (with decision rules), experiments with a table of
    runs and their final/latest metrics, findings (JSON evidence without NaN), patches, the latest
    version of each artifact (a long data file such as ``tasks.jsonl`` summarised: its line count and
    first `INLINE_DATA_LINES` lines), and warnings/errors from the event log.
    """
    out = [*_header(export), *_experiments(export), *_findings_and_patches(export)]
    latest = {artifact.name: artifact for artifact in export.artifacts}  # the last version of each name
    out += _heading("Artifacts", latest)
    for artifact in latest.values():
        out += _artifact_section(artifact, export.study.id)
    notable = [event for event in export.events if event.level.value in ("warning", "error")]
    if notable:
        out += ["## Warnings and errors", ""]
        out += [
            f"- {event.created_at:%Y-%m-%d %H:%M:%S} {event.level.value}"
            + (f" (run {event.run_id})" if event.run_id else "")
            + f": {event.message}"
            for event in notable
        ]
        out += [""]
    return "\n".join(out).rstrip("\n") + "\n"
