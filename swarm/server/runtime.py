"""The server runtime: engine, tracker, pool and open episodes behind one object.

Routers call this object; it owns every piece of mutable server state (no module globals), so a test
can build several servers in one process. Everything that touches the event loop runs on it; blocking
torch work runs in the engine's worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from swarm.config import ServerConfig
from swarm.engine.base import Completion, TokenCallback
from swarm.engine.hf import HFEngine
from swarm.engine.model_loading import load_model, resolve_model
from swarm.errors import AuthError, EpisodeNotFound, EpisodeStateError, Unavailable
from swarm.pool import Pool, StoredEpisode
from swarm.precision import resolve_mixed_precision
from swarm.protocol import (
    ChatCompletionRequest,
    EngineState,
    EpisodeAbort,
    EpisodeCounts,
    EpisodeCreate,
    EpisodeCreated,
    EpisodeFinish,
    EpisodeStatus,
    EpisodeView,
    MergeSummary,
    StatusView,
)
from swarm.server.chat import ChatResult, PreparedCall, agent_for, record_call, sampling_for
from swarm.server.detokenizer import TokenizerDetokenizer
from swarm.server.events import EventLog
from swarm.server.training import TrainingLoop
from swarm.tracking.merge import build_samples
from swarm.tracking.records import CallRecord
from swarm.tracking.render import PromptRenderer

KEY_PREFIX = "sk-swarm-"


def _key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


T = TypeVar("T")


@dataclass
class OpenEpisode:
    """An episode that has begun and not yet ended (kept in memory; written to the pool when it ends)."""

    id: str
    key_digest: str
    request: EpisodeCreate
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


def load_engine(config: ServerConfig) -> HFEngine:
    """Resolve and load ``config.model`` and wrap it in the ``hf`` engine (``AUTO`` precision resolved).

    Raises:
        ModelLoadError: The model cannot be found or loaded.
    """
    source = resolve_model(config.model, cache_dir=config.cache_dir)
    model, tokenizer = load_model(source, dtype=config.weights_dtype, device=config.device)
    return HFEngine(
        model,
        tokenizer,
        source.name,
        max_batch_size=config.max_batch_size,
        batch_window_s=config.batch_window_s,
        mixed_precision=resolve_mixed_precision(config.mixed_precision, config.device),
    )


class SwarmRuntime:
    """All state of one swarm server.

    Args:
        config: server configuration.
        engine: an already built engine (tests inject one to share a model); ``None`` loads
            ``config.model`` (the embedded default when that is ``None``).
    """

    def __init__(self, config: ServerConfig, engine: HFEngine | None = None) -> None:
        self.config = config
        self.started = time.time()
        run_dir = config.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(run_dir / "events.jsonl")
        if config.torch_threads is not None:
            import torch

            torch.set_num_threads(config.torch_threads)
        if engine is None:
            engine = load_engine(config)
            self._owns_engine = True
        else:
            self._owns_engine = False
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = engine.model_name
        self.renderer = PromptRenderer(self.tokenizer)
        self.detokenizer = TokenizerDetokenizer(self.tokenizer)
        self.pool = Pool(run_dir / "pool.db")
        self._tasks: set[asyncio.Task[Any]] = set()
        self.step = 0
        self.state = EngineState.IDLE
        self._episodes: dict[str, OpenEpisode] = {}
        self._by_key: dict[str, str] = {}
        self.training: TrainingLoop | None = None
        if config.training.enabled:
            self.training = TrainingLoop(self, config.training)
        self.events.emit("server.started", f"serving {self.model_name}", model=self.model_name)

    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()
        self.pool.close()
        self.events.close()

    # -- episodes --------------------------------------------------------------------------------------
    def begin(self, body: EpisodeCreate, base_url: str) -> EpisodeCreated:
        """Open an episode and mint its secret key.

        Raises:
            Unavailable: the server is paused, or draining or training in synchronous mode (503 +
                Retry-After).
        """
        closed: tuple[EngineState, ...] = (EngineState.PAUSED, EngineState.DRAINING, EngineState.TRAINING)
        if self.training is not None and self.training.config.max_staleness is not None:
            closed = (EngineState.PAUSED,)  # asynchronous: admitted while a step runs
        if self.state in closed:
            raise Unavailable(f"the server is {self.state.value}; no new episodes now", retry_after_s=2.0)
        if self.training is not None:
            self.training.admit(body.family, body.kind, body.task_id)
            self.training.votes.touch(body.client_id)
        episode_id = "ep-" + uuid.uuid4().hex
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        episode = OpenEpisode(episode_id, _key_digest(key), body, now, now)
        self._episodes[episode_id] = episode
        self._by_key[episode.key_digest] = episode_id
        if self.state is EngineState.IDLE:
            self.state = EngineState.ROLLING
        return EpisodeCreated(episode_id=episode_id, base_url=base_url, api_key=key, model=self.model_name)

    def episode_for_key(self, key: str) -> OpenEpisode:
        """The open episode a key belongs to.

        Raises:
            AuthError: unknown key, or the episode has ended (401).
        """
        episode_id = self._by_key.get(_key_digest(key))
        if episode_id is None:
            raise AuthError("invalid or expired episode API key (the episode may have ended)")
        return self._episodes[episode_id]

    def _open(self, episode_id: str) -> OpenEpisode:
        episode = self._episodes.get(episode_id)
        if episode is not None:
            return episode
        if self.pool.get(episode_id) is not None:
            raise EpisodeStateError(episode_id, f"episode {episode_id} has already ended")
        raise EpisodeNotFound(episode_id)

    def heartbeat(self, episode_id: str) -> None:
        self._open(episode_id).last_seen = time.time()

    def finish(self, episode_id: str, body: EpisodeFinish) -> StoredEpisode:
        """End an episode with its reward; it is committed to the pool before this returns.

        Raises:
            EpisodeStateError: a call of the episode is still being sampled (409; the episode stays
                open: finish it once the answer has arrived, or abort it, which cancels the call).
        """
        episode = self._open(episode_id)
        if episode.busy:
            raise EpisodeStateError(
                episode_id,
                f"episode {episode_id} has {episode.busy} call(s) still being sampled; finish it after "
                "their answers arrive, or abort it (which cancels them)",
            )
        return self._end(
            episode,
            EpisodeStatus.FINISHED,
            reward=body.reward,
            agent_rewards=body.agent_rewards,
            metrics=body.metrics,
        )

    def abort(self, episode_id: str, body: EpisodeAbort) -> StoredEpisode:
        """End an episode without a reward (``infra_failure`` keeps it out of group statistics)."""
        episode = self._open(episode_id)
        status = EpisodeStatus.INFRA_FAILURE if body.infra_failure else EpisodeStatus.ABORTED
        return self._end(episode, status, reason=body.reason)

    def _end(self, episode: OpenEpisode, status: EpisodeStatus, **fields: Any) -> StoredEpisode:
        # Remove the key first: from here on no call can be added to this episode.
        self._by_key.pop(episode.key_digest, None)
        self._episodes.pop(episode.id, None)
        req = episode.request
        stored = StoredEpisode(
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
            **fields,
        )
        try:
            self.pool.add(stored, episode.calls)
        except BaseException:
            # Nothing is lost: the episode stays open and the client may retry finish.
            self._episodes[episode.id] = episode
            self._by_key[episode.key_digest] = episode.id
            raise
        for generation in episode.sampling:  # its calls can no longer be recorded: stop sampling them
            generation.cancel()
        if self.training is not None:
            self.training.released(stored, episode.calls)
        self.events.emit(
            f"episode.{status.value}",
            f"episode {episode.id} {status.value} (task {req.task_id}, {len(episode.calls)} calls)",
            episode_id=episode.id,
            task_id=req.task_id,
            client_id=req.client_id,
            reward=stored.reward,
        )
        return stored

    def open_count(self) -> int:
        return len(self._episodes)

    def abort_open(self, reason: str) -> list[str]:
        """Abort every open episode as an infrastructure failure (drain timeout); returns their ids."""
        ended = list(self._episodes.values())
        for episode in ended:
            self._end(episode, EpisodeStatus.INFRA_FAILURE, reason=reason)
        return [e.id for e in ended]

    def abort_older_than(self, version: int, reason: str) -> list[str]:
        """Abort, as infrastructure failures, open episodes with a call sampled before policy ``version``."""
        stale = [
            e for e in self._episodes.values() if e.calls and min(c.policy_version for c in e.calls) < version
        ]
        for episode in stale:
            self._end(episode, EpisodeStatus.INFRA_FAILURE, reason=reason)
        return [e.id for e in stale]

    def pause(self) -> None:
        self.state = EngineState.PAUSED
        self.events.emit("server.paused", "paused: no new episodes, no training")

    def resume(self) -> None:
        if self.state is EngineState.PAUSED:
            self.state = EngineState.ROLLING
            self.events.emit("server.resumed", "resumed")
        if self.training is not None:
            self.training.wake()

    def reclaim_idle(self, now: float | None = None) -> list[str]:
        """Abort, as infrastructure failures, open episodes idle longer than ``episode_timeout_s``."""
        now = time.time() if now is None else now
        stale = [
            e
            for e in self._episodes.values()
            if e.busy == 0 and now - e.last_seen > self.config.episode_timeout_s
        ]
        for episode in stale:
            self._end(
                episode,
                EpisodeStatus.INFRA_FAILURE,
                reason=f"reclaimed: no call or heartbeat for {self.config.episode_timeout_s:g} s",
            )
        return [e.id for e in stale]

    def view(self, episode_id: str) -> EpisodeView:
        """The token-level record of an open or ended episode, with its merged samples."""
        open_episode = self._episodes.get(episode_id)
        if open_episode is not None:
            req = open_episode.request
            calls = list(open_episode.calls)
            base: dict[str, Any] = {
                "task_id": req.task_id,
                "client_id": req.client_id,
                "kind": req.kind,
                "family": req.family,
                "status": EpisodeStatus.OPEN,
                "created_at": open_episode.created_at,
            }
        else:
            found = self.pool.get(episode_id)
            if found is None:
                raise EpisodeNotFound(episode_id)
            stored, calls = found
            base = {
                "task_id": stored.task_id,
                "client_id": stored.client_id,
                "kind": stored.kind,
                "family": stored.family,
                "status": stored.status,
                "reward": stored.reward,
                "agent_rewards": stored.agent_rewards,
                "metrics": stored.metrics,
                "reason": stored.reason,
                "created_at": stored.created_at,
                "finished_at": stored.finished_at,
                "trained_step": stored.trained_step,
            }
        samples, stats = build_samples(episode_id, calls)
        merge = MergeSummary(
            calls=stats.calls,
            samples=stats.samples,
            merge_ratio=stats.merge_ratio,
            prefix_breaks=dict(stats.prefix_breaks),
            splices=stats.splices,
            splice_mismatches=stats.splice_mismatches,
            tokens_saved=stats.tokens_saved,
        )
        return EpisodeView(episode_id=episode_id, calls=calls, samples=samples, merge=merge, **base)

    # -- chat completions ------------------------------------------------------------------------------
    def prepare_chat(self, episode: OpenEpisode, request: ChatCompletionRequest) -> PreparedCall:
        """Check and render one chat request of an open episode (nothing sampled or recorded yet).

        Raises:
            RequestError: unknown model, unrenderable messages, or a prompt that does not fit (400/404).
        """
        arrived = time.time()
        agent = agent_for(request, self.model_name)
        params = sampling_for(request, self.config.sampling)
        rendered = self.renderer.render(request.messages, request.tools, history=episode.calls, agent=agent)
        self.engine.check_prompt(rendered.prompt_ids)
        parse_tools = bool(request.tools) and request.tool_choice != "none"
        return PreparedCall(
            arrived=arrived, agent=agent, params=params, rendered=rendered, parse_tools=parse_tools
        )

    async def chat(
        self,
        episode: OpenEpisode,
        request: ChatCompletionRequest,
        *,
        prepared: PreparedCall | None = None,
        on_token: TokenCallback | None = None,
    ) -> ChatResult:
        """Render, sample and record one chat request of an open episode.

        Args:
            prepared: `prepare_chat`'s result, when the caller checked the request before (a streaming
                response must fail with an HTTP error before its first byte).
            on_token: sees every token as it is sampled, on the engine's thread (`Engine.generate`).

        Returns:
            The call records (one per choice, appended to the episode) and the engine's completions.

        Raises:
            RequestError: unknown model, unrenderable messages, or a prompt that does not fit (400/404).
            EpisodeStateError: the episode ended while the call was sampled (nothing is recorded).
        """
        if prepared is None:
            prepared = self.prepare_chat(episode, request)
        prompt_ids = prepared.rendered.prompt_ids
        episode.busy += 1
        episode.last_seen = prepared.arrived
        ended = EpisodeStateError(episode.id, f"episode {episode.id} ended while this call was running")
        queued = time.time()
        generation = asyncio.ensure_future(self.engine.generate(prompt_ids, prepared.params, on_token))
        episode.sampling.add(generation)
        try:
            completions = await generation
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if episode.id not in self._episodes and not (current is not None and current.cancelling()):
                raise ended from None  # `_end` cancelled the sampling, not our caller
            raise
        finally:
            episode.sampling.discard(generation)
            episode.busy -= 1
            episode.last_seen = time.time()
        if episode.id not in self._episodes:  # ended (or reclaimed) while we sampled: record nothing
            raise ended
        first = len(episode.calls)
        records = [
            record_call(
                prepared,
                completion,
                index=first + i,
                trainable=episode.is_trainable(prepared.agent),
                salt=f"{episode.id}:{first + i}",
                queued=queued,
            )
            for i, completion in enumerate(completions)
        ]
        episode.calls.extend(records)
        return ChatResult(
            records=records,
            completions=completions,
            prompt_tokens=len(prompt_ids),
            agent=prepared.agent,
            policy_version=self.step,
            created_at=time.time(),
        )

    def spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` as a task the runtime holds until it ends (e.g. a streamed call's recording,
        which must finish even when its client has gone)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Its outcome may have no reader left (a client that went away): retrieve it, so asyncio does
        # not report an exception nobody retrieved.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    # -- status ----------------------------------------------------------------------------------------
    def status(self) -> StatusView:
        stored = self.pool.counts()
        counts = EpisodeCounts(**{**stored.model_dump(), "open": len(self._episodes)})
        clients = Counter(e.request.client_id for e in self._episodes.values())
        return StatusView(
            state=self.state,
            step=self.step,
            model=self.model_name,
            episodes=counts,
            clients=dict(clients),
            uptime_s=time.time() - self.started,
            run_dir=str(self.config.run_dir),
            training_enabled=self.training is not None and self.training.config.enabled,
        )

    async def reclaim_loop(self) -> None:
        """Background task: reclaim idle episodes every ``config.reclaim_period_s`` seconds."""
        while True:
            await asyncio.sleep(self.config.reclaim_period_s)
            self.reclaim_idle()
