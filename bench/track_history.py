"""The tracked benchmarks' history in the knowledge store, and the regression rule over it.

Layout in the store (``memory``): one study of kind ``"track"``; one experiment per benchmark (named
after it); one run per (commit, seed, invocation) with ``git_commit`` set, ``seed`` set and ``config``
holding the provenance (dirty flag, machine, package versions), the backend, the mode (``quick`` /
``full``) and the benchmark's settings; per-step metrics via ``log_metrics`` and the final numbers via
``finish_run``. A team's PostgreSQL store (any SQLAlchemy URL) holds everyone's history the same way.

A history travels as the study's JSON export (`export_history`, ``memory.Store.export_study``) and is
loaded with `import_history` (``memory.Store.import_study``: idempotent, a newer export of the same
study adds its new runs). ``bench/history/track.json`` is the committed one. A store may then hold
several tracking studies (one imported, one recorded locally); `load_history` reads them all.

Regression rule (:func:`judge`): the candidate is the median of the new runs' values of a benchmark's
primary metric; the baseline is the mean ``μ`` and sample standard deviation ``σ`` of that metric over
the runs of *earlier* commits (same mode, benchmark sizes and machine, at least ``min_history`` runs;
the sizes are the benchmark's own settings, :func:`benchmark_settings`). The candidate
regresses when it lies beyond ``μ ∓ k·σ`` in the bad direction *and* differs from ``μ`` by at least
``min_relative·|μ|`` (so a deterministic metric with ``σ = 0`` does not flag float noise, and a noisy
timing needs a real effect). An improvement is the same test in the good direction.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memory import InvalidInput, RunStatus, RunWithMetrics, Store, StudyExport

__all__ = [
    "STUDY_KIND",
    "STUDY_QUESTION",
    "VERDICT_COLUMNS",
    "History",
    "HistoryFileError",
    "Status",
    "TrackRun",
    "Verdict",
    "benchmark_settings",
    "export_history",
    "import_history",
    "judge",
    "load_history",
    "read_history",
    "record_run",
    "track_study",
    "verdict_cells",
]

STUDY_KIND = "track"
STUDY_QUESTION = "Do the tracked benchmarks (bench/track.py) hold from one git commit to the next?"


class Status(enum.StrEnum):
    """Outcome of the regression rule for one benchmark."""

    ok = "ok"
    regression = "regression"
    improvement = "improvement"
    no_history = "no comparable history"
    """Fewer than ``min_history`` earlier runs of the same mode, sizes and machine (the chart may show
    runs of other modes or sizes: those are not compared)."""
    not_comparable = "not comparable (load)"
    """Beyond the band, but the candidate ran at a machine load `LOAD_RATIO` times unlike its history's:
    for a timing metric that says more about the machine than the code."""


LOAD_RATIO = 2.0
"""Candidate and history whose mean load per core (1-minute load average / cores, recorded with each
run) differ by more than this factor are not compared on a timing metric."""


@dataclass(frozen=True)
class Verdict:
    """The regression rule's result for one benchmark.

    Attributes:
        benchmark: Benchmark name.
        metric: Primary metric judged.
        higher_is_better: Direction of the metric.
        candidate: Median of the new runs' values.
        new: The new runs' values.
        baseline_mean: Mean over the earlier commits' runs (``nan`` without history).
        baseline_std: Sample standard deviation of the same (0 for one run).
        history_runs: Number of earlier runs in the band.
        history_commits: Distinct earlier commits in the band.
        relative_change: ``(candidate − mean) / |mean|`` (signed; ``nan`` without history).
        status: The outcome.
        commit: The candidate commit (the one judged; ``""`` when not known).
        mode: The suite mode of the runs judged (``quick``, ``full``; ``""`` when not known): verdicts
            compare within a mode, so a commit run in both modes has one verdict per mode.
        note: Why the verdict is not a comparison (`Status.no_history`: how many earlier runs there
            were and how many a band needs; `Status.not_comparable`: the two loads), else ``""``.
    """

    benchmark: str
    metric: str
    higher_is_better: bool
    candidate: float
    new: tuple[float, ...]
    baseline_mean: float
    baseline_std: float
    history_runs: int
    history_commits: int
    relative_change: float
    status: Status
    commit: str = ""
    mode: str = ""
    note: str = ""


VERDICT_COLUMNS = (
    "benchmark", "commit", "mode", "metric", "better", "new (median)", "seeds", "earlier μ ± σ", "runs / commits", "change", "verdict",
)  # fmt: skip
"""Column names of a verdict row (:func:`verdict_cells`), in the terminal and on the dashboard."""


def verdict_cells(v: Verdict) -> tuple[str, ...]:
    """The verdict as the text of the `VERDICT_COLUMNS` cells."""
    judged = v.status is not Status.no_history
    return (
        v.benchmark,
        v.commit[:10] or "?",
        v.mode or "?",
        v.metric,
        "higher" if v.higher_is_better else "lower",
        f"{v.candidate:.4g}",
        str(len(v.new)),
        f"{v.baseline_mean:.4g} ± {v.baseline_std:.2g}" if judged else "—",
        f"{v.history_runs} / {v.history_commits}",
        f"{v.relative_change:+.1%}" if judged else "—",
        v.status.value,
    )


def judge(
    benchmark: str,
    metric: str,
    new: Sequence[float],
    history: Sequence[float],
    *,
    higher_is_better: bool,
    k: float = 3.0,
    min_relative: float = 0.05,
    min_history: int = 3,
    history_commits: int = 0,
    commit: str = "",
) -> Verdict:
    """Apply the regression rule (module docstring) to one benchmark's primary metric.

    Args:
        benchmark: Benchmark name (reported back).
        metric: Metric name (reported back).
        new: Values of the new runs (one per seed), at least one.
        history: Values of the earlier commits' runs.
        higher_is_better: Direction of the metric.
        k: Width of the band in standard deviations.
        min_relative: Smallest relative change from the baseline mean that counts, e.g. 0.05 = 5 %.
        min_history: Fewest earlier runs that make a band; fewer gives `Status.no_history`.
        history_commits: Distinct commits behind ``history`` (reported back).
        commit: The candidate commit (reported back).

    Raises:
        ValueError: ``new`` is empty, or ``k``, ``min_relative`` or ``min_history`` is negative.
    """
    if not new:
        raise ValueError("judge needs at least one new value")
    if k < 0 or min_relative < 0 or min_history < 1:
        raise ValueError("k and min_relative must be >= 0 and min_history >= 1")
    candidate = statistics.median(new)
    if len(history) < min_history:
        earlier = f"{len(history)} earlier run{'' if len(history) == 1 else 's'}"
        note = f"{earlier} of the same mode, sizes and machine; a band needs {min_history} (--min-history)"
        return Verdict(
            benchmark, metric, higher_is_better, candidate, tuple(new), float("nan"), float("nan"),
            len(history), history_commits, float("nan"), Status.no_history, commit, note=note,
        )  # fmt: skip
    mean = statistics.fmean(history)
    std = statistics.stdev(history) if len(history) > 1 else 0.0
    delta = candidate - mean
    relative = delta / abs(mean) if mean else (0.0 if delta == 0 else float("inf") * (1 if delta > 0 else -1))
    beyond_band = abs(delta) > k * std and abs(delta) >= min_relative * abs(mean) and delta != 0
    good = (delta > 0) == higher_is_better
    status = Status.ok if not beyond_band else (Status.improvement if good else Status.regression)
    return Verdict(
        benchmark, metric, higher_is_better, candidate, tuple(new), mean, std, len(history),
        history_commits, relative, status, commit,
    )  # fmt: skip


def track_study(store: Store) -> int:
    """Id of the store's tracking study (kind ``"track"``), created on first use."""
    for study in store.studies():
        if study.kind == STUDY_KIND:
            return study.id
    return store.create_study(STUDY_QUESTION, kind=STUDY_KIND).id


