"""The store API: typed create/update/query methods over the knowledge-store tables.

`Store` opens (and migrates) a database and hands out `*Public` models, detached from any session.
Every method runs in its own transaction. Writes that read before they write (artifact versions,
patch decisions, finding seeds, run completion) are safe with several processes writing at once: on
SQLite write transactions start with ``BEGIN IMMEDIATE``; on PostgreSQL the row read is locked with
``SELECT ... FOR UPDATE`` and status changes are compare-and-set ``UPDATE ... WHERE status = ...``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, overload

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import func, update
from sqlmodel import Session, SQLModel, col, select
from sqlmodel.sql.expression import SelectOfScalar

from memory._db import Engines, current_revision, make_engines, resolve_url, translate_errors, upgrade
from memory._errors import InvalidInput, InvalidTransition, NotFound, PreregistrationError
from memory._export import ExperimentExport, MetricPointExport, RunExport, StudyExport
from memory._models import (
    ArtifactKind,
    CodeArtifact,
    CodeArtifactPublic,
    Event,
    EventLevel,
    EventPublic,
    Experiment,
    ExperimentCreate,
    ExperimentPublic,
    Finding,
    FindingCreate,
    FindingEvidence,
    FindingPublic,
    FindingStatus,
    FindingUpdate,
    Hypothesis,
    HypothesisCreate,
    HypothesisPublic,
    MetricPoint,
    MetricPointPublic,
    Patch,
    PatchPublic,
    PatchStatus,
    Run,
    RunCreate,
    RunPublic,
    RunStatus,
    RunUpdate,
    RunWithMetrics,
    Study,
    StudyCreate,
    StudyPublic,
    StudyUpdate,
    utcnow,
)
from memory._secrets import scrub_text
from memory._vocabulary import NOT_METRICS

__all__ = ["Store", "StoreConfig"]

_M = TypeVar("_M", bound=BaseModel)
_T = TypeVar("_T")
_S = TypeVar("_S", bound=SQLModel)
# The rows an import writes and looks up by natural key (each has an autoincrement ``id``).
_Row = Hypothesis | Experiment | Run | Finding | CodeArtifact


class StoreConfig(BaseModel):
    """Where the store lives and how to open it; `open` builds the `Store`.

    Attributes:
        location: Path of a SQLite file or any SQLAlchemy URL; ``None`` means ``.a3r/memory.db``.
        busy_timeout_s: Seconds a SQLite writer waits for another writer's lock.
        create: Create a missing SQLite file (``False``: raise `NotFound`).
        echo: Log SQL statements.
    """

    model_config = ConfigDict(frozen=True)

    location: str | None = None
    busy_timeout_s: float = 30.0
    create: bool = True
    echo: bool = False

    def open(self) -> Store:
        """Open (creating and migrating as needed) the configured store."""
        return Store(self.location, busy_timeout_s=self.busy_timeout_s, create=self.create, echo=self.echo)


def _validated(model: type[_M], **data: Any) -> _M:
    """Validate input through a data model; errors name fields and rules, never values."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or model.__name__}: {error['msg']}"
            for error in exc.errors(include_input=False, include_url=False)
        )
        raise InvalidInput(f"invalid {model.__name__}: {problems}") from None


