"""`PoolWriter` and `OpenEpisodes.finish_committed`: a finish is answered only once its episode is
committed; a burst is committed together; a failed commit leaves the episode open; close commits all."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.errors import AuthError, EpisodeStateError
from swarm.pool import Pool, StoredEpisode
from swarm.protocol import EpisodeCreate, EpisodeFinish, EpisodeKind, EpisodeStatus
from swarm.server.episodes import OpenEpisodes
from swarm.server.events import EventLog
from swarm.server.pool_writer import PoolWriter
from swarm.tracking.records import CallRecord, FinishReason


@pytest.fixture()
def pool(tmp_path: Path) -> Iterator[Pool]:
    pool = Pool(tmp_path / "pool.db")
    yield pool
    pool.close()


def stored(episode_id: str) -> StoredEpisode:
    return StoredEpisode(
        id=episode_id,
        task_id="t",
        client_id="c",
        kind=EpisodeKind.TRAIN,
        status=EpisodeStatus.FINISHED,
        created_at=1.0,
        finished_at=2.0,
        reward=0.5,
    )


def call(index: int) -> CallRecord:
    return CallRecord(
        index=index, prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.5], finish_reason=FinishReason.STOP
    )


def test_a_burst_is_committed_in_order_and_a_bad_episode_fails_alone(pool: Pool) -> None:
    """Episodes queued while the writer waits are committed in submission order (``seq``); one whose id is
    already stored fails its own future only, and the others of its group are stored."""
    pool.add(stored("ep-dup"), [])
    writer = PoolWriter(pool)
    with pool._lock:  # the writer waits for the pool: everything below queues up behind it
        futures = [writer.submit(stored(f"ep-{i}"), [call(0), call(1)]) for i in range(5)]
        futures.insert(2, writer.submit(stored("ep-dup"), []))
        futures += [writer.submit(stored(f"ep-{i}"), []) for i in range(5, 8)]
        assert not any(f.done() for f in futures)
    writer.close()
    with pytest.raises(sqlite3.IntegrityError):
        futures[2].result()
    committed = [f.result() for i, f in enumerate(futures) if i != 2]
    assert [e.id for e in committed] == [f"ep-{i}" for i in range(8)]
    assert [e.seq for e in committed] == list(range(2, 10))  # ep-dup took 1
    found = pool.get("ep-3")
    assert found is not None and [c.index for c in found[1]] == [0, 1]
    assert pool.counts().finished == 9


def test_close_commits_everything_queued_and_refuses_more(pool: Pool) -> None:
    writer = PoolWriter(pool)
    with pool._lock:
        futures = [writer.submit(stored(f"ep-{i}"), [call(0)]) for i in range(20)]
    writer.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert pool.counts().finished == 20
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(stored("ep-late"), [])
    writer.close()  # idempotent


def test_finish_is_answered_once_committed_and_the_episode_is_closed_meanwhile(pool: Pool) -> None:
    """While the commit waits, the episode's key is dead, it still counts as open, a second finish is
    refused (409); the finish returns only after the pool holds it, and the listeners run once."""
    writer = PoolWriter(pool)
    episodes = OpenEpisodes(pool, EventLog(None), timeout_s=60.0, writer=writer)
    ended: list[str] = []
    episodes.on_end(lambda s, _calls: ended.append(s.id))
    episode, key = episodes.begin(EpisodeCreate(task_id="t", client_id="c"))
    episode.calls.append(call(0))

    async def run() -> StoredEpisode:
        with pool._lock:  # hold the commit back
            finishing = asyncio.ensure_future(
                episodes.finish_committed(episode.id, EpisodeFinish(reward=1.0))
            )
            await asyncio.sleep(0.05)
            assert not finishing.done() and pool._seq == 0
            assert len(episodes) == 1 and episodes.ending(episode.id) is episode and ended == []
            with pytest.raises(AuthError):
                episodes.for_key(key)
            with pytest.raises(EpisodeStateError, match="already ended"):
                await episodes.finish_committed(episode.id, EpisodeFinish(reward=0.0))
        return await finishing

    result = asyncio.run(run())
    writer.close()
    assert result.status is EpisodeStatus.FINISHED and result.reward == 1.0 and result.seq == 1
    assert ended == [episode.id] and len(episodes) == 0 and episodes.ending(episode.id) is None
    found = pool.get(episode.id)
    assert found is not None and found[0].reward == 1.0 and len(found[1]) == 1


def test_a_failed_commit_leaves_the_episode_open_for_a_retry(pool: Pool, tmp_path: Path) -> None:
    """The commit raises (another writer already stored this id): the finish raises it, the episode and
    its key are back, and nothing was announced."""
    writer = PoolWriter(pool)
    episodes = OpenEpisodes(pool, EventLog(None), timeout_s=60.0, writer=writer)
    ended: list[str] = []
    episodes.on_end(lambda s, _calls: ended.append(s.id))
    episode, key = episodes.begin(EpisodeCreate(task_id="t"))
    pool.add(stored(episode.id), [])  # the id is taken: this episode's commit must fail

    with pytest.raises(sqlite3.IntegrityError):
        asyncio.run(episodes.finish_committed(episode.id, EpisodeFinish(reward=1.0)))
    writer.close()
    assert episodes.for_key(key) is episode and len(episodes) == 1 and ended == []
    assert episodes.ending(episode.id) is None
