"""Export of a whole study: one serialisable model (JSON) and its Markdown rendering."""

from __future__ import annotations

import re
from datetime import datetime

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

__all__ = ["ExperimentExport", "MetricPointExport", "RunExport", "StudyExport", "render_markdown"]


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


def render_markdown(export: StudyExport) -> str:
    """Render a study export as a Markdown report.

    Sections: question and status, hypotheses (with decision rules), experiments with a table of
    runs and their final/latest metrics, findings, patches, the latest version of each artifact, and
    warnings/errors from the event log.
    """
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

    out += ["## Hypotheses", ""]
    if not export.hypotheses:
        out += ["None registered.", ""]
    for hypothesis in export.hypotheses:
        out += [
            f"### H{hypothesis.id}: {hypothesis.statement}",
            "",
            f"- Registered: {hypothesis.registered_at:%Y-%m-%d %H:%M:%S} UTC",
            f"- Expected outcome: {hypothesis.expected_outcome}",
            f"- Decision rule: {hypothesis.decision_rule}",
            "",
        ]

    out += ["## Experiments", ""]
    if not export.experiments:
        out += ["None.", ""]
    for experiment in export.experiments:
        tests = f" (tests H{experiment.hypothesis_id})" if experiment.hypothesis_id else ""
        out += [f"### E{experiment.id}: {experiment.name}{tests}", ""]
        if experiment.description:
            out += [experiment.description, ""]
        if experiment.runs:
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
        else:
            out += ["No runs.", ""]

    out += ["## Findings", ""]
    if not export.findings:
        out += ["None.", ""]
    for finding in export.findings:
        out += [
            f"- **{finding.status.value}** (confidence {finding.confidence:.2f}): {finding.statement}"
            + (f" — runs {', '.join(map(str, finding.run_ids))}" if finding.run_ids else "")
            + (f"; seeds {', '.join(map(str, finding.seeds))}" if finding.seeds else "")
        ]
        if finding.evidence:
            out += [f"  - Evidence: {finding.evidence}"]
    out += [""]

    out += ["## Patches", ""]
    if export.patches:
        out += _table(
            ["patch", "artifact", "base", "status", "decided by", "rationale"],
            [
                [p.id, p.artifact_name, f"v{p.base_version}", p.status.value, p.decided_by, p.rationale]
                for p in export.patches
            ],
        )
    else:
        out += ["None.", ""]

    latest: dict[str, CodeArtifactPublic] = {}
    for artifact in export.artifacts:
        latest[artifact.name] = artifact
    out += ["## Artifacts", ""]
    if not latest:
        out += ["None.", ""]
    for artifact in latest.values():
        fence = _fence(artifact.content)
        out += [
            f"### {artifact.name} v{artifact.version} ({artifact.kind.value}, sha256 {artifact.sha256[:12]})",
            "",
            f"{fence}{'python' if artifact.name.endswith('.py') else ''}",
            artifact.content.rstrip("\n"),
            fence,
            "",
        ]

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
