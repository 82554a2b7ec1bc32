"""The durable episode pool: every ended episode and its call records, in SQLite (WAL).

An episode is written once, when it ends (finish or abort), in one transaction with all its calls, and
the write is committed before the HTTP answer is sent, so a finished episode survives a crash of the
server the moment its client has been told it is finished. Open episodes live in memory only; after a
crash their keys stop working and their clients see 401 (and abort or retry).

Training consumption is recorded per episode as ``trained_step``: the policy version whose update used
it (a batch consumed without an update, ``train.skipped``: the policy version being served then, so it
is as durable as that step; 0 before the first step). On restart, :meth:`Pool.rewind` forgets consumption by steps newer than the last checkpoint, so an
episode is trained exactly once per persisted policy (never lost, never twice).
"""

from __future__ import annotations

import copy
import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm.protocol import EpisodeCounts, EpisodeKind, EpisodeStatus
from swarm.tracking.records import CallRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    client_id TEXT NOT NULL,
    family TEXT,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    reward REAL,
    agent_rewards TEXT NOT NULL DEFAULT '{}',
    metrics TEXT NOT NULL DEFAULT '{}',
    metadata TEXT NOT NULL DEFAULT '{}',
    trainable_agents TEXT,
    reason TEXT,
    created_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    seq INTEGER NOT NULL,
    trained_step INTEGER,
    owner TEXT,
    key_digest TEXT,
    txn TEXT
);
CREATE INDEX IF NOT EXISTS episodes_pending ON episodes (kind, trained_step, seq);
CREATE TABLE IF NOT EXISTS calls (
    episode_id TEXT NOT NULL REFERENCES episodes(id),
    idx INTEGER NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (episode_id, idx)
);
"""


@dataclass
class StoredEpisode:
    """One ended episode as kept in the pool."""

    id: str
    task_id: str
    client_id: str
    kind: EpisodeKind
    status: EpisodeStatus
    created_at: float
    finished_at: float
    family: str | None = None
    reward: float | None = None
    agent_rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    trainable_agents: list[str] | None = None
    reason: str | None = None
    seq: int = 0
    """Commit order (1, 2, …): batch policies take the oldest first."""
    trained_step: int | None = None
    txn: dict[str, Any] | None = None
    """Multi-server finish: ``txn_id``, ``primary_url``, ``primary_episode_id`` (``None`` outside one)."""
    owner: str | None = None
    """Name of the client token that began it (``None``: begun without one); never the token itself."""
    key_digest: str | None = None
    """SHA-256 hex digest of its episode key (the key itself is never stored)."""
    tenant: str | None = None
    """The LoRA tenant it was begun under (``swarm serve --tenants``); ``None``: the server's one policy."""


_ADDED_COLUMNS = {"txn": "TEXT", "owner": "TEXT", "key_digest": "TEXT", "tenant": "TEXT"}
"""Columns newer than the first schema, added to an older pool when it is opened."""


