"""The open-episode table: begin and end, keys, idle reclaim, bulk aborts and the on-end callback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.errors import AuthError, EpisodeNotFound, EpisodeStateError
from swarm.pool import Pool, StoredEpisode
from swarm.protocol import EpisodeAbort, EpisodeCreate, EpisodeFinish, EpisodePrepare, EpisodeStatus
from swarm.server.episodes import KEY_PREFIX, OpenEpisodes
from swarm.server.events import EventLog
from swarm.tracking.records import CallRecord, FinishReason


@pytest.fixture()
def episodes(tmp_path: Path) -> Iterator[OpenEpisodes]:
    pool = Pool(tmp_path / "pool.db")
    yield OpenEpisodes(pool, EventLog(None), timeout_s=60.0)
    pool.close()


def call(policy_version: int, index: int = 0) -> CallRecord:
    return CallRecord(
        index=index,
        prompt_ids=[1, 2],
        completion_ids=[3],
        logprobs=[-0.5],
        finish_reason=FinishReason.STOP,
        policy_version=policy_version,
    )


def test_begin_mints_a_key_that_finds_the_episode_until_it_ends(episodes: OpenEpisodes) -> None:
    ended: list[tuple[StoredEpisode, int]] = []
    episodes.on_end(lambda stored, calls: ended.append((stored, len(calls))))
    episode, key = episodes.begin(EpisodeCreate(task_id="t", client_id="c"))
    assert key.startswith(KEY_PREFIX) and episode.key_digest not in key
    assert episodes.for_key(key) is episode and episode.id in episodes and len(episodes) == 1
    assert episodes.clients() == {"c": 1}
    episode.calls.append(call(0))

    stored = episodes.finish(episode.id, EpisodeFinish(reward=1.0))

    assert stored.status is EpisodeStatus.FINISHED and stored.reward == 1.0
    assert ended == [(stored, 1)]  # the callback saw it once, with its calls
    assert episode.id not in episodes and len(episodes) == 0
    assert episodes.pool.get(episode.id) is not None  # committed before finish returned
    with pytest.raises(AuthError):
        episodes.for_key(key)
    with pytest.raises(EpisodeStateError, match="already ended"):
        episodes.abort(episode.id, EpisodeAbort())
    with pytest.raises(EpisodeNotFound):
        episodes.heartbeat("ep-unknown")


def test_an_episode_with_a_call_in_flight_cannot_finish_but_can_abort(episodes: OpenEpisodes) -> None:
    episode, _ = episodes.begin(EpisodeCreate(task_id="t"))
    episode.busy = 1
    with pytest.raises(EpisodeStateError, match="still being sampled"):
        episodes.finish(episode.id, EpisodeFinish(reward=0.0))
    assert episode.id in episodes
    stored = episodes.abort(episode.id, EpisodeAbort(infra_failure=True, reason="gone"))
    assert stored.status is EpisodeStatus.INFRA_FAILURE and stored.reason == "gone"


def test_idle_episodes_are_reclaimed_unless_busy_or_recently_seen(episodes: OpenEpisodes) -> None:
    idle, _ = episodes.begin(EpisodeCreate(task_id="idle"))
    busy, _ = episodes.begin(EpisodeCreate(task_id="busy"))
    fresh, _ = episodes.begin(EpisodeCreate(task_id="fresh"))
    busy.busy = 1
    later = idle.last_seen + 61.0
    fresh.last_seen = later - 1.0
    ended: list[str] = []
    episodes.on_end(lambda stored, _calls: ended.append(stored.id))

    assert episodes.reclaim_idle(now=later) == [idle.id]

    assert ended == [idle.id] and busy.id in episodes and fresh.id in episodes
    stored, _ = episodes.pool.get(idle.id) or (None, None)
    assert stored is not None and stored.status is EpisodeStatus.INFRA_FAILURE
    assert "reclaimed" in (stored.reason or "")


def test_abort_older_than_ends_episodes_with_a_call_before_the_version(episodes: OpenEpisodes) -> None:
    old, _ = episodes.begin(EpisodeCreate(task_id="old"))
    new, _ = episodes.begin(EpisodeCreate(task_id="new"))
    empty, _ = episodes.begin(EpisodeCreate(task_id="empty"))
    old.calls += [call(1), call(3, index=1)]
    new.calls.append(call(2))

    assert episodes.abort_older_than(2, "too stale") == [old.id]
    assert new.id in episodes and empty.id in episodes  # an episode without calls is never stale

    assert sorted(episodes.abort_open("drain timeout")) == sorted([new.id, empty.id])
    assert len(episodes) == 0
    stored, _ = episodes.pool.get(new.id) or (None, None)
    assert stored is not None and stored.status is EpisodeStatus.INFRA_FAILURE
    assert stored.reason == "drain timeout"


def test_listeners_run_in_subscription_order(episodes: OpenEpisodes) -> None:
    seen: list[str] = []
    episodes.on_end(lambda stored, _calls: seen.append("first"))
    episodes.on_end(lambda stored, _calls: seen.append("second"))
    episode, _ = episodes.begin(EpisodeCreate(task_id="t"))
    episodes.abort(episode.id, EpisodeAbort())
    assert seen == ["first", "second"]


def test_prepare_then_commit_or_abort_is_a_compare_and_set(episodes: OpenEpisodes) -> None:
    """The two phases of a multi-server finish: prepared is stored but out of training until resolved,
    each resolution happens once, retries answer the same, and another transaction cannot touch it."""
    ended: list[EpisodeStatus] = []
    episodes.on_end(lambda stored, calls: ended.append(stored.status))
    first, _ = episodes.begin(EpisodeCreate(task_id="t"))
    second, _ = episodes.begin(EpisodeCreate(task_id="t"))
    first.calls.append(call(0))
    body = EpisodePrepare(reward=0.5, txn_id="txn-1")
    assert episodes.prepare(first.id, body).status is EpisodeStatus.PREPARED
    assert episodes.prepare(first.id, body).status is EpisodeStatus.PREPARED  # a retried prepare
    assert episodes.pool.pending() == [] and episodes.pool.counts().prepared == 1
    with pytest.raises(EpisodeStateError, match="not part of transaction"):
        episodes.commit(first.id, "txn-other")
    committed = episodes.commit(first.id, "txn-1")
    assert (committed.status, committed.reward) == (EpisodeStatus.FINISHED, 0.5)
    assert episodes.commit(first.id, "txn-1").status is EpisodeStatus.FINISHED  # a retried commit
    assert [e.id for e in episodes.pool.pending()] == [first.id]
    with pytest.raises(EpisodeStateError, match="already ended"):  # too late to abort it
        episodes.abort(first.id, EpisodeAbort(infra_failure=True))

    episodes.prepare(
        second.id,
        EpisodePrepare(reward=1.0, txn_id="txn-2", primary_url="http://a", primary_episode_id="ep-a"),
    )
    assert episodes.abort(second.id, EpisodeAbort(infra_failure=True)).status is EpisodeStatus.INFRA_FAILURE
    with pytest.raises(EpisodeStateError, match="infra_failure in transaction"):  # a late commit loses
        episodes.commit(second.id, "txn-2")
    assert ended == [
        EpisodeStatus.PREPARED,
        EpisodeStatus.FINISHED,
        EpisodeStatus.PREPARED,
        EpisodeStatus.INFRA_FAILURE,
    ]


def test_a_pool_written_before_transactions_gains_the_column(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE episodes (id TEXT PRIMARY KEY, task_id TEXT NOT NULL, client_id TEXT NOT NULL, family TEXT,"
        " kind TEXT NOT NULL, status TEXT NOT NULL, reward REAL, agent_rewards TEXT NOT NULL DEFAULT '{}',"
        " metrics TEXT NOT NULL DEFAULT '{}', metadata TEXT NOT NULL DEFAULT '{}', trainable_agents TEXT,"
        " reason TEXT, created_at REAL NOT NULL, finished_at REAL NOT NULL, seq INTEGER NOT NULL,"
        " trained_step INTEGER);"
        "INSERT INTO episodes VALUES ('ep-old', 't', 'c', NULL, 'train', 'finished', 1.0, '{}', '{}', '{}',"
        " NULL, NULL, 0, 0, 1, NULL);"
    )
    old.commit()
    old.close()
    pool = Pool(path)
    try:
        (stored,) = pool.pending()
        assert stored.id == "ep-old" and stored.txn is None
    finally:
        pool.close()
