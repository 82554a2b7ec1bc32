"""Admission, quotas, votes and the pending index of the training loop
(docs/ARCHITECTURE.md §Batch policies and quotas).

`AdmissionControl` decides whether a new train episode may begin (family quotas: 429; asynchronous
training, AReaL's bound on episodes ahead of the trainer: 503, both with ``Retry-After``), keeps the
clients' readiness votes, and indexes the ended, untrained train episodes in commit order as
`EpisodeSummary` rows (reward and per-agent rewards included), so the batch check after every finish
and the step that follows read memory, not the pool. A step's batch comes from :meth:`select`; the
step hands its episodes back with :meth:`consumed`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Literal

from swarm.batch import Batch, BatchPolicy, ClientVotes, EpisodeSummary, FamilyQuotas, admit, select_batch
from swarm.config import TrainingConfig
from swarm.errors import Unavailable
from swarm.pool import Pool, StoredEpisode
from swarm.protocol import EpisodeKind, EpisodeStatus
from swarm.tracking.records import CallRecord

__all__ = ["AdmissionControl", "summary"]

# Policies whose batch is B·G episodes that always form once admitted episodes end. Not
# `informative_tasks`: zero-signal groups are consumed only when an informative batch forms, so holding
# admission on them could wait forever on a task the policy always fails.
_SIZED_POLICIES = frozenset({BatchPolicy.EPISODES, BatchPolicy.TASKS})


_SAME_NAMED = tuple(name for name in EpisodeSummary.model_fields if name not in ("episode_id", "kind"))
"""The fields of `EpisodeSummary` that a `StoredEpisode` holds under the same name (all but the id and the
kind)."""


def summary(ep: StoredEpisode) -> EpisodeSummary:
    """What a batch policy and a step need of a pooled episode (no tokens): its id, its kind as
    ``"train"``/``"eval"`` and its `_SAME_NAMED` fields as they are."""
    kind: Literal["train", "eval"] = "train" if ep.kind is EpisodeKind.TRAIN else "eval"
    return EpisodeSummary(episode_id=ep.id, kind=kind, **{name: getattr(ep, name) for name in _SAME_NAMED})


class AdmissionControl:
    """Admission of train episodes, the quota window, client votes and the pending index.

    Built after the pool was rewound to the restored checkpoint: the index starts from the pool's
    pending train episodes.

    Args:
        config: the training configuration (``batch``, ``quotas``, ``max_staleness`` are read live).
        pool: the episode pool (marked at :meth:`consumed`).
        on_change: called when a batch may have become ready (an episode ended, a vote, a goodbye).
    """

    def __init__(self, config: TrainingConfig, pool: Pool, *, on_change: Callable[[], None]) -> None:
        self.config = config
        self.pool = pool
        self._on_change = on_change
        self.votes = ClientVotes(config.client_timeout_s)
        self.window: Counter[str] = Counter()
        """Train episodes admitted per family since the last step (for quotas)."""
        self._lock = threading.Lock()
        # Ended, untrained train episodes in commit order.
        self._pending: dict[str, EpisodeSummary] = {e.id: summary(e) for e in pool.pending(EpisodeKind.TRAIN)}
        # Task → train episodes admitted and not yet consumed or retired (asynchronous admission).
        self._ahead: Counter[str] = Counter(
            p.task_id for p in self._pending.values() if p.status is not EpisodeStatus.INFRA_FAILURE
        )
        # Pending episode → policy version of its oldest call (staleness metrics).
        self._oldest_version: dict[str, int] = {
            eid: min(c.policy_version for c in calls)
            for eid, calls in pool.calls(list(self._pending)).items()
            if calls
        }

    # -- admission -----------------------------------------------------------------------------------------
    def admit(self, family: str | None, kind: EpisodeKind, task_id: str) -> None:
        """Admit a new train episode: family quotas (429) and, asynchronous, the bound on episodes ahead
        of the trainer (503), both with ``Retry-After``."""
        if kind is not EpisodeKind.TRAIN:
            return
        self._admit_ahead(task_id)
        if self.config.quotas is not None:
            decision = admit(self.config.quotas, dict(self.window), family)
            if not decision.allowed:
                raise Unavailable(decision.reason, retry_after_s=decision.retry_after_s, status_code=429)
            self.window[family or ""] += 1
        with self._lock:
            self._ahead[task_id] += 1

    def _admit_ahead(self, task_id: str) -> None:
        """Asynchronous back-pressure (AReaL's admission rule): at most ``(K + 1)·B·G`` train episodes
        admitted and not yet consumed by a step, so rollouts run at most K steps ahead of the trainer
        (the `episodes` and `tasks` policies; see `_SIZED_POLICIES`).
        A group already begun may always complete, or a `tasks` batch could never form."""
        k, batch = self.config.max_staleness, self.config.batch
        if k is None or batch.policy not in _SIZED_POLICIES:
            return
        limit = (k + 1) * batch.batch_size * batch.group_size
        with self._lock:
            ahead = sum(self._ahead.values())
            group_open = 0 < self._ahead[task_id] < batch.group_size
        if ahead < limit or (group_open and batch.policy is not BatchPolicy.EPISODES):
            return
        raise Unavailable(
            f"asynchronous training: {ahead} train episodes are ahead of the trainer and max_staleness "
            f"{k} allows (K+1)·B·G = {limit}; retry after the next step",
            retry_after_s=1.0,
        )

    def set_quotas(self, quotas: FamilyQuotas | None) -> None:
        """New family quotas (a live patch): the window starts over."""
        self.config.quotas = quotas
        self.window.clear()

    # -- the pending index ---------------------------------------------------------------------------------
    def released(self, episode: StoredEpisode, calls: list[CallRecord]) -> None:
        """An episode ended (and is in the pool): index it, give infra failures' quota slots back, wake."""
        if episode.kind is not EpisodeKind.TRAIN or episode.status is EpisodeStatus.PREPARED:
            return  # a prepared member is indexed when its transaction commits (or aborts)
        family = episode.family or ""
        if episode.status is EpisodeStatus.INFRA_FAILURE and self.window[family] > 0:
            self.window[family] -= 1
        with self._lock:
            self._pending[episode.id] = summary(episode)
            if calls:
                self._oldest_version[episode.id] = min(c.policy_version for c in calls)
            if episode.status is EpisodeStatus.INFRA_FAILURE:  # retired, never trained: no longer ahead
                self._less_ahead(episode.task_id)
        self._on_change()

    def _less_ahead(self, task_id: str) -> None:
        self._ahead[task_id] -= 1
        if self._ahead[task_id] <= 0:
            del self._ahead[task_id]

    def select(self) -> Batch | None:
        """The batch the policy releases now, or ``None``."""
        with self._lock:
            pending = list(self._pending.values())
        if not pending:
            return None
        return select_batch(self.config.batch, pending, self.votes)

    def staleness(self, batch: Batch, step: int) -> list[int]:
        """Per trained episode: ``step`` (the policy version being updated) − version of its oldest call."""
        with self._lock:
            return [step - self._oldest_version.get(eid, step) for eid in batch.episode_ids]

    def consumed(self, episode_ids: list[str], step: int) -> None:
        """Mark episodes consumed by the update to policy version ``step`` (pool and index)."""
        self.pool.mark_trained(episode_ids, step)
        with self._lock:
            for eid in episode_ids:
                found = self._pending.pop(eid, None)
                self._oldest_version.pop(eid, None)
                if found is not None and found.status is not EpisodeStatus.INFRA_FAILURE:
                    self._less_ahead(found.task_id)

    def new_window(self) -> None:
        """After an update: the quota window and the votes start over."""
        self.window.clear()
        self.votes.reset()

    # -- votes ---------------------------------------------------------------------------------------------
    def vote(self, client_id: str, ready: bool) -> None:
        self.votes.vote(client_id, ready)
        self._on_change()

    def touch(self, client_id: str) -> None:
        """A sign of life from ``client_id`` (it stays active for the voting policies)."""
        self.votes.touch(client_id)

    def leave(self, client_id: str) -> None:
        """``client_id`` said goodbye: it no longer counts as active (nor its vote); the policy is rechecked."""
        self.votes.forget(client_id)
        self._on_change()

    def recheck_s(self) -> float | None:
        """Seconds between batch checks with no wake-up: the voting policies' liveness makes a batch
        ready by the clock alone (a silent client times out), so they are rechecked every second or
        quarter timeout; the other policies only change on a finish, a vote or a patch."""
        timeout = self.votes.active_timeout_s
        if timeout is None or self.config.batch.policy in _SIZED_POLICIES | {BatchPolicy.INFORMATIVE_TASKS}:
            return None
        return min(1.0, timeout / 4)
