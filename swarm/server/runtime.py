"""The server runtime: engine, tracker, pool, open episodes, state machine and training loop composed.

Routers call this object. It builds the server's parts and holds them (no module globals, so a test can
build several servers in one process); each part owns its own state: `OpenEpisodes` the open episodes,
`Phase` the state machine, `TrainingLoop` the trainer and the policy step. Everything that touches the
event loop runs on it; blocking torch work runs in the engine's worker thread.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx
from pydantic import ValidationError

from swarm.config import ServerConfig
from swarm.engine.base import Engine, TokenCallback
from swarm.engine.factory import load_engine
from swarm.engine.model_loading import resolve_model
from swarm.errors import EpisodeNotFound, EpisodeStateError, RequestError, Unavailable
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
    Limits,
    LimitsPatch,
    StatusView,
)
from swarm.server.auth import Credentials, Owner, is_loopback
from swarm.server.chat import ChatResult, PreparedCall, agent_for, record_call, sampling_for
from swarm.server.detokenizer import TokenizerDetokenizer
from swarm.server.episodes import OpenEpisode, OpenEpisodes
from swarm.server.events import EventLog
from swarm.server.limits import RequestRates, check_chat_request
from swarm.server.phase import Phase
from swarm.server.pool_writer import PoolWriter
from swarm.server.training import TrainingLoop
from swarm.server.transactions import resolve_stale
from swarm.tracking.merge import build_samples
from swarm.tracking.render import PromptRenderer

T = TypeVar("T")

log = logging.getLogger(__name__)


class SwarmRuntime:
    """All state of one swarm server.

    Args:
        config: server configuration.
        engine: an already built engine (tests inject one to share a model), built with ``config``'s
            ``mixed_precision`` (the trainer computes in it); ``None`` loads ``config.model`` (the
            embedded default when that is ``None``) with `load_engine`.
        owns_engine: whether `close` closes ``engine`` (default: only the one it loaded itself).
            ``swarm serve`` loads its engine before the app and hands it over: uvicorn ends the process
            with the SIGTERM it caught right after the app's shutdown, so the app's shutdown is the last
            place that can stop a vLLM engine-core process.
    """

    def __init__(
        self, config: ServerConfig, engine: Engine | None = None, *, owns_engine: bool | None = None
    ) -> None:
        self.config = config
        self.started = time.time()
        run_dir = config.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(run_dir / "events.jsonl")
        if config.torch_threads is not None:
            import torch

            torch.set_num_threads(config.torch_threads)
        self._owns_engine = engine is None if owns_engine is None else owns_engine
        if engine is None:
            engine = load_engine(config)
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = engine.model_name
        self.renderer = PromptRenderer(self.tokenizer)
        self.detokenizer = TokenizerDetokenizer(self.tokenizer)
        self.pool = Pool(run_dir / "pool.db")
        self._tasks: set[asyncio.Task[Any]] = set()
        self.writer = PoolWriter(self.pool)
        self.episodes = OpenEpisodes(
            self.pool, self.events, timeout_s=config.episode_timeout_s, writer=self.writer
        )
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
                model_dir=(
                    resolve_model(config.model, cache_dir=config.cache_dir).directory
                    if training.backend == "verl"
                    else None
                ),
            )
        self.credentials = Credentials(config.admin_token, config.client_tokens)
        self.limits: Limits = config.limits
        """The limits in force (replaced whole by :meth:`set_limits`)."""
        self.rates = RequestRates()
        self.base_urls: dict[tuple[Any, ...], str] = {}
        """OpenAI base URLs handed out at begin, by the request parts they are built from (a memo)."""
        self.events.emit("server.started", f"serving {self.model_name}", model=self.model_name)
        for warning in self.exposure_warnings():
            log.warning(warning)
            self.events.emit("server.exposed", warning, level="warning")

    def exposure_warnings(self) -> list[str]:
        """What anyone who can reach this server may do without a credential, when it listens beyond
        loopback (empty on loopback, or with both kinds of token configured)."""
        if is_loopback(self.config.host):
            return []
        out = []
        if not self.credentials.required:
            out.append(
                f"listening on {self.config.host} without client tokens: anyone who reaches this server may "
                "begin episodes and finish, abort or read them by id (start it with --client-token or "
                "--client-tokens-file)"
            )
        if self.config.admin_token is None:
            out.append(
                f"listening on {self.config.host} without an admin token: control routes answer loopback "
                "peers only (set --admin-token or SWARM_ADMIN_TOKEN to reach them from elsewhere)"
            )
        return out

    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()
            self.events.emit("engine.closed", f"{self.config.engine} engine closed")
        self.writer.close()  # commits every finish still queued before the pool closes
        self.pool.close()
        self.events.close()

    @property
    def step(self) -> int:
        """The policy version being served: the training loop's last completed step (0 without one)."""
        return 0 if self.training is None else self.training.step

    # -- episodes --------------------------------------------------------------------------------------
    def begin(self, body: EpisodeCreate, base_url: str, owner: Owner | None = None) -> EpisodeCreated:
        """Open an episode and mint its secret key.

        Args:
            body: what the client asked for.
            base_url: the OpenAI base URL handed back to the agent.
            owner: who is beginning it (`swarm.server.auth.Credentials.begin`; ``None``: nobody known).

        Raises:
            Unavailable: 429 + Retry-After when the owner's client token is over its open-episode or
                request-rate limit.
            Unavailable: the server is paused, or draining or training in synchronous mode (503 +
                Retry-After); a family quota is full (429) or, asynchronous, the trainer is too far
                behind (503).
        """
        name = owner.name if owner is not None and owner.name != "admin" else None
        if name is not None:
            self._check_open(name)
            self.rates.take(name, self.limits.requests_per_s_per_token)
        if not self.phase.admits():
            raise Unavailable(
                f"the server is {self.phase.state.value}; no new episodes now", retry_after_s=2.0
            )
        if self.training is not None:
            self.training.admit(body.family, body.kind, body.task_id)
            self.training.touch(body.client_id)
        episode, key = self.episodes.begin(body, None if owner is None else owner.name)
        self.phase.episode_begun()
        return EpisodeCreated(episode_id=episode.id, base_url=base_url, api_key=key, model=self.model_name)

    def _check_open(self, name: str) -> None:
        cap = self.limits.open_episodes_per_token
        if cap is not None and self.episodes.open_by(name) >= cap:
            raise Unavailable(
                f"client token {name!r} has {cap} episodes open, its limit; finish or abort one first",
                retry_after_s=1.0,
                status_code=429,
            )

    def episode_credentials(self, episode_id: str) -> tuple[str | None, str | None]:
        """(SHA-256 digest of its episode key, name of the client token that began it) of an open or
        ended episode.

        Raises:
            EpisodeNotFound: no such episode (404).
        """
        episode = self.episodes.get(episode_id)
        if episode is not None:
            return episode.key_digest, episode.owner
        found = self.pool.episodes([episode_id]).get(episode_id)
        if found is None:
            raise EpisodeNotFound(episode_id)
        return found.key_digest, found.owner

    def set_limits(self, patch: LimitsPatch) -> dict[str, object]:
        """Apply a live change of the limits at once; returns the fields changed.

        Raises:
            RequestError: a value is invalid (422 naming it).
        """
        self.limits = self.checked_limits(patch)
        changed = patch.model_dump(exclude_unset=True)
        self.events.emit("limits.changed", f"limits changed: {changed}", changed=changed)
        return changed

    def checked_limits(self, patch: LimitsPatch) -> Limits:
        """The limits ``patch`` would set (nothing changes).

        Raises:
            RequestError: a value is invalid (422 naming it).
        """
        try:
            return patch.applied_to(self.limits)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise RequestError(
                f"invalid config change: limits.{where}: {first['msg']}", status_code=422, param="limits"
            ) from None
        except ValueError as exc:
            raise RequestError(f"invalid config change: {exc}", status_code=422, param="limits") from None

    def add_client_token(self, name: str, token: str | None) -> str:
        """Add a client token live (`Credentials.add`); returns the secret (minted when ``token`` is None)."""
        secret = self.credentials.add(name, token)
        self.events.emit("client_token.added", f"client token {name!r} added", name=name)
        return secret

    def revoke_client_token(self, name: str) -> int:
        """Revoke a client token live (`Credentials.revoke`); returns how many episodes it has open."""
        self.credentials.revoke(name)
        self.rates.forget(name)
        still_open = self.episodes.open_by(name)
        self.events.emit(
            "client_token.revoked", f"client token {name!r} revoked", name=name, open_episodes=still_open
        )
        return still_open

    def episode_for_key(self, key: str) -> OpenEpisode:
        """The open episode a key belongs to (`OpenEpisodes.for_key`; 401 otherwise)."""
        return self.episodes.for_key(key)

    def heartbeat(self, episode_id: str) -> None:
        """Keep an episode from being reclaimed; its client counts as alive for the voting policies."""
        self.episodes.heartbeat(episode_id)
        self.touch_client(self.episodes.require(episode_id).request.client_id)

    async def finish(self, episode_id: str, body: EpisodeFinish) -> StoredEpisode:
        """End an episode with its reward; returns once it is committed to the pool
        (`OpenEpisodes.finish_committed`: the commit runs on the pool writer's thread)."""
        stored = await self.episodes.finish_committed(episode_id, body)
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

    def transaction_status(self, episode_id: str, txn_id: str) -> EpisodeStatus:
        """How a member of multi-server transaction ``txn_id`` stands, for the other members' servers.

        The transaction id (random, known only to the client and the members' servers) is the
        credential: a stored episode answers only when it was prepared with that id (compared in
        constant time), and only its status. An episode still open answers ``open`` (not prepared yet).

        Raises:
            EpisodeNotFound: no such episode, or not one prepared in ``txn_id`` (404).
        """
        if episode_id in self.episodes:
            return EpisodeStatus.OPEN
        found = self.pool.get(episode_id)
        stored = None if found is None else found[0]
        ours = str((stored.txn or {}).get("txn_id", "")) if stored is not None else ""
        if stored is None or not ours or not hmac.compare_digest(ours.encode(), txn_id.encode()):
            raise EpisodeNotFound(episode_id)
        return stored.status

    def view(self, episode_id: str) -> EpisodeView:
        """The token-level record of an open or ended episode, with its merged samples."""
        open_episode = self.episodes.get(episode_id) or self.episodes.ending(episode_id)
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
        samples, stats = build_samples(
            episode_id, calls, merge=self.config.training.merge, decode=self.detokenizer.decode
        )
        return EpisodeView(episode_id=episode_id, calls=calls, samples=samples, merge=stats, **base)

    # -- chat completions ------------------------------------------------------------------------------
    def _admit_call(self, episode: OpenEpisode, request: ChatCompletionRequest) -> None:
        """The request caps and the owner's request rate, checked before any rendering.

        Raises:
            RequestError: a field over its cap (422).
            Unavailable: the owner's client token is over its request rate (429 + Retry-After).
        """
        check_chat_request(self.limits, request)
        if episode.owner is not None and episode.owner != "admin":
            self.rates.take(episode.owner, self.limits.requests_per_s_per_token)

    def count_prompt_tokens(self, episode: OpenEpisode, request: ChatCompletionRequest) -> int:
        """The prompt length ``request`` would have as the episode's next call: rendered and spliced as
        `prepare_chat` does, under the same caps and request rate; nothing is sampled or recorded.

        Raises:
            RequestError: unknown model, unrenderable messages (400/404) or a field over its cap (422).
            Unavailable: the owner's client token is over its request rate (429 + Retry-After).
        """
        self._admit_call(episode, request)
        agent = agent_for(request, self.model_name)
        rendered = self.renderer.render(request.messages, request.tools, history=episode.calls, agent=agent)
        return len(rendered.prompt_ids)

    def prepare_chat(self, episode: OpenEpisode, request: ChatCompletionRequest) -> PreparedCall:
        """Check and render one chat request of an open episode (nothing sampled or recorded yet).

        Raises:
            RequestError: unknown model, unrenderable messages, or a prompt that does not fit (400/404).
        """
        arrived = time.time()
        self._admit_call(episode, request)
        agent = agent_for(request, self.model_name)
        defaults, cap = self.config.sampling, self.limits.max_tokens
        if cap is not None and defaults.max_tokens > cap:  # a request that leaves max_tokens out gets the cap
            defaults = defaults.model_copy(update={"max_tokens": cap})
        params = sampling_for(request, defaults)
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
        handed = time.perf_counter()
        generation = asyncio.ensure_future(self.engine.generate(prompt_ids, prepared.params, on_token))
        episode.sampling.add(generation)
        try:
            completions = await generation
            engine_s = time.perf_counter() - handed
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
            arrived=prepared.arrived,
            engine_s=engine_s,
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