class HistoryFileError(Exception):
    """A history file that cannot be read, is not a study export, or not a tracking study's."""


def read_history(path: Path) -> StudyExport:
    """Read and check a tracking history exported by `export_history`, without touching any store.

    Raises:
        HistoryFileError: Unreadable file, not a study export, or a study of another kind.
    """
    try:
        export = StudyExport.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise HistoryFileError(f"{path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        more = exc.error_count() - 1
        raise HistoryFileError(
            f"{path}: not a study export: {where}: {first['msg']}"
            + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")
        ) from None
    if export.study.kind != STUDY_KIND:
        raise HistoryFileError(f"{path}: a study of kind {export.study.kind!r}, not a tracking history")
    return export


def import_history(store: Store, path: Path, export: StudyExport | None = None) -> int:
    """Load a tracking history exported by `export_history` into ``store`` (idempotent).

    Args:
        store: The store to load it into.
        path: The history file (named in errors).
        export: ``path`` as `read_history` already read it; read here when ``None``.

    Returns:
        The id of the tracking study holding it in ``store``.

    Raises:
        HistoryFileError: Unreadable file, not a study export, a study of another kind, or one the
            store refuses.
    """
    if export is None:
        export = read_history(path)
    try:
        return store.import_study(export)
    except InvalidInput as exc:
        raise HistoryFileError(f"{path}: {exc}") from None


def export_history(store: Store, study_id: int, path: Path) -> Path:
    """Write the tracking study ``study_id`` as JSON (keys sorted, one-space indent) to ``path``.

    The file holds the runs' provenance as recorded (commit, dirty flag, CPU model and core count,
    package versions, the 1-minute load average), never a path of the machine. ``exported_at`` is the
    newest record's time, so exporting an unchanged history writes the same bytes.
    """
    export = store.export_study(study_id)
    # The export time is that of the newest record, not the wall clock: re-exporting an unchanged
    # history writes the same bytes (a committed history file stays clean in git).
    stamps = [export.study.created_at, *(r.started_at for e in export.experiments for r in e.runs)]
    stamps += [r.finished_at for e in export.experiments for r in e.runs if r.finished_at is not None]
    data = export.model_copy(update={"exported_at": max(stamps)}).model_dump(mode="json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _experiment(store: Store, study_id: int, benchmark: str, description: str) -> int:
    for experiment in store.experiments(study_id):
        if experiment.name == benchmark:
            return experiment.id
    return store.create_experiment(study_id, benchmark, description=description).id


def record_run(
    store: Store,
    *,
    benchmark: str,
    description: str,
    seed: int,
    git_commit: str | None,
    config: Mapping[str, Any],
    steps: Sequence[Mapping[str, float]],
    final: Mapping[str, float] | None,
    error: str | None = None,
    study_id: int | None = None,
) -> int:
    """Record one benchmark run: started, its per-step metrics (step 1, 2, …), then finished or failed.

    Args:
        store: The knowledge store.
        benchmark: Benchmark name (its experiment).
        description: What the benchmark measures (the experiment's description when created).
        seed: The run's seed.
        git_commit: Commit of the measured code.
        config: Provenance, mode, backend and settings (JSON-serialisable).
        steps: Metrics of each step, in order.
        final: Final numbers; ``None`` with ``error`` records a failed run.
        error: Why the benchmark failed.
        study_id: The tracking study to record into (default `track_study`).

    Returns:
        The run id.
    """
    study = track_study(store) if study_id is None else study_id
    experiment = _experiment(store, study, benchmark, description)
    short = (git_commit or "unknown")[:12]
    run = store.start_run(
        experiment, name=f"{short}-s{seed}", config=dict(config), seed=seed, git_commit=git_commit
    )
    for number, metrics in enumerate(steps, start=1):
        store.log_metrics(run.id, number, metrics)
    if error is not None or final is None:
        store.finish_run(run.id, status=RunStatus.failed, error=error or "no final metrics")
    else:
        store.finish_run(run.id, final_metrics=final)
    return run.id


SHARED_SETTINGS = ("threads",)
"""Suite settings that every benchmark's sizes include (the process's torch threads)."""


def benchmark_settings(benchmark: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a run's suite settings that sizes ``benchmark``: the fields named
    ``<benchmark>_…`` (``update_seqs``, ``spy_games``) and the shared ones (`SHARED_SETTINGS`).

    Runs are compared on this part only, so changing one benchmark's sizes (or adding a benchmark and
    its fields to the suite) leaves the other benchmarks' histories comparable.
    """
    prefix = f"{benchmark}_"
    return {k: v for k, v in settings.items() if k.startswith(prefix) or k in SHARED_SETTINGS}


@dataclass(frozen=True)
class TrackRun:
    """One finished tracked run as read back from the store."""

    run: RunWithMetrics
    benchmark: str

    @property
    def commit(self) -> str:
        return self.run.git_commit or "unknown"

    @property
    def mode(self) -> str:
        return str(self.run.config.get("mode", ""))

    @property
    def settings(self) -> str:
        """The sizes of this run's own benchmark, as canonical JSON (runs compare only with equal sizes).

        See `benchmark_settings`: a change of another benchmark's sizes (or a benchmark added to the
        suite) leaves this run comparable."""
        return json.dumps(
            benchmark_settings(self.benchmark, self.run.config.get("settings", {})), sort_keys=True
        )

    @property
    def machine(self) -> str:
        machine = self.run.config.get("provenance", {}).get("machine", {})
        return f"{machine.get('cpu', '?')} ×{machine.get('cores', '?')}"

    def value(self, metric: str) -> float | None:
        return (self.run.final_metrics or {}).get(metric)

    @property
    def load(self) -> float | None:
        """The machine's 1-minute load average per core when the run started (``None`` if not recorded)."""
        load = self.run.config.get("load_avg_1m")
        cores = self.run.config.get("provenance", {}).get("machine", {}).get("cores") or 1
        return float(load) / float(cores) if isinstance(load, int | float) else None


def _load_mismatch(new: Sequence[TrackRun], earlier: Sequence[TrackRun]) -> str:
    """How the mean loads per core of ``new`` and of ``earlier`` differ when they differ by more than
    `LOAD_RATIO` (e.g. ``load per core 3.2 vs 0.2 earlier``), else ``""``."""
    loads = [[x for r in runs if (x := r.load) is not None] for runs in (new, earlier)]
    if not all(loads):
        return ""
    a, b = (max(statistics.fmean(x), 0.05) for x in loads)  # an idle machine: 0.05 per core, not 0
    if max(a, b) / min(a, b) <= LOAD_RATIO:
        return ""
    return f"load per core {a:.2g} vs {b:.2g} earlier (more than {LOAD_RATIO:g}x apart)"


@dataclass
class History:
    """Finished runs of the tracking study, by benchmark, oldest first."""

    runs: dict[str, list[TrackRun]] = field(default_factory=dict)

    def select(
        self, benchmark: str, *, mode: str | None = None, machine: str | None = None
    ) -> list[TrackRun]:
        """Runs of ``benchmark``, optionally only of one mode and machine."""
        return [
            r
            for r in self.runs.get(benchmark, [])
            if (mode is None or r.mode == mode) and (machine is None or r.machine == machine)
        ]

    def commits(self) -> list[str]:
        """Commits in the order of their first run."""
        seen: dict[str, None] = {}
        for run in sorted((r for runs in self.runs.values() for r in runs), key=lambda r: r.run.started_at):
            seen.setdefault(run.commit, None)
        return list(seen)

    def verdict(
        self,
        benchmark: str,
        metric: str,
        new_run_ids: Sequence[int],
        *,
        higher_is_better: bool,
        k: float,
        min_relative: float,
        min_history: int = 3,
        load_sensitive: bool = False,
    ) -> Verdict:
        """The rule for the runs ``new_run_ids`` against earlier commits' runs of the same mode, sizes
        (the benchmark's own part of ``config["settings"]``, `benchmark_settings`) and machine.

        For a ``load_sensitive`` (timing) metric, a change beyond the band is `Status.not_comparable`
        when the candidate's machine load differs from its history's by more than `LOAD_RATIO`.

        Raises:
            ValueError: None of ``new_run_ids`` is a finished run of ``benchmark`` with ``metric``.
        """
        everything = self.runs.get(benchmark, [])
        new_runs = [r for r in everything if r.run.id in set(new_run_ids) and r.value(metric) is not None]
        if not new_runs:
            raise ValueError(f"no finished run of {benchmark} with {metric} among {list(new_run_ids)}")
        first = min(r.run.started_at for r in new_runs)
        like = new_runs[0]
        earlier = [
            r
            for r in self.select(benchmark, mode=like.mode, machine=like.machine)
            if r.commit != like.commit
            and r.settings == like.settings
            and r.run.started_at < first
            and r.value(metric) is not None
        ]
        verdict = judge(
            benchmark,
            metric,
            [v for r in new_runs if (v := r.value(metric)) is not None],
            [v for r in earlier if (v := r.value(metric)) is not None],
            higher_is_better=higher_is_better,
            k=k,
            min_relative=min_relative,
            min_history=min_history,
            history_commits=len({r.commit for r in earlier}),
            commit=like.commit,
        )
        verdict = dataclasses.replace(verdict, mode=like.mode)
        beyond = verdict.status in (Status.improvement, Status.regression)
        if load_sensitive and beyond and (loads := _load_mismatch(new_runs, earlier)):
            return dataclasses.replace(verdict, status=Status.not_comparable, note=loads)
        return verdict


def load_history(store: Store) -> History:
    """Every finished run of the store's tracking studies, oldest first (empty when there is none)."""
    runs: list[TrackRun] = []
    for study in store.studies():
        if study.kind != STUDY_KIND:
            continue
        names = {e.id: e.name for e in store.experiments(study.id)}
        runs += [
            TrackRun(run, names[run.experiment_id]) for run in store.runs(study.id, status=RunStatus.finished)
        ]
    history = History()
    for run in sorted(runs, key=lambda r: r.run.started_at):
        history.runs.setdefault(run.benchmark, []).append(run)
    return history
