"""The open episodes of one server: their secret keys, begin/end, a call's bookkeeping, idle reclaim and
bulk aborts.

`OpenEpisodes` is the one owner of the open-episode table, of every open episode's state (its calls, the
calls in flight, when it was last seen) and of the key table (SHA-256 digests of the
episode keys; a key itself is never stored). Ending an episode commits it to the pool, cancels its
calls still being sampled, tells every on-end listener (the training loop indexes it) and logs an
``episode.<status>`` event. Everything here runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from swarm.engine.base import Completion
from swarm.errors import AuthError, EpisodeNotFound, EpisodeStateError
from swarm.pool import Pool, StoredEpisode
from swarm.protocol import EpisodeAbort, EpisodeCreate, EpisodeFinish, EpisodePrepare, EpisodeStatus
from swarm.server.events import EventLog
from swarm.server.pool_writer import PoolWriter
from swarm.tracking.records import CallRecord

KEY_PREFIX = "sk-swarm-"
"""Prefix of every episode key (control routes refuse bearer tokens that carry it)."""

EndListener = Callable[[StoredEpisode, list[CallRecord]], None]
"""Called with an ended episode (already in the pool) and its calls."""


def _key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _outcome(body: EpisodeFinish | EpisodePrepare) -> dict[str, Any]:
    """The stored fields a finish or a prepare reports: the reward, per-agent rewards and metrics."""
    return {"reward": body.reward, "agent_rewards": body.agent_rewards, "metrics": body.metrics}


def _ended_while_called(episode: OpenEpisode) -> EpisodeStateError:
    return EpisodeStateError(episode.id, f"episode {episode.id} ended while this call was running")


@dataclass
class OpenEpisode:
    """An episode that has begun and not yet ended (kept in memory; written to the pool when it ends)."""

    id: str
    key_digest: str
    request: EpisodeCreate
    owner: str | None
    """Name of the client token that began it (``None``: none was needed); never the token."""
    created_at: float
    last_seen: float
    calls: list[CallRecord] = field(default_factory=list)
    busy: int = 0
    """Chat requests of this episode in flight (an episode is never reclaimed while one runs)."""
    sampling: set[asyncio.Task[list[Completion]]] = field(default_factory=set)
    """Engine requests in flight; cancelled when the episode ends (the engine stops their rows)."""

    def is_trainable(self, agent: str) -> bool:
        agents = self.request.trainable_agents
        return agents is None or agent in agents


class OpenEpisodes:
    """The open-episode table of one server.

    Args:
        pool: where ended episodes are committed.
        events: the server's event log (``episode.finished``/``aborted``/``infra_failure``).
        timeout_s: an episode with no call in flight and no call or heartbeat for this long is
            reclaimed by :meth:`reclaim_idle` (seconds).
    """

    def __init__(
        self, pool: Pool, events: EventLog, *, timeout_s: float, writer: PoolWriter | None = None
    ) -> None:
        self.pool = pool
        self.events = events
        self.timeout_s = timeout_s
        self.writer = writer
        self._open: dict[str, OpenEpisode] = {}
        self._ending: dict[str, OpenEpisode] = {}
        """Episodes `finish_committed` has closed whose commit is under way (still counted as open)."""
        self._by_key: dict[str, str] = {}
        self._by_owner: Counter[str] = Counter()
        self._listeners: list[EndListener] = []

    _tenant: str | None = None
    """The LoRA tenant this object is the partition of (:meth:`partition`); ``None``: every episode."""

    def partition(self, tenant: str) -> OpenEpisodes:
        """The episodes of LoRA tenant ``tenant``, sharing this table: its :meth:`on_end` listeners hear
        only the tenant's episodes, and ``len``, :meth:`abort_open` and :meth:`abort_older_than` count
        and abort only them (a tenant's training loop drains its own episodes, not the server's)."""
        view = copy.copy(self)
        view._tenant = tenant
        return view

    def _mine(self, episodes: Iterable[OpenEpisode]) -> list[OpenEpisode]:
        if self._tenant is None:
            return list(episodes)
        return [e for e in episodes if e.request.tenant == self._tenant]

    def on_end(self, listener: EndListener) -> None:
        """Call ``listener`` after every episode ends (once it is in the pool), in subscription order
        (a partition's listener: after every episode of its tenant)."""
        tenant = self._tenant
        if tenant is None:
            self._listeners.append(listener)
            return

        def theirs(stored: StoredEpisode, calls: list[CallRecord]) -> None:
            if stored.tenant == tenant:
                listener(stored, calls)

        self._listeners.append(theirs)

    # -- lookup ------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Open episodes, counting those whose finish is being committed (a drain waits for them)."""
        if self._tenant is not None:
            return len(self._mine(self._open.values())) + len(self._mine(self._ending.values()))
        return len(self._open) + len(self._ending)

    def __contains__(self, episode_id: object) -> bool:
        return episode_id in self._open

    def __iter__(self) -> Iterator[OpenEpisode]:
        return iter(list(self._open.values()))

    def get(self, episode_id: str) -> OpenEpisode | None:
        """The open episode ``episode_id``, or ``None`` when it is not open."""
        return self._open.get(episode_id)

    def ending(self, episode_id: str) -> OpenEpisode | None:
        """The episode ``episode_id`` while its finish is being committed (`finish_committed`), else
        ``None``."""
        return self._ending.get(episode_id)

    def for_key(self, key: str) -> OpenEpisode:
        """The open episode a key belongs to.

        Raises:
            AuthError: unknown key, or the episode has ended: a wrong credential (403, as on the episode
                routes; a missing one is the caller's 401).
        """
        episode_id = self._by_key.get(_key_digest(key))
        if episode_id is None:
            raise AuthError(
                "invalid or expired episode API key (the episode may have ended): send the api_key of an "
                "open episode (from POST /api/v1/episodes)",
                status_code=403,
            )
        return self._open[episode_id]

    def require(self, episode_id: str) -> OpenEpisode:
        """The open episode ``episode_id``.

        Raises:
            EpisodeStateError: it has already ended (409).
            EpisodeNotFound: no such episode (404).
        """
        episode = self._open.get(episode_id)
        if episode is not None:
            return episode
        if episode_id in self._ending or self.pool.get(episode_id) is not None:
            raise EpisodeStateError(episode_id, f"episode {episode_id} has already ended")
        raise EpisodeNotFound(episode_id)

    def open_by(self, owner: str) -> int:
        """Episodes the client token named ``owner`` has open."""
        return self._by_owner[owner]

    def clients(self) -> Counter[str]:
        """Open episodes per client id."""
        return Counter(e.request.client_id for e in self._open.values())

    # -- begin and end -----------------------------------------------------------------------------------
    def begin(self, request: EpisodeCreate, owner: str | None = None) -> tuple[OpenEpisode, str]:
        """Open an episode (admission is the caller's) and mint its secret key.

        Args:
            request: what the client asked for.
            owner: name of the client token that began it (``None``: none).

        Returns:
            The episode and its key (``sk-swarm-…``; only its digest is kept).
        """
        random = os.urandom(48)  # one system call for both (as `uuid.uuid4` and `secrets.token_urlsafe`)
        key = KEY_PREFIX + base64.urlsafe_b64encode(random[16:]).rstrip(b"=").decode("ascii")
        episode_id = "ep-" + uuid.UUID(bytes=random[:16], version=4).hex
        now = time.time()
        episode = OpenEpisode(episode_id, _key_digest(key), request, owner, now, now)
        self._open[episode.id] = episode
        self._by_key[episode.key_digest] = episode.id
        if owner is not None:
            self._by_owner[owner] += 1
        return episode, key

    def heartbeat(self, episode_id: str) -> None:
        """Keep an episode from being reclaimed as idle (raises like :meth:`require`)."""
        self.require(episode_id).last_seen = time.time()

    # -- a call's bookkeeping ------------------------------------------------------------------------------
    async def sample(
        self, episode: OpenEpisode, arrived: float, work: Coroutine[Any, Any, list[Completion]]
    ) -> list[Completion]:
        """Run one call's sampling (``work``, e.g. ``engine.generate(...)``) as part of ``episode``: while
        it runs the episode counts it as busy (never finished, 409, nor reclaimed) and holds its task in
        ``sampling``, which ending the episode cancels; ``last_seen`` is ``arrived`` meanwhile and the end
        of the call after.

        Raises:
            EpisodeStateError: the episode ended while the call was sampled (409).
            asyncio.CancelledError: the caller was cancelled (the engine request is aborted).
        """
        episode.busy += 1
        episode.last_seen = arrived
        generation = asyncio.ensure_future(work)
        episode.sampling.add(generation)
        try:
            return await generation
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if episode.id not in self._open and not (current is not None and current.cancelling()):
                raise _ended_while_called(episode) from None  # ending cancelled it, not our caller
            raise
        finally:
            episode.sampling.discard(generation)
            episode.busy -= 1
            episode.last_seen = time.time()

    def record(self, episode: OpenEpisode, build: Callable[[int], list[CallRecord]]) -> list[CallRecord]:
        """Append a sampled call's records to ``episode``: ``build(first)`` makes them, ``first`` being the
        index the first one takes in the episode.

        Raises:
            EpisodeStateError: the episode ended (or was reclaimed) meanwhile: nothing is recorded (409).
        """
        if episode.id not in self._open:
            raise _ended_while_called(episode)
        records = build(len(episode.calls))
        episode.calls.extend(records)
        return records

    def finish(self, episode_id: str, body: EpisodeFinish) -> StoredEpisode:
        """End an episode with its reward; it is committed to the pool before this returns.

        Raises:
            EpisodeStateError: it has ended, or a call of it is still being sampled (409; the episode
                stays open: finish it once the answer has arrived, or abort it, which cancels the call).
            EpisodeNotFound: no such episode (404).
        """
        episode = self.require(episode_id)
        self._check_idle(episode)
        return self.end(episode, EpisodeStatus.FINISHED, **_outcome(body))

    async def finish_committed(self, episode_id: str, body: EpisodeFinish) -> StoredEpisode:
        """As :meth:`finish`, with the pool commit on the `PoolWriter` thread (when there is one): the
        event loop serves other requests meanwhile, and this returns once the episode is committed.

        While the commit runs the episode counts as open (``len``), its key no longer works and a second
        finish, an abort or a heartbeat of it is refused (409, "already ended"). If the commit fails the
        episode is open again (a finish may be retried) and the commit's exception is raised. Cancelling
        the caller does not cancel the commit: the episode is then stored all the same.

        Raises:
            EpisodeStateError: as :meth:`finish` (409).
            EpisodeNotFound: no such episode (404).
        """
        if self.writer is None:
            return self.finish(episode_id, body)
        episode = self.require(episode_id)
        self._check_idle(episode)
        stored = self._detach(episode, EpisodeStatus.FINISHED, **_outcome(body))
        try:
            done = asyncio.wrap_future(self.writer.submit(stored, episode.calls))
        except BaseException:
            self._reattach(episode)
            raise
        self._ending[episode.id] = episode

        def settle(commit: asyncio.Future[StoredEpisode]) -> None:
            # runs on the loop before the awaiting coroutine resumes, in commit order
            self._ending.pop(episode.id, None)
            if commit.cancelled() or commit.exception() is not None:
                self._reattach(episode)
            else:
                self._ended(stored, episode)

        done.add_done_callback(settle)
        return await asyncio.shield(done)

    def prepare(self, episode_id: str, body: EpisodePrepare) -> StoredEpisode:
        """Phase one of a multi-server finish: end the episode as ``prepared`` with its reward and
        transaction (committed to the pool; not trainable until `commit`). Preparing again with the same
        transaction is answered with the stored episode (a retried request).

        Raises:
            EpisodeStateError: ended otherwise, or a call of it is still being sampled (409).
            EpisodeNotFound: no such episode (404).
        """
        if episode_id not in self._open:
            found = self.pool.get(episode_id)
            if found is not None and (found[0].txn or {}).get("txn_id") == body.txn_id:
                return found[0]
        episode = self.require(episode_id)
        self._check_idle(episode)
        txn = {
            "txn_id": body.txn_id,
            "primary_url": body.primary_url,
            "primary_episode_id": body.primary_episode_id,
        }
        return self.end(episode, EpisodeStatus.PREPARED, **_outcome(body), txn=txn)

    def commit(self, episode_id: str, txn_id: str) -> StoredEpisode:
        """Phase two: a ``prepared`` episode of ``txn_id`` becomes ``finished`` (idempotent: committing a
        finished one of the same transaction answers it again).

        Raises:
            EpisodeStateError: not prepared in this transaction, or the transaction was aborted here (409).
            EpisodeNotFound: no such episode (404).
        """
        return self._resolve(episode_id, txn_id, EpisodeStatus.FINISHED, None)

    def abort(self, episode_id: str, body: EpisodeAbort) -> StoredEpisode:
        """End an episode without a reward (``infra_failure`` keeps it out of group statistics). A
        ``prepared`` episode is aborted too (its transaction then never commits here).

        Raises:
            EpisodeStateError: it has already ended (409).
            EpisodeNotFound: no such episode (404).
        """
        status = EpisodeStatus.INFRA_FAILURE if body.infra_failure else EpisodeStatus.ABORTED
        if episode_id not in self._open:
            found = self.pool.get(episode_id)
            if found is not None and found[0].status is EpisodeStatus.PREPARED and found[0].txn:
                return self._resolve(episode_id, found[0].txn["txn_id"], status, body.reason)
        episode = self.require(episode_id)
        return self.end(episode, status, reason=body.reason)

    def _resolve(
        self, episode_id: str, txn_id: str, status: EpisodeStatus, reason: str | None
    ) -> StoredEpisode:
        """Move a prepared episode to ``status`` (compare-and-set in the pool), then tell the listeners."""
        if episode_id in self._open:
            raise EpisodeStateError(episode_id, f"episode {episode_id} is open, not prepared")
        found = self.pool.get(episode_id)
        if found is None:
            raise EpisodeNotFound(episode_id)
        stored, calls = found
        if (stored.txn or {}).get("txn_id") != txn_id:
            raise EpisodeStateError(episode_id, f"episode {episode_id} is not part of transaction {txn_id}")
        if stored.status is EpisodeStatus.PREPARED:
            stored = self.pool.resolve_prepared(episode_id, txn_id, status, reason) or stored
            if stored.status is status:
                self._announce(stored, calls)
                return stored
        if stored.status is not status:
            raise EpisodeStateError(
                episode_id,
                f"episode {episode_id} is {stored.status.value} in transaction {txn_id}"
                + (f" ({stored.reason})" if stored.reason else ""),
            )
        return stored  # already resolved this way: a retried request

    @staticmethod
    def _check_idle(episode: OpenEpisode) -> None:
        if episode.busy:
            raise EpisodeStateError(
                episode.id,
                f"episode {episode.id} has {episode.busy} call(s) still being sampled; finish it after "
                "their answers arrive, or abort it (which cancels them)",
            )

    def end(self, episode: OpenEpisode, status: EpisodeStatus, **fields: Any) -> StoredEpisode:
        """Close ``episode``: commit it to the pool with ``status`` and ``fields`` (reward, reason…),
        cancel its calls in flight, notify the on-end listeners and log the event.

        Raises:
            Exception: whatever the pool raises; the episode then stays open (a finish may be retried).
        """
        stored = self._detach(episode, status, **fields)
        try:
            self.pool.add(stored, episode.calls)
        except BaseException:
            self._reattach(episode)  # nothing is lost: the client may retry finish
            raise
        self._ended(stored, episode)
        return stored

    def _detach(self, episode: OpenEpisode, status: EpisodeStatus, **fields: Any) -> StoredEpisode:
        """Take ``episode`` out of the tables (its key stops working at once: no call can be added to it
        from here on) and build its stored form."""
        self._by_key.pop(episode.key_digest, None)
        self._open.pop(episode.id, None)
        self._owned(episode, -1)
        req = episode.request
        return StoredEpisode(
            id=episode.id,
            task_id=req.task_id,
            client_id=req.client_id,
            family=req.family,
            kind=req.kind,
            status=status,
            created_at=episode.created_at,
            finished_at=time.time(),
            metadata=req.metadata,
            trainable_agents=req.trainable_agents,
            owner=episode.owner,
            key_digest=episode.key_digest,
            tenant=req.tenant,
            **fields,
        )

    def _reattach(self, episode: OpenEpisode) -> None:
        """Put a detached episode back (its commit failed)."""
        self._open[episode.id] = episode
        self._by_key[episode.key_digest] = episode.id
        self._owned(episode, +1)

    def _ended(self, stored: StoredEpisode, episode: OpenEpisode) -> None:
        """After the commit: stop sampling its calls in flight (they can no longer be recorded), tell the
        listeners and log the event."""
        for generation in episode.sampling:
            generation.cancel()
        self._announce(stored, episode.calls)

    def _announce(self, stored: StoredEpisode, calls: list[CallRecord]) -> None:
        """Tell the on-end listeners and log ``episode.<status>``."""
        for listener in self._listeners:
            listener(stored, calls)
        self.events.emit(
            f"episode.{stored.status.value}",
            f"episode {stored.id} {stored.status.value} (task {stored.task_id}, {len(calls)} calls)",
            episode_id=stored.id,
            task_id=stored.task_id,
            client_id=stored.client_id,
            reward=stored.reward,
            tenant=stored.tenant,
        )

    def _owned(self, episode: OpenEpisode, delta: int) -> None:
        if episode.owner is not None:
            self._by_owner[episode.owner] += delta
            if self._by_owner[episode.owner] <= 0:
                del self._by_owner[episode.owner]

    # -- bulk aborts -------------------------------------------------------------------------------------
    def _abort_all(self, episodes: list[OpenEpisode], reason: str) -> list[str]:
        for episode in episodes:
            self.end(episode, EpisodeStatus.INFRA_FAILURE, reason=reason)
        return [e.id for e in episodes]

    def abort_open(self, reason: str) -> list[str]:
        """Abort every open episode as an infrastructure failure (drain timeout); returns their ids."""
        return self._abort_all(self._mine(self._open.values()), reason)

    def abort_older_than(self, version: int, reason: str) -> list[str]:
        """Abort, as infrastructure failures, open episodes with a call sampled before policy ``version``;
        returns their ids."""
        stale = [
            e
            for e in self._mine(self._open.values())
            if e.calls and min(c.policy_version for c in e.calls) < version
        ]
        return self._abort_all(stale, reason)

    def reclaim_idle(self, now: float | None = None) -> list[str]:
        """Abort, as infrastructure failures, episodes with no call in flight and no call or heartbeat
        for longer than ``timeout_s``; returns their ids.

        Args:
            now: Unix time to measure idleness against (default: the current time).
        """
        now = time.time() if now is None else now
        idle = [e for e in self._open.values() if e.busy == 0 and now - e.last_seen > self.timeout_s]
        return self._abort_all(idle, f"reclaimed: no call or heartbeat for {self.timeout_s:g} s")
