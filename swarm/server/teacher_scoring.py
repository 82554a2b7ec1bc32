"""Teacher scoring off the critical path: every ended train episode is scored by the teacher in the
background as it arrives, so a step waits only for what is not scored yet (docs/ARCHITECTURE.md
§On-policy distillation).

`TeacherScorer` subscribes to the open episodes' on-end callback. For an ended train episode (finished or
aborted: infra failures never train) it scores each trainable call that has no teacher logprobs yet:
``prompt_ids + completion_ids`` from ``start = len(prompt_ids)``, at most ``concurrency`` requests in
flight to the teacher (which batches concurrent requests itself: the ``hf`` engine per request, vLLM
continuously), each retried by `swarm.server.teacher.TeacherClient`. An episode is scored when every
trainable call is: its logprobs are written into its pooled call records in one transaction
(`swarm.pool.Pool.set_teacher_logprobs`), so a restarted server does not score it again.

An episode the teacher could not score (after the client's retries) is *unscored*: the step that
selected it leaves it out (it is not consumed and stays in the pool, never trained with a made-up
value), ``distill/unscored_episodes`` counts it, and it is scored again when a batch asks for it once
``retry_after_s`` has passed since it failed, or as soon as the teacher has answered another request
since (the teacher is back: a newer episode it scored meanwhile does not train ahead of it), so it
trains with the first step after the teacher is back that selects it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence

from swarm.config import DistillConfig
from swarm.pool import Pool, StoredEpisode
from swarm.protocol import DistillStatus, EpisodeKind, EpisodeStatus
from swarm.server.events import EventLog
from swarm.server.teacher import TeacherClient, TeacherError
from swarm.tracking.records import CallRecord

__all__ = ["TeacherScorer"]

log = logging.getLogger(__name__)


class TeacherScorer:
    """Scores ended episodes with the teacher in the background; :meth:`ready` is what a step awaits.

    Args:
        client: the teacher's client (its start-up check already passed).
        pool: where the episodes' calls are read and their teacher logprobs written.
        events: ``distill.unscored`` is logged there.
        config: concurrency and retry settings (read live).
        on_scored: called on the loop when an episode has been scored (the training loop's wake-up).
    """

    def __init__(
        self,
        client: TeacherClient,
        pool: Pool,
        events: EventLog,
        config: DistillConfig,
        on_scored: Callable[[], None],
    ) -> None:
        self.client = client
        self.pool = pool
        self.events = events
        self.config = config
        self._on_scored = on_scored
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._tasks: dict[str, asyncio.Task[bool]] = {}
        self._failed_at: dict[str, float] = {}
        self._answered_at: float | None = None  # monotonic time of the teacher's latest answer
        self._latencies: list[float] = []
        self.last_failure_at: float | None = None
        """Wall-clock time (``time.time()``) of the latest scoring failure (``None``: none yet)."""
        self.last_answer_at: float | None = None
        """Wall-clock time of the teacher's latest answer (``None``: none yet)."""

    def start(self) -> None:
        """Bind to the running loop (the training loop's task calls it before anything is scored)."""
        self._loop = asyncio.get_running_loop()
        self._slots = asyncio.Semaphore(self.config.concurrency)

    async def aclose(self) -> None:
        """Cancel the scoring in flight and close the client."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self.client.aclose()

    # -- feeding ---------------------------------------------------------------------------------------------
    def released(self, episode: StoredEpisode, calls: list[CallRecord]) -> None:
        """On-end listener: start scoring an ended train episode that can train (thread-safe)."""
        if episode.kind is not EpisodeKind.TRAIN or episode.status not in (
            EpisodeStatus.FINISHED,
            EpisodeStatus.ABORTED,
        ):
            return
        if self._loop is None:
            return  # not started yet: `ready` submits it when a batch asks
        self._loop.call_soon_threadsafe(self._submit, episode.id, list(calls))

    def _submit(self, episode_id: str, calls: list[CallRecord] | None) -> None:
        task = self._tasks.get(episode_id)
        if task is not None and (not task.done() or _scored(task)):
            return  # in flight, or scored
        self._failed_at.pop(episode_id, None)
        self._tasks[episode_id] = asyncio.get_running_loop().create_task(
            self._score_episode(episode_id, calls)
        )

    # -- what a step awaits ----------------------------------------------------------------------------------
    async def ready(self, episode_ids: Sequence[str], wait_s: float) -> set[str]:
        """Wait up to ``wait_s`` for ``episode_ids`` to be scored; returns those still unscored.

        Episodes never seen (pooled before a restart) are submitted now. A failed one is submitted again
        (at most once per call) once ``retry_after_s`` has passed since it failed, or once the teacher has
        answered a request since it failed; both are checked again whenever a scoring ends during the
        wait, so a batch whose newer episode the teacher scores also retries the older unscored one.
        """
        deadline = time.monotonic() + wait_s
        retried: set[str] = set()
        while True:
            self._submit_due(episode_ids, retried)
            waiting = [self._tasks[eid] for eid in episode_ids if not self._tasks[eid].done()]
            left = deadline - time.monotonic()
            if not waiting or left <= 0:
                break
            await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        return {eid for eid in episode_ids if not _scored(self._tasks[eid])}

    def _submit_due(self, episode_ids: Sequence[str], retried: set[str]) -> None:
        """Submit the episodes of ``episode_ids`` never seen, and the failed ones (not in ``retried``,
        which gains them) whose retry is due."""
        now = time.monotonic()
        for eid in episode_ids:
            task = self._tasks.get(eid)
            if task is None:
                self._submit(eid, None)
            elif task.done() and not _scored(task) and eid not in retried:
                failed_at = self._failed_at.get(eid)
                if failed_at is None or self._retry_due(failed_at, now):  # None: the task raised (a bug)
                    retried.add(eid)
                    self._submit(eid, None)

    def _retry_due(self, failed_at: float, now: float) -> bool:
        """Whether an episode that failed at ``failed_at`` may be scored again: ``retry_after_s`` has
        passed, or the teacher answered a request since (it is back)."""
        answered_since = self._answered_at is not None and self._answered_at > failed_at
        return answered_since or now - failed_at >= self.config.retry_after_s

    def recheck_s(self) -> float | None:
        """Seconds until an unscored episode may be scored again (``None``: none failed)."""
        if not self._failed_at:
            return None
        oldest = min(self._failed_at.values())
        return max(0.05, self.config.retry_after_s - (time.monotonic() - oldest))

    def forget(self, episode_ids: Collection[str]) -> None:
        """Drop the state of consumed episodes (they will not be asked for again)."""
        for eid in episode_ids:
            self._tasks.pop(eid, None)
            self._failed_at.pop(eid, None)

    def status(self) -> DistillStatus:
        """What ``GET /api/v1/status`` shows of the scoring (callable from any thread)."""
        tasks = list(self._tasks.values())
        failed, answered = self.last_failure_at, self.last_answer_at
        return DistillStatus(
            unscored_episodes=sum(1 for t in tasks if t.done() and not _scored(t)),
            scoring_episodes=sum(1 for t in tasks if not t.done()),
            teacher_ok=failed is None or (answered is not None and answered > failed),
            last_failure_at=failed,
            last_answer_at=answered,
        )

    def take_latency(self) -> float:
        """Mean seconds of the scoring requests answered since the last call (0.0 when none)."""
        latencies, self._latencies = self._latencies, []
        return sum(latencies) / len(latencies) if latencies else 0.0

    # -- scoring ---------------------------------------------------------------------------------------------
    async def _score_episode(self, episode_id: str, calls: list[CallRecord] | None) -> bool:
        """Score an episode's unscored trainable calls; ``False`` (reported, counted) on any failure."""
        try:
            if calls is None:
                calls = (await asyncio.to_thread(self.pool.calls, [episode_id]))[episode_id]
            todo = [c for c in calls if c.trainable and c.teacher_logprobs is None]
            results = await asyncio.gather(*(self._score_call(c) for c in todo), return_exceptions=True)
            scored = {c.index: r for c, r in zip(todo, results, strict=True) if isinstance(r, list)}
            if scored:  # kept even when another call failed: a retry scores only what is missing
                await asyncio.to_thread(self.pool.set_teacher_logprobs, episode_id, scored)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported and counted, never swallowed
            self._unscored(episode_id, f"its scoring failed ({_reason(exc)})")
            return False
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            if any(isinstance(e, asyncio.CancelledError) for e in errors):
                raise asyncio.CancelledError
            self._unscored(
                episode_id,
                f"the teacher could not score {len(errors)} of {len(todo)} calls ({_reason(errors[0])})",
            )
            return False
        self._on_scored()
        return True

    def _unscored(self, episode_id: str, why: str) -> None:
        """Report (``distill.unscored`` event and a warning log line) an episode left unscored; it is
        counted in ``distill/unscored_episodes`` by the step that selected it and retried later."""
        self._failed_at[episode_id] = time.monotonic()
        self.last_failure_at = time.time()
        message = f"episode {episode_id}: {why}; it is kept out of training until it is scored"
        log.warning("distill.unscored: %s", message)
        self.events.emit("distill.unscored", message, level="warning", episode_id=episode_id)

    async def _score_call(self, call: CallRecord) -> list[float]:
        if not call.completion_ids:
            return []
        assert self._slots is not None
        async with self._slots:
            logprobs, seconds = await self.client.score(
                [*call.prompt_ids, *call.completion_ids], len(call.prompt_ids)
            )
        self._answered_at = time.monotonic()
        self.last_answer_at = time.time()
        self._latencies.append(seconds)
        return logprobs


def _reason(exc: BaseException) -> str:
    """One line naming a scoring failure: a `TeacherError`'s message, else the exception's type and text."""
    return str(exc) if isinstance(exc, TeacherError) else f"{type(exc).__name__}: {exc}"


def _scored(task: asyncio.Task[bool]) -> bool:
    """Whether a scoring task ended with its episode scored."""
    return task.done() and not task.cancelled() and task.exception() is None and task.result()