def _sha256(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


class Store:
    """Typed access to the knowledge store (studies, hypotheses, runs, artifacts, patches, findings).

    Opening a store creates the database if needed and upgrades its schema to the newest revision.
    Use it as a context manager, or call `close`.

    Args:
        location: Path of a SQLite file, any SQLAlchemy URL (e.g. ``postgresql+psycopg://...``), or
            ``None`` for ``.a3r/memory.db`` in the working directory.
        busy_timeout_s: Seconds a SQLite writer waits for another writer's lock.
        create: Create a missing SQLite file; when ``False`` a missing file raises `NotFound`.
        migrate: Upgrade the schema to the newest revision on open.
        echo: Log SQL statements.

    Raises:
        StoreConfigError: The location is malformed or its driver is missing.
        NotFound: ``create`` is ``False`` and the SQLite file is missing.
        SchemaVersionError: The database was written by a newer version of this package.
        StoreUnavailable: The database cannot be reached.

    Example:
        >>> with Store("/tmp/demo.db") as store:  # doctest: +SKIP
        ...     study = store.create_study("Does a KL penalty prevent collapse?")
    """

    def __init__(
        self,
        location: str | Path | None = None,
        *,
        busy_timeout_s: float = 30.0,
        create: bool = True,
        migrate: bool = True,
        echo: bool = False,
    ) -> None:
        url = resolve_url(location, create=create)
        self._url = url
        self._engines: Engines = make_engines(url, busy_timeout_s=busy_timeout_s, echo=echo)
        if migrate:
            try:
                upgrade(self._engines)
            except BaseException:
                self._engines.read.dispose()
                raise

    @classmethod
    def open(cls, location: str | Path | None = None, **options: Any) -> Store:
        """Open a store from a path or URL; same arguments as the constructor."""
        return cls(location, **options)

    # ------------------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        """The store URL with any password masked (safe to print)."""
        return self._url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        """Database backend name, ``"sqlite"`` or ``"postgresql"``."""
        return self._url.get_backend_name()

    @property
    def schema_revision(self) -> str | None:
        """Alembic revision of the database schema."""
        with translate_errors():
            return current_revision(self._engines.read)

    def close(self) -> None:
        """Close all pooled connections."""
        self._engines.read.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @contextlib.contextmanager
    def _read(self) -> Iterator[Session]:
        with translate_errors(), Session(self._engines.read) as session:
            yield session

    @contextlib.contextmanager
    def _write(self) -> Iterator[Session]:
        """Session of one write transaction; the caller commits. Leaving early rolls back."""
        with translate_errors(), Session(self._engines.write) as session:
            yield session

    @staticmethod
    def _get(session: Session, table: type[_T], key: int, *, lock: bool = False) -> _T:
        """Row by primary key, or `NotFound`; ``lock`` takes a row lock (PostgreSQL) for the transaction."""
        row = session.get(table, key, with_for_update=lock)
        if row is None:
            raise NotFound(table.__name__.lower(), key)
        return row

    def _read_one(self, table: type[SQLModel], public: type[_M], key: int) -> _M:
        """The public view of one row, by primary key, in a read session (`NotFound` if there is none)."""
        with self._read() as session:
            return public.model_validate(self._get(session, table, key))

    def _read_all(self, public: type[_M], query: SelectOfScalar[Any]) -> list[_M]:
        """The public views of the rows ``query`` selects, in its order, in a read session."""
        with self._read() as session:
            return [public.model_validate(row) for row in session.exec(query).all()]

    def _update_row(
        self, table: type[SQLModel], public: type[_M], key: int, changes: BaseModel, **stamps: Any
    ) -> _M:
        """Set the fields of ``changes`` that were set (validated again), plus ``stamps``, on one row under
        a row lock, commit, and return its public view (`NotFound` if there is no such row)."""
        data = _validated(type(changes), **changes.model_dump(exclude_unset=True))
        with self._write() as session:
            row = self._get(session, table, key, lock=True)
            row.sqlmodel_update({**data.model_dump(exclude_unset=True), **stamps})
            return _committed(session, row, public)

    # -------------------------------------------------------------------------------- studies
    def create_study(self, question: str, *, kind: str = "research") -> StudyPublic:
        """Register a study (a research question).

        Raises:
            InvalidInput: Empty question, or kind longer than 32 characters.
        """
        data = _validated(StudyCreate, question=question, kind=kind)
        with self._write() as session:
            study = Study.model_validate(data)
            return _committed(session, study, StudyPublic)

    def get_study(self, study_id: int) -> StudyPublic:
        """The study with this id (raises `NotFound` if there is none)."""
        return self._read_one(Study, StudyPublic, study_id)

    def studies(self) -> list[StudyPublic]:
        """All studies, oldest first."""
        return self._read_all(StudyPublic, select(Study).order_by(col(Study.id)))

    def update_study(self, study_id: int, changes: StudyUpdate) -> StudyPublic:
        """Change the fields set in ``changes`` (e.g. ``StudyUpdate(status="concluded", conclusion=...)``).

        Raises:
            NotFound: No such study.
        """
        return self._update_row(Study, StudyPublic, study_id, changes, updated_at=utcnow())

    # ----------------------------------------------------------------------------- hypotheses
    def register_hypothesis(
        self,
        study_id: int,
        *,
        statement: str,
        expected_outcome: str,
        decision_rule: str,
        experiment_id: int | None = None,
    ) -> HypothesisPublic:
        """Pre-register a hypothesis, optionally as the one an experiment tests.

        The registration time is recorded. An experiment's hypothesis must be registered before its
        first run, so a decision rule is never written after seeing results.

        Args:
            study_id: Study the hypothesis belongs to.
            statement: The claim.
            expected_outcome: What the runs should show if the claim holds.
            decision_rule: How results decide, fixed in advance.
            experiment_id: Experiment (of the same study) that tests it.

        Raises:
            NotFound: No such study or experiment.
            InvalidInput: An empty field, or the experiment belongs to another study.
            PreregistrationError: The experiment already has runs.
        """
        data = _validated(
            HypothesisCreate,
            statement=statement,
            expected_outcome=expected_outcome,
            decision_rule=decision_rule,
        )
        with self._write() as session:
            self._get(session, Study, study_id)
            hypothesis = Hypothesis.model_validate(data, update={"study_id": study_id})
            session.add(hypothesis)
            session.flush()
            if experiment_id is not None:
                assert hypothesis.id is not None
                self._attach_hypothesis(session, experiment_id, hypothesis.id, study_id)
            session.commit()
            session.refresh(hypothesis)
            return HypothesisPublic.model_validate(hypothesis)

    def hypotheses(self, study_id: int) -> list[HypothesisPublic]:
        """Hypotheses of a study in registration order."""
        query = select(Hypothesis).where(Hypothesis.study_id == study_id)
        return self._read_all(HypothesisPublic, query.order_by(col(Hypothesis.id)))

    def _attach_hypothesis(
        self, session: Session, experiment_id: int, hypothesis_id: int, study_id: int
    ) -> None:
        experiment = self._get(session, Experiment, experiment_id, lock=True)
        if experiment.study_id != study_id:
            raise InvalidInput(
                f"experiment {experiment_id} belongs to study {experiment.study_id}, not study {study_id}"
            )
        first_run = session.exec(select(Run.id).where(Run.experiment_id == experiment_id).limit(1)).first()
        if first_run is not None:
            raise PreregistrationError(
                "experiment",
                experiment_id,
                "started",
                "tested by a new hypothesis",
                f"run {first_run} already started; register hypotheses before the runs that test them",
            )
        experiment.hypothesis_id = hypothesis_id
        session.add(experiment)

    # ---------------------------------------------------------------------------- experiments
    def create_experiment(
        self,
        study_id: int,
        name: str,
        *,
        description: str = "",
        template: str | None = None,
        hypothesis_id: int | None = None,
    ) -> ExperimentPublic:
        """Create an experiment of a study, optionally testing a registered hypothesis.

        Raises:
            NotFound: No such study or hypothesis.
            InvalidInput: Empty name, or the hypothesis belongs to another study.
        """
        data = _validated(ExperimentCreate, name=name, description=description, template=template)
        with self._write() as session:
            self._get(session, Study, study_id)
            if hypothesis_id is not None:
                hypothesis = self._get(session, Hypothesis, hypothesis_id)
                if hypothesis.study_id != study_id:
                    raise InvalidInput(f"hypothesis {hypothesis_id} belongs to study {hypothesis.study_id}")
            experiment = Experiment.model_validate(
                data, update={"study_id": study_id, "hypothesis_id": hypothesis_id}
            )
            return _committed(session, experiment, ExperimentPublic)

    def set_experiment_hypothesis(self, experiment_id: int, hypothesis_id: int) -> ExperimentPublic:
        """Make an existing experiment test a registered hypothesis (only before its first run).

        Raises:
            NotFound: No such experiment or hypothesis.
            PreregistrationError: The experiment already has runs.
        """
        with self._write() as session:
            hypothesis = self._get(session, Hypothesis, hypothesis_id)
            self._attach_hypothesis(session, experiment_id, hypothesis_id, hypothesis.study_id)
            session.commit()
            return ExperimentPublic.model_validate(self._get(session, Experiment, experiment_id))

    def experiments(self, study_id: int) -> list[ExperimentPublic]:
        """Experiments of a study in creation order."""
        query = select(Experiment).where(Experiment.study_id == study_id)
        return self._read_all(ExperimentPublic, query.order_by(col(Experiment.id)))

    # ----------------------------------------------------------------------------------- runs
    def start_run(
        self,
        experiment_id: int,
        *,
        name: str = "",
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        server_url: str | None = None,
        run_dir: str | Path | None = None,
        git_commit: str | None = None,
    ) -> RunPublic:
        """Record the start of a run (status ``running``).

        Args:
            experiment_id: Experiment the run belongs to.
            name: Short label.
            config: JSON-serialisable run configuration; secret-looking values are redacted.
            seed: Random seed.
            server_url: Swarm server base URL (a password in it is redacted).
            run_dir: Directory of the run's files.
            git_commit: Commit of the code used.

        Raises:
            NotFound: No such experiment.
            InvalidInput: A field is malformed.
        """
        data = _validated(
            RunCreate,
            name=name,
            config=dict(config or {}),
            seed=seed,
            server_url=server_url,
            run_dir=None if run_dir is None else str(run_dir),
            git_commit=git_commit,
        )
        with self._write() as session:
            # Locked so that a concurrent hypothesis registration sees this run (pre-registration).
            self._get(session, Experiment, experiment_id, lock=True)
            run = Run.model_validate(data, update={"experiment_id": experiment_id})
            return _committed(session, run, RunPublic)

    def get_run(self, run_id: int) -> RunPublic:
        """The run with this id (raises `NotFound` if there is none)."""
        return self._read_one(Run, RunPublic, run_id)

    def update_run(self, run_id: int, changes: RunUpdate) -> RunPublic:
        """Change the descriptive fields set in ``changes`` (name, config, seed, server, dir, commit).

        Raises:
            NotFound: No such run.
        """
        return self._update_row(Run, RunPublic, run_id, changes)

    def finish_run(
        self,
        run_id: int,
        *,
        status: RunStatus | str = RunStatus.finished,
        final_metrics: Mapping[str, float] | None = None,
        error: str | None = None,
    ) -> RunPublic:
        """Move a running run to a terminal status, once.

        Args:
            run_id: The run.
            status: ``finished``, ``failed`` or ``cancelled``.
            final_metrics: Metrics at the end, by name (finite floats).
            error: Why it failed (redacted of secrets).

        Raises:
            NotFound: No such run.
            InvalidInput: ``status`` is not terminal, or a metric is not a finite number.
            InvalidTransition: The run already finished.
        """
        try:
            target = RunStatus(status)
        except ValueError:
            raise InvalidInput(f"unknown run status {status!s}") from None
        if target is RunStatus.running:
            raise InvalidInput("finish_run needs a terminal status: finished, failed or cancelled")
        metrics = None if final_metrics is None else _finite_metrics(final_metrics)
        with self._write() as session:
            result = session.exec(
                update(Run)
                .where(col(Run.id) == run_id, col(Run.status) == RunStatus.running)
                .values(status=target, final_metrics=metrics, error=error, finished_at=utcnow())
            )
            if result.rowcount != 1:
                run = self._get(session, Run, run_id)
                raise InvalidTransition("run", run_id, run.status.value, target.value)
            session.commit()
            return RunPublic.model_validate(self._get(session, Run, run_id))

    def log_metrics(self, run_id: int, step: int, metrics: Mapping[str, float]) -> int:
        """Append one point per metric of a run at a trainer step.

        Args:
            run_id: The run.
            step: Trainer step (optimizer updates so far), >= 0.
            metrics: Values by metric name (finite floats), e.g. ``{"reward/mean": 0.41, "kl": 0.02}``.

        Returns:
            Number of points written.

        Raises:
            NotFound: No such run.
            InvalidInput: Negative step or a non-finite value (log NaN/inf as an event instead).
        """
        if step < 0:
            raise InvalidInput(f"step must be >= 0, got {step}")
        values = _finite_metrics(metrics)
        with self._write() as session:
            self._get(session, Run, run_id)
            now = utcnow()
            session.add_all(
                MetricPoint(run_id=run_id, step=step, name=name, value=value, recorded_at=now)
                for name, value in values.items()
            )
            session.commit()
        return len(values)

    def metric_history(self, run_id: int, name: str | None = None) -> list[MetricPointPublic]:
        """Metric points of a run ordered by step (then insertion), optionally of one metric."""
        query = select(MetricPoint).where(MetricPoint.run_id == run_id)
        if name is not None:
            query = query.where(MetricPoint.name == name)
        return self._read_all(MetricPointPublic, query.order_by(col(MetricPoint.step), col(MetricPoint.id)))

    def runs(
        self, study_id: int | None = None, *, status: RunStatus | str | None = None
    ) -> list[RunWithMetrics]:
        """Runs (of one study, or all) with the latest value of each metric, oldest first.

        "Latest" is the point with the highest step, ties broken by the last written.
        """
        with self._read() as session:
            query = select(Run, Experiment.study_id).join(Experiment, col(Run.experiment_id) == Experiment.id)
            if study_id is not None:
                query = query.where(Experiment.study_id == study_id)
            if status is not None:
                query = query.where(col(Run.status) == RunStatus(status))
            pairs = session.exec(query.order_by(col(Run.id))).all()
            latest = self._latest_metrics(session, [run.id for run, _ in pairs if run.id is not None])
            runs: list[RunWithMetrics] = []
            for run, owner in pairs:
                values, step = latest.get(run.id or 0, ({}, None))
                runs.append(
                    RunWithMetrics.model_validate(
                        run, update={"study_id": owner, "latest_metrics": values, "latest_step": step}
                    )
                )
            return runs

    def study_runs(self, study_id: int) -> list[RunWithMetrics]:
        """Runs of a study with their latest metric values (what the TUI and the analyst show).

        Raises:
            NotFound: No such study.
        """
        self.get_study(study_id)
        return self.runs(study_id)

    @staticmethod
    def _latest_metrics(
        session: Session, run_ids: list[int]
    ) -> dict[int, tuple[dict[str, float], int | None]]:
        if not run_ids:
            return {}
        rank = (
            func.row_number()
            .over(
                partition_by=(col(MetricPoint.run_id), col(MetricPoint.name)),
                order_by=(col(MetricPoint.step).desc(), col(MetricPoint.id).desc()),
            )
            .label("rank")
        )
        # Five columns: beyond SQLModel's typed select overloads, so SQLAlchemy's own select.
        ranked = (
            sa.select(
                col(MetricPoint.run_id),
                col(MetricPoint.name),
                col(MetricPoint.value),
                col(MetricPoint.step),
                rank,
            )
            .where(col(MetricPoint.run_id).in_(run_ids))
            .subquery()
        )
        rows = session.exec(
            select(ranked.c.run_id, ranked.c.name, ranked.c.value, ranked.c.step).where(ranked.c.rank == 1)
        ).all()
        latest: dict[int, tuple[dict[str, float], int | None]] = {}
        for run_id, name, value, step in rows:
            values, top = latest.get(run_id, ({}, None))
            values[name] = value
            latest[run_id] = (values, step if top is None else max(top, step))
        return {run_id: (dict(sorted(values.items())), top) for run_id, (values, top) in latest.items()}

    # ------------------------------------------------------------------------------ artifacts
    def add_artifact(
        self, study_id: int, kind: ArtifactKind | str, name: str, content: str
    ) -> CodeArtifactPublic:
        """Store a new version of a named piece of code (or a report) of a study.

        Versions count from 1 per (study, name). Content identical to the latest version is not stored
        again: that version is returned. Secret-looking strings in the content are redacted, and the
        hash is of the content as stored.

        Raises:
            NotFound: No such study.
            InvalidInput: Unknown kind, empty name, or the name is already used with another kind.
        """
        try:
            artifact_kind = ArtifactKind(kind)
        except ValueError:
            raise InvalidInput(
                f"unknown artifact kind {kind!s}; use one of {[k.value for k in ArtifactKind]}"
            ) from None
        if not name.strip() or len(name) > 200:
            raise InvalidInput("artifact name must be 1 to 200 characters")
        with self._write() as session:
            artifact = self._add_artifact(session, study_id, artifact_kind, name, content)
            session.commit()
            return CodeArtifactPublic.model_validate(artifact)

    def _add_artifact(
        self, session: Session, study_id: int, kind: ArtifactKind, name: str, content: str
    ) -> CodeArtifact:
        # Locking the study serialises version numbering of its artifacts across writers.
        self._get(session, Study, study_id, lock=True)
        latest = self._latest_artifact(session, study_id, name)
        if latest is not None and latest.kind != kind:
            raise InvalidInput(
                f"artifact {name!r} of study {study_id} is a {latest.kind.value}, not a {kind.value}"
            )
        # Hash what is stored: the content column would redact secrets on the way in anyway.
        stored = scrub_text(content)
        digest = _sha256(stored)
        if latest is not None and latest.sha256 == digest:
            return latest
        artifact = CodeArtifact(
            study_id=study_id,
            kind=kind,
            name=name,
            version=1 if latest is None else latest.version + 1,
            content=stored,
            sha256=digest,
        )
        session.add(artifact)
        session.flush()
        session.refresh(artifact)
        return artifact

    @staticmethod
    def _latest_artifact(session: Session, study_id: int, name: str) -> CodeArtifact | None:
        return session.exec(
            select(CodeArtifact)
            .where(CodeArtifact.study_id == study_id, CodeArtifact.name == name)
            .order_by(col(CodeArtifact.version).desc())
            .limit(1)
        ).first()

    def get_artifact(self, artifact_id: int) -> CodeArtifactPublic:
        """The artifact version with this id (raises `NotFound` if there is none)."""
        return self._read_one(CodeArtifact, CodeArtifactPublic, artifact_id)

    def latest_artifact(self, study_id: int, name: str) -> CodeArtifactPublic | None:
        """Newest version of a named artifact of a study, or ``None``."""
        with self._read() as session:
            latest = self._latest_artifact(session, study_id, name)
            return None if latest is None else CodeArtifactPublic.model_validate(latest)

    def artifacts(self, study_id: int) -> list[CodeArtifactPublic]:
        """All artifact versions of a study, by name then version."""
        query = select(CodeArtifact).where(CodeArtifact.study_id == study_id)
        return self._read_all(
            CodeArtifactPublic, query.order_by(col(CodeArtifact.name), col(CodeArtifact.version))
        )

    # -------------------------------------------------------------------------------- patches
    def propose_patch(
        self, artifact_id: int, *, diff: str, rationale: str, proposed_by: str = "analyst"
    ) -> PatchPublic:
        """Propose a change to an artifact version; the patch starts ``pending``.

        Raises:
            NotFound: No such artifact.
            InvalidInput: Empty diff or rationale.
        """
        if not diff.strip() or not rationale.strip():
            raise InvalidInput("a patch needs a non-empty diff and rationale")
        if not proposed_by.strip() or len(proposed_by) > 100:
            raise InvalidInput("proposed_by must be 1 to 100 characters")
        with self._write() as session:
            artifact = self._get(session, CodeArtifact, artifact_id)
            patch = Patch(
                artifact_id=artifact_id,
                base_version=artifact.version,
                diff=diff,
                rationale=rationale,
                proposed_by=proposed_by,
            )
            session.add(patch)
            session.commit()
            assert patch.id is not None
            return self._patch_public(session, patch.id)

    def decide_patch(self, patch_id: int, *, approve: bool, by: str, note: str | None = None) -> PatchPublic:
        """Approve or reject a pending patch, exactly once.

        The decision is a compare-and-set on ``status = 'pending'``: of several concurrent deciders,
        exactly one succeeds and the others get `InvalidTransition`.

        Args:
            patch_id: The patch.
            approve: ``True`` approves, ``False`` rejects.
            by: Who decided (user name, or ``"policy:<name>"``).
            note: Comment kept with the decision.

        Raises:
            NotFound: No such patch.
            InvalidInput: Empty ``by``.
            InvalidTransition: The patch is no longer pending.
        """
        if not by.strip() or len(by) > 100:
            raise InvalidInput("decided_by must be 1 to 100 characters")
        target = PatchStatus.approved if approve else PatchStatus.rejected
        with self._write() as session:
            result = session.exec(
                update(Patch)
                .where(col(Patch.id) == patch_id, col(Patch.status) == PatchStatus.pending)
                .values(status=target, decided_by=by, decided_at=utcnow(), note=note)
            )
            if result.rowcount != 1:
                patch = self._get(session, Patch, patch_id)
                raise InvalidTransition("patch", patch_id, patch.status.value, target.value)
            session.commit()
            return self._patch_public(session, patch_id)

    def mark_patch_applied(self, patch_id: int, *, content: str | None = None) -> PatchPublic:
        """Record that an approved patch was applied.

        Args:
            patch_id: The patch (must be ``approved``).
            content: The patched code; when given, it is stored as the next version of the patched
                artifact in the same transaction and linked as ``result_artifact_id``.

        Raises:
            NotFound: No such patch.
            InvalidTransition: The patch is not ``approved`` (pending, rejected or already applied).
        """
        with self._write() as session:
            result = session.exec(
                update(Patch)
                .where(col(Patch.id) == patch_id, col(Patch.status) == PatchStatus.approved)
                .values(status=PatchStatus.applied, applied_at=utcnow())
            )
            if result.rowcount != 1:
                patch = self._get(session, Patch, patch_id)
                reason = (
                    "only an approved patch can be applied" if patch.status is PatchStatus.pending else ""
                )
                raise InvalidTransition(
                    "patch", patch_id, patch.status.value, PatchStatus.applied.value, reason
                )
            if content is not None:
                patch = self._get(session, Patch, patch_id)
                base = self._get(session, CodeArtifact, patch.artifact_id)
                produced = self._add_artifact(session, base.study_id, base.kind, base.name, content)
                patch.result_artifact_id = produced.id
                session.add(patch)
            session.commit()
            return self._patch_public(session, patch_id)

    def get_patch(self, patch_id: int) -> PatchPublic:
        """The patch with this id (raises `NotFound` if there is none)."""
        with self._read() as session:
            return self._patch_public(session, patch_id)

    def pending_patches(self, study_id: int | None = None) -> list[PatchPublic]:
        """Patches waiting for a decision (of one study, or all), oldest first."""
        return self.patches(study_id, status=PatchStatus.pending)

    def patches(
        self, study_id: int | None = None, *, status: PatchStatus | str | None = None
    ) -> list[PatchPublic]:
        """Patches (of one study, or all; of one status, or all), oldest first."""
        with self._read() as session:
            query = select(Patch, CodeArtifact).join(CodeArtifact, col(Patch.artifact_id) == CodeArtifact.id)
            if study_id is not None:
                query = query.where(CodeArtifact.study_id == study_id)
            if status is not None:
                query = query.where(col(Patch.status) == PatchStatus(status))
            return [
                _patch_public(patch, artifact)
                for patch, artifact in session.exec(query.order_by(col(Patch.id)))
            ]

    def _patch_public(self, session: Session, patch_id: int) -> PatchPublic:
        patch = self._get(session, Patch, patch_id)
        return _patch_public(patch, self._get(session, CodeArtifact, patch.artifact_id))

    # ------------------------------------------------------------------------------- findings
    def add_finding(
        self,
        study_id: int,
        *,
        statement: str,
        confidence: float,
        evidence: str = "",
        status: FindingStatus | str = FindingStatus.unconfirmed,
        seeds: Iterable[int] = (),
        run_ids: Iterable[int] = (),
        hypothesis_id: int | None = None,
    ) -> FindingPublic:
        """Record a finding of a study, linked to the runs that are its evidence.

        Args:
            study_id: The study.
            statement: What was found.
            confidence: Probability the statement holds, in [0, 1].
            evidence: Summary of the evidence.
            status: ``unconfirmed``, ``confirmed`` or ``refuted``.
            seeds: Seeds on which it replicated.
            run_ids: Runs (of this study) that are its evidence.
            hypothesis_id: Hypothesis it bears on.

        Raises:
            NotFound: No such study, run or hypothesis.
            InvalidInput: A field is malformed, or a run or hypothesis belongs to another study.
        """
        data = _validated(
            FindingCreate,
            statement=statement,
            confidence=confidence,
            evidence=evidence,
            status=status,
            seeds=list(seeds),
            run_ids=list(run_ids),
            hypothesis_id=hypothesis_id,
        )
        with self._write() as session:
            self._get(session, Study, study_id)
            if data.hypothesis_id is not None:
                self._check_owner(session, Hypothesis, data.hypothesis_id, study_id)
            finding = Finding.model_validate(
                data.model_dump(exclude={"run_ids"}), update={"study_id": study_id}
            )
            session.add(finding)
            session.flush()
            assert finding.id is not None
            self._link_evidence(session, finding.id, study_id, data.run_ids)
            session.commit()
            return self._finding_public(session, finding.id)

    def update_finding(self, finding_id: int, changes: FindingUpdate) -> FindingPublic:
        """Change the fields set in ``changes``; ``run_ids`` replaces the evidence links.

        Raises:
            NotFound: No such finding or run.
            InvalidInput: A field is malformed.
        """
        data = _validated(FindingUpdate, **changes.model_dump(exclude_unset=True))
        fields = data.model_dump(exclude_unset=True)
        run_ids = fields.pop("run_ids", None)
        if "seeds" in fields and fields["seeds"] is not None:
            fields["seeds"] = sorted(set(fields["seeds"]))
        with self._write() as session:
            finding = self._get(session, Finding, finding_id, lock=True)
            finding.sqlmodel_update({**fields, "updated_at": utcnow()})
            session.add(finding)
            if run_ids is not None:
                for link in session.exec(
                    select(FindingEvidence).where(FindingEvidence.finding_id == finding_id)
                ):
                    session.delete(link)
                session.flush()
                self._link_evidence(session, finding_id, finding.study_id, sorted(set(run_ids)))
            session.commit()
            return self._finding_public(session, finding_id)

    def add_finding_seeds(
        self, finding_id: int, seeds: Iterable[int], *, run_ids: Iterable[int] = ()
    ) -> FindingPublic:
        """Add replication seeds (and their evidence runs) to a finding, keeping those already there.

        A read-modify-write under a row lock (PostgreSQL) or the write lock (SQLite): concurrent
        callers never lose each other's seeds.

        Raises:
            NotFound: No such finding or run.
        """
        with self._write() as session:
            finding = self._get(session, Finding, finding_id, lock=True)
            finding.seeds = sorted(set(finding.seeds) | set(seeds))
            finding.updated_at = utcnow()
            session.add(finding)
            known = set(
                session.exec(
                    select(FindingEvidence.run_id).where(FindingEvidence.finding_id == finding_id)
                ).all()
            )
            self._link_evidence(session, finding_id, finding.study_id, sorted(set(run_ids) - known))
            session.commit()
            return self._finding_public(session, finding_id)

    def findings(self, study_id: int, *, status: FindingStatus | str | None = None) -> list[FindingPublic]:
        """Findings of a study (optionally of one status), oldest first, with their evidence run ids."""
        with self._read() as session:
            query = select(Finding).where(Finding.study_id == study_id)
            if status is not None:
                query = query.where(col(Finding.status) == FindingStatus(status))
            rows = session.exec(query.order_by(col(Finding.id))).all()
            ids = [row.id for row in rows if row.id is not None]
            links: dict[int, list[int]] = {}
            if ids:
                for finding_id, run_id in session.exec(
                    select(FindingEvidence.finding_id, FindingEvidence.run_id)
                    .where(col(FindingEvidence.finding_id).in_(ids))
                    .order_by(col(FindingEvidence.run_id))
                ):
                    links.setdefault(finding_id, []).append(run_id)
            return [
                FindingPublic.model_validate(row, update={"run_ids": links.get(row.id or 0, [])})
                for row in rows
            ]

    def _finding_public(self, session: Session, finding_id: int) -> FindingPublic:
        finding = self._get(session, Finding, finding_id)
        run_ids = session.exec(
            select(FindingEvidence.run_id)
            .where(FindingEvidence.finding_id == finding_id)
            .order_by(col(FindingEvidence.run_id))
        ).all()
        return FindingPublic.model_validate(finding, update={"run_ids": list(run_ids)})

    def _link_evidence(
        self, session: Session, finding_id: int, study_id: int, run_ids: Iterable[int]
    ) -> None:
        for run_id in run_ids:
            self._run_study(session, run_id, study_id)
            session.add(FindingEvidence(finding_id=finding_id, run_id=run_id))

    def _run_study(self, session: Session, run_id: int, study_id: int | None = None) -> int:
        """The study a run belongs to (through its experiment).

        Raises:
            NotFound: No such run.
            InvalidInput: ``study_id`` is given and the run belongs to another study.
        """
        self._get(session, Run, run_id)
        owner = session.exec(
            select(Experiment.study_id)
            .join(Run, col(Run.experiment_id) == Experiment.id)
            .where(Run.id == run_id)
        ).one()
        if study_id is not None and owner != study_id:
            raise InvalidInput(f"run {run_id} belongs to study {owner}, not study {study_id}")
        return owner

    def _check_owner(self, session: Session, table: type[Hypothesis], key: int, study_id: int) -> None:
        row = self._get(session, table, key)
        if row.study_id != study_id:
            raise InvalidInput(
                f"{table.__name__.lower()} {key} belongs to study {row.study_id}, not study {study_id}"
            )

    # --------------------------------------------------------------------------------- events
    def log_event(
        self,
        message: str,
        *,
        study_id: int | None = None,
        run_id: int | None = None,
        level: EventLevel | str = EventLevel.info,
    ) -> EventPublic:
        """Append an event about a study or a run (a run event is also filed under its study).

        Secret-looking substrings of the message are redacted.

        Raises:
            NotFound: No such study or run.
            InvalidInput: Neither study nor run given, unknown level, or the run is of another study.
        """
        if study_id is None and run_id is None:
            raise InvalidInput("an event needs a study_id or a run_id")
        try:
            event_level = EventLevel(level)
        except ValueError:
            raise InvalidInput(
                f"unknown event level {level!s}; use one of {[v.value for v in EventLevel]}"
            ) from None
        with self._write() as session:
            if run_id is not None:
                study_id = self._run_study(session, run_id, study_id)
            elif study_id is not None:
                self._get(session, Study, study_id)
            event = Event(study_id=study_id, run_id=run_id, level=event_level, message=message)
            return _committed(session, event, EventPublic)

    def events(
        self,
        *,
        study_id: int | None = None,
        run_id: int | None = None,
        after_id: int | None = None,
        limit: int | None = None,
    ) -> list[EventPublic]:
        """Events, oldest first, filtered by study and/or run; ``after_id`` gives those newer than a
        previously seen event (for polling), ``limit`` caps the count."""
        with self._read() as session:
            query = select(Event)
            if study_id is not None:
                query = query.where(Event.study_id == study_id)
            if run_id is not None:
                query = query.where(Event.run_id == run_id)
            if after_id is not None:
                query = query.where(col(Event.id) > after_id)
            query = query.order_by(col(Event.id))
            if limit is not None:
                query = query.limit(limit)
            return [EventPublic.model_validate(row) for row in session.exec(query).all()]

    # --------------------------------------------------------------------------------- export
    def export_study(self, study_id: int) -> StudyExport:
        """Everything recorded about a study, as one serialisable model.

        ``export.model_dump(mode="json")`` is the JSON export; `memory.render_markdown` renders it.

        Raises:
            NotFound: No such study.
        """
        study = self.get_study(study_id)
        points = self._study_points(study_id)
        runs = [
            RunExport.model_validate(
                run.model_dump(),
                update={
                    "metric_points": [p for p in points.get(run.id, []) if p.name not in NOT_METRICS],
                    "latest_metrics": _measured(run.latest_metrics),
                    "final_metrics": _measured(run.final_metrics),
                },
            )
            for run in self.runs(study_id)
        ]
        experiments = [
            ExperimentExport.model_validate(
                experiment.model_dump(),
                update={"runs": [run for run in runs if run.experiment_id == experiment.id]},
            )
            for experiment in self.experiments(study_id)
        ]
        return StudyExport(
            schema_revision=self.schema_revision,
            exported_at=utcnow(),
            study=study,
            hypotheses=self.hypotheses(study_id),
            experiments=experiments,
            artifacts=self.artifacts(study_id),
            patches=self.patches(study_id),
            findings=self.findings(study_id),
            events=self.events(study_id=study_id),
        )

    def _study_points(self, study_id: int) -> dict[int, list[MetricPointExport]]:
        """Every metric point of a study's runs, by run id, ordered by step then insertion."""
        with self._read() as session:
            rows = session.exec(
                select(MetricPoint)
                .join(Run, col(MetricPoint.run_id) == Run.id)
                .join(Experiment, col(Run.experiment_id) == Experiment.id)
                .where(Experiment.study_id == study_id)
                .order_by(col(MetricPoint.run_id), col(MetricPoint.step), col(MetricPoint.id))
            ).all()
            points: dict[int, list[MetricPointExport]] = {}
            for row in rows:
                points.setdefault(row.run_id, []).append(
                    MetricPointExport(
                        step=row.step, name=row.name, value=row.value, recorded_at=row.recorded_at
                    )
                )
            return points

    # --------------------------------------------------------------------------------- import
    def import_study(self, export: StudyExport) -> int:
        """Recreate an exported study (the inverse of `export_study`) in one transaction.

        Everything the export holds is restored with its timestamps and statuses: the study, its
        hypotheses, experiments, runs (config, seed, commit, status, final metrics, error) with every
        metric point, artifact versions, patches (with their decisions), findings with their evidence
        runs, and events. Ids are assigned anew and every reference is mapped to the new ids.

        The import is idempotent, keyed on the study's ``(kind, question, created_at)`` (its creation
        time to the microsecond is kept by the export, so a store that exported it and a store that
        imported it share the key). When a study with that key exists, nothing is duplicated: the
        experiments (matched by name and creation time), hypotheses (statement and registration time)
        and runs (experiment, name and start time) it lacks are added, with the new runs' metric points
        and events; the existing records, and the study's artifacts, patches, findings and study-level
        events, are left as they are. So importing a newer export of the same study adds its new runs.

        Args:
            export: A study export (e.g. ``StudyExport.model_validate_json(text)``).

        Returns:
            The id of the study in this store (new, or the existing one with the same key).

        Raises:
            InvalidInput: The export references a record it does not hold (e.g. a run of a finding).
        """
        source = export.study
        created = _aware(source.created_at)
        with self._write() as session:
            study = session.exec(
                select(Study).where(
                    Study.kind == source.kind, Study.question == source.question, Study.created_at == created
                )
            ).first()
            merging = study is not None
            if study is None:
                study = _imported(Study, source)
                session.add(study)
                session.flush()
            assert study.id is not None
            study_id = study.id

            hypotheses: dict[int, int] = {}
            for hypothesis in export.hypotheses:
                registered = _aware(hypothesis.registered_at)
                found = _existing_id(
                    session,
                    merging,
                    Hypothesis,
                    study_id=study_id,
                    statement=hypothesis.statement,
                    registered_at=registered,
                )
                if found is None:
                    found = _inserted_id(session, _imported(Hypothesis, hypothesis, study_id=study_id))
                hypotheses[hypothesis.id] = found

            runs: dict[int, int] = {}
            new_runs: set[int] = set()
            for experiment in export.experiments:
                experiment_id = self._import_experiment(session, study_id, experiment, hypotheses, merging)
                for run in experiment.runs:
                    found = _existing_id(
                        session,
                        merging,
                        Run,
                        experiment_id=experiment_id,
                        name=run.name,
                        started_at=_aware(run.started_at),
                    )
                    if found is None:
                        found = self._import_run(session, experiment_id, run)
                        new_runs.add(run.id)
                    runs[run.id] = found

            if not merging:
                self._import_artifacts(session, study_id, export)
                for finding in export.findings:
                    hypothesis_id = _mapped(hypotheses, finding.hypothesis_id, "hypothesis")
                    finding_id = _inserted_id(
                        session, _imported(Finding, finding, study_id=study_id, hypothesis_id=hypothesis_id)
                    )
                    for evidence in finding.run_ids:
                        session.add(
                            FindingEvidence(finding_id=finding_id, run_id=_mapped(runs, evidence, "run"))
                        )
            for event in export.events:
                event_run = None if event.run_id is None else _mapped(runs, event.run_id, "run")
                if (event.run_id is None and merging) or (
                    event.run_id is not None and event.run_id not in new_runs
                ):
                    continue  # already in the store (merged import)
                session.add(_imported(Event, event, study_id=study_id, run_id=event_run))
            session.commit()
            return study_id

    @staticmethod
    def _import_experiment(
        session: Session,
        study_id: int,
        experiment: ExperimentExport,
        hypotheses: dict[int, int],
        merging: bool,
    ) -> int:
        created = _aware(experiment.created_at)
        found = _existing_id(
            session, merging, Experiment, study_id=study_id, name=experiment.name, created_at=created
        )
        if found is not None:
            return found
        hypothesis_id = _mapped(hypotheses, experiment.hypothesis_id, "hypothesis")
        return _inserted_id(
            session, _imported(Experiment, experiment, study_id=study_id, hypothesis_id=hypothesis_id)
        )

    @staticmethod
    def _import_run(session: Session, experiment_id: int, run: RunExport) -> int:
        final = None if run.final_metrics is None else _finite_metrics(run.final_metrics)
        run_id = _inserted_id(session, _imported(Run, run, experiment_id=experiment_id, final_metrics=final))
        session.add_all(
            _imported(
                MetricPoint,
                point,
                run_id=run_id,
                value=_finite_metrics({point.name: point.value})[point.name],
            )
            for point in run.metric_points
        )
        return run_id

    @staticmethod
    def _import_artifacts(session: Session, study_id: int, export: StudyExport) -> None:
        artifacts: dict[int, int] = {}
        for artifact in sorted(export.artifacts, key=lambda a: a.id):
            artifacts[artifact.id] = _inserted_id(
                session, _imported(CodeArtifact, artifact, study_id=study_id)
            )
        for patch in export.patches:
            session.add(
                _imported(
                    Patch,
                    patch,
                    artifact_id=_mapped(artifacts, patch.artifact_id, "artifact"),
                    result_artifact_id=_mapped(artifacts, patch.result_artifact_id, "artifact"),
                )
            )


def _committed(session: Session, row: SQLModel, public: type[_M]) -> _M:
    """Adds ``row``, commits the session and returns the stored row (defaults and ids filled in) as ``public``."""
    session.add(row)
    session.commit()
    session.refresh(row)
    return public.model_validate(row)


def _existing_id(session: Session, merging: bool, model: type[_Row], **key: object) -> int | None:
    """The id of the ``model`` row whose columns equal ``key`` (the record's natural key), or None.

    Only a merging import looks (a fresh study has no rows yet): None when ``merging`` is False.
    """
    if not merging:
        return None
    found: int | None = session.exec(
        select(model.id).where(*(getattr(model, column) == value for column, value in key.items()))
    ).first()
    return found


def _inserted_id(session: Session, row: _Row) -> int:
    """Adds ``row`` to the session and returns the id the database gave it (flushed, not committed)."""
    session.add(row)
    session.flush()
    assert row.id is not None
    return row.id


def _imported(table: type[_S], record: BaseModel, **links: object) -> _S:
    """A new ``table`` row holding the exported ``record``'s fields of the same names (copied; its id
    aside; timestamps made aware UTC), with ``links`` set over them: the re-mapped ids and values that
    needed converting.

    Raises:
        ValueError: ``record`` has a reference (``…_id``) field that ``links`` does not re-map (a
            programming error: an old id must never reach the new store).
    """
    columns = set(table.model_fields) - {"id"}
    values = record.model_dump(include=columns)
    stale = {name for name in values if name.endswith("_id")} - set(links)
    if stale:
        raise ValueError(f"{table.__name__}: the references {sorted(stale)} are not re-mapped")
    values = {name: _aware(v) if isinstance(v, datetime) else v for name, v in values.items()}
    return table(**{**values, **links})


def _aware(moment: datetime) -> datetime:
    """An exported timestamp as the store writes them: aware UTC (a naive one, from SQLite, is UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@overload
def _mapped(ids: Mapping[int, int], old: int, record: str) -> int: ...
@overload
def _mapped(ids: Mapping[int, int], old: None, record: str) -> None: ...
@overload
def _mapped(ids: Mapping[int, int], old: int | None, record: str) -> int | None: ...
def _mapped(ids: Mapping[int, int], old: int | None, record: str) -> int | None:
    """The new id of an exported record's ``old`` id (``None`` for none); `InvalidInput` when the export
    lacks it."""
    if old is None:
        return None
    try:
        return ids[old]
    except KeyError:
        raise InvalidInput(f"the export references {record} {old}, which it does not hold") from None


def _measured(metrics: Mapping[str, float] | None) -> dict[str, float] | None:
    """``metrics`` without the fields that are not measurements (`NOT_METRICS`: a time stamp a store
    written before that rule logged as one)."""
    return None if metrics is None else {k: v for k, v in metrics.items() if k not in NOT_METRICS}


def _finite_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    values: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name or len(name) > 200:
            raise InvalidInput("metric names must be strings of 1 to 200 characters")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InvalidInput(f"metric {name!r} is not a number") from None
        if not math.isfinite(number):
            raise InvalidInput(
                f"metric {name!r} is {number}; only finite values are stored (log the event instead)"
            )
        values[name] = number
    return values


def _patch_public(patch: Patch, artifact: CodeArtifact) -> PatchPublic:
    return PatchPublic.model_validate(
        patch,
        update={
            "study_id": artifact.study_id,
            "artifact_name": artifact.name,
            "artifact_kind": artifact.kind,
        },
    )
