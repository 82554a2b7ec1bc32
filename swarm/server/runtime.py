"""The server runtime: engine, tracker, pool, open episodes, state machine and training loop composed.

Routers call this object. It builds the server's parts and holds them (no module globals, so a test can
build several servers in one process); each part owns its own state: `OpenEpisodes` the open episodes,
`Phase` the state machine, `TrainingLoop` the trainer and the policy step. Everything that touches the
event loop runs on it; blocking torch work runs in the engine's worker thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx

from swarm.config import ServerConfig
from swarm.engine.base import Engine, TokenCallback
from swarm.engine.factory import load_engine
from swarm.errors import EpisodeNotFound, EpisodeStateError, Unavailable
from swarm.pool import Pool, StoredEpisode
from swarm.precision import resolve_mixed_precision
from swarm.protocol import (
    ChatCompletionRequest,
    EpisodeAbort,
    EpisodeCommit,
    EpisodeCounts,
    EpisodeCreate,
    EpisodeCreated,
    EpisodeFinish,
    EpisodePrepare,
    EpisodeStatus,
    EpisodeView,
    StatusView,
)
from swarm.server.chat import ChatResult, PreparedCall, agent_for, record_call, sampling_for
from swarm.server.detokenizer import TokenizerDetokenizer
from swarm.server.episodes import OpenEpisode, OpenEpisodes
from swarm.server.events import EventLog
from swarm.server.phase import Phase
from swarm.server.training import TrainingLoop
from swarm.server.transactions import resolve_stale
from swarm.tracking.merge import build_samples
from swarm.tracking.render import PromptRenderer

T = TypeVar("T")


class SwarmRuntime:
    """All state of one swarm server.

    Args:
        config: server configuration.
        engine: an already built engine (tests inject one to share a model), built with ``config``'s
            ``mixed_precision`` (the trainer computes in it); ``None`` loads ``config.model`` (the
            embedded default when that is ``None``) with `load_engine`.
    """

    def __init__(self, config: ServerConfig, engine: Engine | None = None) -> None:
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
        self.episodes = OpenEpisodes(self.pool, self.events, timeout_s=config.episode_timeout_s)
        training = config.training
        self.phase = Phase(asynchronous=training.enabled and training.max_staleness is not None)
        self.training: TrainingLoop | None = None
        if training.enabled:
            self.training = TrainingLoop(
                training,
                engine=engine,
                pool=self.pool,
                episodes=self.episodes,
                events=self.events,
                phase=self.phase,
                run_dir=run_dir,
                sampling=config.sampling,
                mixed_precision=resolve_mixed_precision(config.mixed_precision, config.device),
            )
        self.events.emit("server.started", f"serving {self.model_name}", model=self.model_name)

    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()
        self.pool.close()
        self.events.close()

    @property
    def step(self) -> int:
        """The policy version being served: the training loop's last completed step (0 without one)."""
        return 0 if self.training is None else self.training.step

    # -- episodes --------------------------------------------------------------------------------------
    def begin(self, body: EpisodeCreate, base_url: str) -> EpisodeCreated:
        """Open an episode and mint its secret key.

        Raises:
            Unavailable: the server is paused, or draining or training in synchronous mode (503 +
                Retry-After); a family quota is full (429) or, asynchronous, the trainer is too far
                behind (503).
        """
        if not self.phase.admits():
            raise Unavailable(
                f"the server is {self.phase.state.value}; no new episodes now", retry_after_s=2.0
            )
        if self.training is not None:
            self.training.admit(body.family, body.kind, body.task_id)
            self.training.touch(body.client_id)
        episode, key = self.episodes.begin(body)
        self.phase.episode_begun()
        return EpisodeCreated(episode_id=episode.id, base_url=base_url, api_key=key, model=self.model_name)

    def episode_for_key(self, key: str) -> OpenEpisode:
        """The open episode a key belongs to (`OpenEpisodes.for_key`; 401 otherwise)."""
        return self.episodes.for_key(key)

    def heartbeat(self, episode_id: str) -> None:
        """Keep an episode from being reclaimed; its client counts as alive for the voting policies."""
        self.episodes.heartbeat(episode_id)
        self.touch_client(self.episodes.require(episode_id).request.client_id)

    def finish(self, episode_id: str, body: EpisodeFinish) -> StoredEpisode:
        """End an episode with its reward (`OpenEpisodes.finish`)."""
        stored = self.episodes.finish(episode_id, body)
        self.touch_client(stored.client_id)
        return stored

    def abort(self, episode_id: str, body: EpisodeAbort) -> StoredEpisode:
        """End an episode without a reward (`OpenEpisodes.abort`)."""
        stored = self.episodes.abort(episode_id, body)
        self.touch_client(stored.client_id)
        return stored

    def prepare(self, episode_id: str, body: EpisodePrepare) -> StoredEpisode:
        """Phase one of a multi-server finish (`OpenEpisodes.prepare`)."""
        stored = self.episodes.prepare(episode_id, body)
        self.touch_client(stored.client_id)
        return stored

    def commit(self, episode_id: str, body: EpisodeCommit) -> StoredEpisode:
        """Phase two of a multi-server finish (`OpenEpisodes.commit`)."""
        stored = self.episodes.commit(episode_id, body.txn_id)
        self.touch_client(stored.client_id)
        return stored

    def touch_client(self, client_id: str) -> None:
        """A sign of life from a client (liveness of the voting policies; nothing without training)."""
        if self.training is not None:
            self.training.touch(client_id)

    def pause(self) -> None:
        self.phase.pause()
        self.events.emit("server.paused", "paused: no new episodes, no training")

    def resume(self) -> None:
        if self.phase.resume():
            self.events.emit("server.resumed", "resumed")
        if self.training is not None:
            self.training.wake()

    def view(self, episode_id: str) -> EpisodeView:
        """The token-level record of an open or ended episode, with its merged samples."""
        open_episode = self.episodes.get(episode_id)
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
        return EpisodeView(episode_id=episode_id, calls=calls, samples=samples, merge=stats, **base)

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
            if episode.id not in self.episodes and not (current is not None and current.cancelling()):
                raise ended from None  # `_end` cancelled the sampling, not our caller
            raise
        finally:
            episode.sampling.discard(generation)
            episode.busy -= 1
            episode.last_seen = time.time()
        if episode.id not in self.episodes:  # ended (or reclaimed) while we sampled: record nothing
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
        counts = EpisodeCounts(**{**stored.model_dump(), "open": len(self.episodes)})
        return StatusView(
            state=self.phase.state,
            step=self.step,
            model=self.model_name,
            episodes=counts,
            clients=dict(self.episodes.clients()),
            uptime_s=time.time() - self.started,
            run_dir=str(self.config.run_dir),
            training_enabled=self.training is not None and self.training.config.enabled,
            active_clients=[] if self.training is None else self.training.votes.active(),
            ready_clients=[] if self.training is None else self.training.votes.ready(),
        )

    async def reclaim_loop(self) -> None:
        """Background task: every ``config.reclaim_period_s`` seconds reclaim idle episodes and resolve
        prepared ones left undecided (`swarm.server.transactions.resolve_stale`)."""
        async with httpx.AsyncClient(timeout=5.0) as http:
            while True:
                await asyncio.sleep(self.config.reclaim_period_s)
                self.episodes.reclaim_idle()
                await resolve_stale(self.episodes, self.pool, http, timeout_s=self.config.prepare_timeout_s)
