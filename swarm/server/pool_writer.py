"""`PoolWriter`: ended episodes committed to the pool on a thread of their own, acknowledged once durable.

Why: a finish's pool commit (SQLite ``BEGIN``/``INSERT``/``COMMIT``, the call records' JSON) was the
largest single share of the server's event-loop CPU per episode (``bench/server_cpu.py --profile``), and
on a GPU host that thread also runs the inference engine's front end. The writer takes the commit off
the loop: the finish coroutine queues the episode and awaits its commit, so the loop serves other
requests meanwhile, and a burst of finishes (episodes of equal length end in the same engine step) is
committed in one transaction.

What stays as before: a finish is answered only after its episode is committed (the await returns when
the transaction holding it has committed, WAL + ``synchronous=NORMAL`` as every pool write), so an
acknowledged finish survives a crash of the server. A commit that fails is reported to its own finish
only (a failed group is retried one episode at a time). :meth:`PoolWriter.close` commits everything
queued before it returns (the server's shutdown calls it before closing the pool).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Sequence

from swarm.pool import Pool, StoredEpisode
from swarm.tracking.records import CallRecord

_Item = tuple[StoredEpisode, Sequence[CallRecord], "concurrent.futures.Future[StoredEpisode]"]


class PoolWriter:
    """Commits ended episodes to ``pool`` on a writer thread, in the order they are submitted.

    Args:
        pool: the pool to commit to (thread-safe; other writes keep using it directly).
        max_group: most episodes committed in one transaction.
    """

    def __init__(self, pool: Pool, *, max_group: int = 256) -> None:
        self.pool = pool
        self.max_group = max_group
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="swarm-pool-writer", daemon=True)
        self._thread.start()

    def submit(
        self, episode: StoredEpisode, calls: Sequence[CallRecord]
    ) -> concurrent.futures.Future[StoredEpisode]:
        """Queue ``episode`` and its calls; the future resolves to it (``seq`` set) once committed, or to
        the exception its commit raised (``sqlite3.IntegrityError`` for an id already stored).

        Raises:
            RuntimeError: the writer is closed.
        """
        future: concurrent.futures.Future[StoredEpisode] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool writer is closed")
            self._queue.put((episode, calls, future))
        return future

    def close(self) -> None:
        """Commit everything queued, then stop the thread (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            group = [item]
            stop = False
            while len(group) < self.max_group:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                group.append(more)
            self._commit(group)
            if stop:
                return

    def _commit(self, group: list[_Item]) -> None:
        live = [item for item in group if item[2].set_running_or_notify_cancel()]
        try:
            self.pool.add_many([(episode, calls) for episode, calls, _ in live])
        except BaseException:
            for episode, calls, future in live:  # find the one(s) at fault: commit each on its own
                try:
                    future.set_result(self.pool.add(episode, calls))
                except BaseException as exc:  # reported to that finish only
                    future.set_exception(exc)
            return
        for episode, _, future in live:
            future.set_result(episode)