class Pool:
    """Thread-safe SQLite pool of ended episodes.

    A LoRA tenant's training reads and marks its own partition (:meth:`partition`: the episodes stored
    with its ``tenant``); the pool itself stores and reads every episode, but its :meth:`pending`,
    :meth:`mark_trained`, :meth:`trained_steps_after` and :meth:`rewind` (the one-policy server's training)
    see only episodes begun under no tenant.

    Args:
        path: database file (created with its parent directory); ``":memory:"`` for tests.
    """

    _tenant: str | None = None
    """The partition this object reads (:meth:`partition`); ``None``: every episode."""

    def __init__(self, path: Path | str) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
            have = {row[1] for row in self._db.execute("PRAGMA table_info(episodes)")}
            for name, kind in _ADDED_COLUMNS.items():
                if name not in have:  # a pool written before multi-server finishes or credentials
                    self._db.execute(f"ALTER TABLE episodes ADD COLUMN {name} {kind}")
            row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM episodes").fetchone()
        self._seq = int(row[0])

    def close(self) -> None:
        if self._tenant is not None:
            return  # a partition shares its pool's connection
        with self._lock:
            self._db.close()

    def partition(self, tenant: str) -> Pool:
        """A view of the episodes of LoRA tenant ``tenant`` over the same database and lock: its
        :meth:`pending`, :meth:`trained_steps_after`, :meth:`rewind` and :meth:`counts` see only them
        (a tenant's resume rewinds its own steps only). Episodes are stored through the pool itself.
        """
        view = copy.copy(self)
        view._tenant = tenant
        return view

    def _only(self) -> tuple[str, tuple[str, ...]]:
        """The SQL condition (`` AND tenant = ?``) and its parameter of this partition; empty for the pool."""
        return ("", ()) if self._tenant is None else (" AND tenant = ?", (self._tenant,))

    def _own(self) -> tuple[str, tuple[str, ...]]:
        """The SQL condition of the episodes this object's policy trains on: its tenant's (a partition) or
        those begun under no tenant (the pool: the server's one policy never consumes, marks or rewinds a
        tenant's episodes, whatever run dir it was started on)."""
        return (" AND tenant IS NULL", ()) if self._tenant is None else self._only()

    # -- writes ----------------------------------------------------------------------------------------
    def add(self, episode: StoredEpisode, calls: Sequence[CallRecord]) -> StoredEpisode:
        """Commit an ended episode and its calls in one transaction; returns it with ``seq`` set.

        Raises:
            sqlite3.IntegrityError: an episode with this id is already stored.
        """
        self.add_many([(episode, calls)])
        return episode

    def add_many(self, ended: Sequence[tuple[StoredEpisode, Sequence[CallRecord]]]) -> None:
        """Commit ended episodes with their calls in one transaction (all or none), setting each one's
        ``seq`` in the order given (`swarm.server.pool_writer.PoolWriter` commits a burst of finishes
        at once).

        Raises:
            sqlite3.IntegrityError: an episode with one of these ids is already stored (none is stored).
        """
        if self._tenant is not None:
            raise RuntimeError("episodes are stored through the pool, not a tenant's partition")
        with self._lock:
            first = self._seq
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for episode, calls in ended:
                    self._seq += 1
                    episode.seq = self._seq
                    self._insert(episode, calls)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._seq = first
                raise

    def _insert(self, episode: StoredEpisode, calls: Sequence[CallRecord]) -> None:
        self._db.execute(
            "INSERT INTO episodes (id, task_id, client_id, family, kind, status, reward, agent_rewards,"
            " metrics, metadata, trainable_agents, reason, created_at, finished_at, seq, trained_step, txn,"
            " owner, key_digest, tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                episode.id,
                episode.task_id,
                episode.client_id,
                episode.family,
                episode.kind.value,
                episode.status.value,
                episode.reward,
                json.dumps(episode.agent_rewards),
                json.dumps(episode.metrics),
                json.dumps(episode.metadata),
                None if episode.trainable_agents is None else json.dumps(episode.trainable_agents),
                episode.reason,
                episode.created_at,
                episode.finished_at,
                episode.seq,
                episode.trained_step,
                None if episode.txn is None else json.dumps(episode.txn),
                episode.owner,
                episode.key_digest,
                episode.tenant,
            ),
        )
        self._db.executemany(
            "INSERT INTO calls (episode_id, idx, record) VALUES (?, ?, ?)",
            [(episode.id, c.index, c.model_dump_json()) for c in calls],
        )

    def resolve_prepared(
        self, episode_id: str, txn_id: str, status: EpisodeStatus, reason: str | None = None
    ) -> StoredEpisode | None:
        """Move a ``prepared`` episode of transaction ``txn_id`` to ``status`` (compare-and-set, one
        SQLite transaction); returns the episode as stored afterwards, or ``None`` when it is unknown.

        When it is no longer prepared (already resolved) or belongs to another transaction nothing
        changes: the caller compares the returned status and ``txn`` with what it asked for.
        """
        with self._lock:
            self._db.execute(
                "UPDATE episodes SET status = ?, reason = COALESCE(?, reason) "
                "WHERE id = ? AND status = ? AND json_extract(txn, '$.txn_id') = ?",
                (status.value, reason, episode_id, EpisodeStatus.PREPARED.value, txn_id),
            )
        found = self.get(episode_id)
        return None if found is None else found[0]

    def prepared(self) -> list[StoredEpisode]:
        """Episodes still ``prepared`` (multi-server finishes not yet resolved), oldest first."""
        with self._lock:
            cur = self._db.execute(
                "SELECT * FROM episodes WHERE status = ? ORDER BY seq", (EpisodeStatus.PREPARED.value,)
            )
            cols = [d[0] for d in cur.description]
            rows = cur.fetchall()
        return [self._episode(dict(zip(cols, r, strict=True))) for r in rows]

    def mark_trained(self, episode_ids: Iterable[str], step: int) -> None:
        """Record that the update producing policy version ``step`` consumed these episodes (those of this
        object's policy, `_own`)."""
        own, param = self._own()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                f"UPDATE episodes SET trained_step = ? WHERE id = ? AND trained_step IS NULL{own}",
                [(step, eid, *param) for eid in episode_ids],
            )
            self._db.execute("COMMIT")

    def set_teacher_logprobs(self, episode_id: str, scored: dict[int, list[float]]) -> None:
        """Store the teacher's logprobs of calls of an ended episode (on-policy distillation): call index →
        its ``CallRecord.teacher_logprobs`` (aligned with its completion ids), written into the pooled
        records in one transaction, so a restarted server reads them back and never scores them again."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "UPDATE calls SET record = json_set(record, '$.teacher_logprobs', json(?)) "
                    "WHERE episode_id = ? AND idx = ?",
                    [(json.dumps(logprobs), episode_id, index) for index, logprobs in scored.items()],
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def trained_steps_after(self, step: int) -> list[int]:
        """Distinct steps after ``step`` that consumed episodes, ascending."""
        only, param = self._own()
        with self._lock:
            rows = self._db.execute(
                f"SELECT DISTINCT trained_step FROM episodes WHERE trained_step > ?{only} ORDER BY trained_step",
                (step, *param),
            ).fetchall()
        return [int(r[0]) for r in rows]

    def rewind(self, checkpoint_step: int) -> int:
        """Forget consumption by steps after ``checkpoint_step`` (their weights were lost); returns count."""
        only, param = self._own()
        with self._lock:
            cur = self._db.execute(
                f"UPDATE episodes SET trained_step = NULL WHERE trained_step > ?{only}",
                (checkpoint_step, *param),
            )
            return int(cur.rowcount)

    # -- reads -----------------------------------------------------------------------------------------
    def get(self, episode_id: str) -> tuple[StoredEpisode, list[CallRecord]] | None:
        """The stored episode and its calls in call order, or ``None``."""
        with self._lock:
            row = self._db.execute("SELECT * FROM episodes WHERE id = ?", (episode_id,)).fetchone()
            if row is None:
                return None
            cols = [d[0] for d in self._db.execute("SELECT * FROM episodes LIMIT 0").description]
            records = self._db.execute(
                "SELECT record FROM calls WHERE episode_id = ? ORDER BY idx", (episode_id,)
            ).fetchall()
        return self._episode(dict(zip(cols, row, strict=True))), [
            CallRecord.model_validate_json(r[0]) for r in records
        ]

    def pending(self, kind: EpisodeKind = EpisodeKind.TRAIN) -> list[StoredEpisode]:
        """Ended, untrained episodes of ``kind`` in commit order (oldest first); ``prepared`` ones are
        not ended yet for training (their transaction may still abort)."""
        only, param = self._own()
        with self._lock:
            cur = self._db.execute(
                f"SELECT * FROM episodes WHERE kind = ? AND trained_step IS NULL AND status != ?{only} ORDER BY seq",
                (kind.value, EpisodeStatus.PREPARED.value, *param),
            )
            cols = [d[0] for d in cur.description]
            rows = cur.fetchall()
        return [self._episode(dict(zip(cols, r, strict=True))) for r in rows]

    def untrained_of(self, tenants: Sequence[str]) -> int:
        """How many ended train episodes of these LoRA tenants no step trained (of :meth:`counts`'
        ``pending``; infra failures and ``prepared`` members are in neither)."""
        if not tenants:
            return 0
        marks = ", ".join("?" for _ in tenants)
        with self._lock:
            (n,) = self._db.execute(
                "SELECT COUNT(*) FROM episodes WHERE kind = ? AND trained_step IS NULL AND status NOT IN (?, ?) "
                f"AND tenant IN ({marks})",
                (
                    EpisodeKind.TRAIN.value,
                    EpisodeStatus.INFRA_FAILURE.value,
                    EpisodeStatus.PREPARED.value,
                    *tenants,
                ),
            ).fetchone()
        return int(n)

    def episodes(self, episode_ids: Sequence[str]) -> dict[str, StoredEpisode]:
        """Stored episodes by id (ids not in the pool are left out)."""
        out: dict[str, StoredEpisode] = {}
        with self._lock:
            for eid in episode_ids:
                cur = self._db.execute("SELECT * FROM episodes WHERE id = ?", (eid,))
                row = cur.fetchone()
                if row is not None:
                    cols = [d[0] for d in cur.description]
                    out[eid] = self._episode(dict(zip(cols, row, strict=True)))
        return out

    def calls(self, episode_ids: Sequence[str]) -> dict[str, list[CallRecord]]:
        """Call records of several episodes, each in call order."""
        out: dict[str, list[CallRecord]] = {eid: [] for eid in episode_ids}
        with self._lock:
            for eid in episode_ids:
                for (record,) in self._db.execute(
                    "SELECT record FROM calls WHERE episode_id = ? ORDER BY idx", (eid,)
                ):
                    out[eid].append(CallRecord.model_validate_json(record))
        return out

    def counts(self) -> EpisodeCounts:
        """Counts of stored episodes by status, plus pending and trained train episodes."""
        only, param = self._only()
        with self._lock:
            by_status = dict(
                self._db.execute(
                    f"SELECT status, COUNT(*) FROM episodes WHERE 1{only} GROUP BY status", param
                ).fetchall()
            )
            pending, trained = self._db.execute(
                "SELECT SUM(trained_step IS NULL), SUM(trained_step IS NOT NULL) FROM episodes "
                f"WHERE kind = ? AND status NOT IN (?, ?){only}",  # infra failures are retired, never trained
                (
                    EpisodeKind.TRAIN.value,
                    EpisodeStatus.INFRA_FAILURE.value,
                    EpisodeStatus.PREPARED.value,
                    *param,
                ),
            ).fetchone()
        return EpisodeCounts(
            finished=by_status.get(EpisodeStatus.FINISHED.value, 0),
            aborted=by_status.get(EpisodeStatus.ABORTED.value, 0),
            infra_failure=by_status.get(EpisodeStatus.INFRA_FAILURE.value, 0),
            prepared=by_status.get(EpisodeStatus.PREPARED.value, 0),
            pending=int(pending or 0),
            trained=int(trained or 0),
        )

    def recent(self, limit: int = 100) -> list[StoredEpisode]:
        """The most recently ended episodes, newest first."""
        with self._lock:
            cur = self._db.execute("SELECT * FROM episodes ORDER BY seq DESC LIMIT ?", (limit,))
            cols = [d[0] for d in cur.description]
            rows = cur.fetchall()
        return [self._episode(dict(zip(cols, r, strict=True))) for r in rows]

    @staticmethod
    def _episode(row: dict[str, Any]) -> StoredEpisode:
        return StoredEpisode(
            id=row["id"],
            task_id=row["task_id"],
            client_id=row["client_id"],
            family=row["family"],
            kind=EpisodeKind(row["kind"]),
            status=EpisodeStatus(row["status"]),
            reward=row["reward"],
            agent_rewards=json.loads(row["agent_rewards"]),
            metrics=json.loads(row["metrics"]),
            metadata=json.loads(row["metadata"]),
            trainable_agents=None if row["trainable_agents"] is None else json.loads(row["trainable_agents"]),
            reason=row["reason"],
            created_at=row["created_at"],
            finished_at=row["finished_at"],
            seq=row["seq"],
            trained_step=row["trained_step"],
            txn=None if row.get("txn") is None else json.loads(row["txn"]),
            owner=row["owner"],
            key_digest=row["key_digest"],
            tenant=row.get("tenant"),
        )
