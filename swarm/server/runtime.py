"""The server runtime: engine, pool, open episodes, state machine, limits and training loop composed, and
the services the routes depend on.

It builds the server's parts and holds them (no module globals, so a test can build several servers in
one process); each part owns its own state: `OpenEpisodes` the open episodes and their calls, `Phase` the
state machine, `ClientLimits` the limits and request rates, `TrainingLoop` the trainer and the policy
step. Routes never see this object: each depends on one service built here (`swarm.server.deps`):
`EpisodeService`, `ChatService` or `ControlService`. Everything that touches the event loop runs on it;
blocking torch work runs in the engine's worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from swarm.config import ServerConfig
from swarm.engine.base import Engine
from swarm.engine.factory import load_engine
from swarm.engine.model_loading import resolve_model
from swarm.pool import Pool
from swarm.precision import resolve_mixed_precision
from swarm.protocol import EpisodeView, StatusView
from swarm.server.auth import Credentials, is_loopback
from swarm.server.chat_service import ChatService
from swarm.server.control import ControlService
from swarm.server.episode_service import EpisodeService
from swarm.server.episodes import OpenEpisode, OpenEpisodes
from swarm.server.events import EventLog
from swarm.server.limits import ClientLimits, context_cap
from swarm.server.phase import Phase
from swarm.server.pool_writer import PoolWriter
from swarm.server.teacher import TeacherClient, TeacherSettings, check_teacher
from swarm.server.tenants import TenantRegistry, check_tenants_on_disk
from swarm.server.training import TrainingLoop
from swarm.server.transactions import resolve_stale

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

    Raises:
        TenantsOnDisk: the run dir holds tenants this server cannot resume (`check_tenants_on_disk`);
            nothing in it was changed.
    """

    def __init__(
        self, config: ServerConfig, engine: Engine | None = None, *, owns_engine: bool | None = None
    ) -> None:
        check_tenants_on_disk(config)  # before anything in it is touched
        self.config = config
        self.started = time.time()
        run_dir = config.run_dir
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private (`swarm.server.run_dir_lock`)
        self.events = EventLog(run_dir / "events.jsonl")
        if config.torch_threads is not None:
            import torch

            torch.set_num_threads(config.torch_threads)
        self._owns_engine = engine is None if owns_engine is None else owns_engine
        if engine is None:
            engine = load_engine(config)
        self.engine = engine
        self.model_name = engine.model_name
        self.pool = Pool(run_dir / "pool.db")
        self.writer = PoolWriter(self.pool)
        self.episodes = OpenEpisodes(
            self.pool, self.events, timeout_s=config.episode_timeout_s, writer=self.writer
        )
        training = config.training
        self.phase = Phase(asynchronous=training.enabled and training.max_staleness is not None)
        self.training: TrainingLoop | None = None
        """The one policy's training loop (``None``: inference mode, or tenants over a frozen base)."""
        if training.enabled and not config.tenants:
            teacher = self._teacher(config, engine)
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
                teacher=teacher,
            )
        self.tenants: TenantRegistry | None = None
        """The LoRA tenants (``swarm serve --tenants N``), each with its own training loop."""
        if config.tenants:
            self.tenants = TenantRegistry(
                config,
                engine=engine,
                pool=self.pool,
                episodes=self.episodes,
                events=self.events,
                mixed_precision=resolve_mixed_precision(config.mixed_precision, config.device),
            )
        self.credentials = Credentials(config.admin_token, config.client_tokens)
        self.limits = ClientLimits(
            context_cap(config.limits, config.request_tokens_share, engine.max_context)
        )
        """The limits in force and the per-token request rates (replaced live by the control routes)."""
        self.chat = ChatService(engine, self.episodes, self.limits, config.sampling, lambda: self.step)
        self.episode_service = EpisodeService(
            episodes=self.episodes,
            pool=self.pool,
            phase=self.phase,
            limits=self.limits,
            credentials=self.credentials,
            training=self.training,
            model_name=self.model_name,
            public_url=config.public_url,
            merge=config.training.merge,
            detokenizer=self.chat.detokenizer,
            tenants=self.tenants,
        )
        self.control = ControlService(
            config=config,
            model_name=self.model_name,
            episodes=self.episodes,
            pool=self.pool,
            phase=self.phase,
            limits=self.limits,
            credentials=self.credentials,
            events=self.events,
            training_loop=self.training,
            policy_version=lambda: self.step,
            started=self.started,
            tenants=self.tenants,
        )
        self.events.emit("server.started", f"serving {self.model_name}", model=self.model_name)
        for warning in self.exposure_warnings():
            log.warning(warning)
            self.events.emit("server.exposed", warning, level="warning")

    def _teacher(self, config: ServerConfig, engine: Engine) -> TeacherClient | None:
        """The distillation teacher's client, its tokenizer checked (``None`` without ``--teacher``).

        Raises:
            TeacherMismatch: the teacher has another tokenizer.
            TeacherError: the teacher cannot be reached or refuses the credential.
        """
        distill = config.training.distill
        if distill is None:
            return None
        settings = TeacherSettings(
            url=distill.teacher_url,
            token=config.teacher_token,
            timeout_s=distill.timeout_s,
            attempts=distill.attempts,
        )
        info = check_teacher(settings, engine.tokenizer)
        self.events.emit(
            "teacher.connected",
            f"distilling ({distill.mode}) from {info.model} at {settings.url} ({info.kind} teacher)",
            model=info.model,
            teacher_kind=info.kind,
            mode=distill.mode,
        )
        return TeacherClient(settings, engine.tokenizer, info)

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

    def interrupt_training(self) -> None:
        """The server is stopping: a training step under way (the main loop's, every tenant's) gives up
        before its first update where its trainer can (`TrainerBackend.interrupt`: the torch trainer, at
        its next micro-batch), so a stop does not wait for a whole step; its episodes stay pooled."""
        if self.training is not None:
            self.training.interrupt()
        if self.tenants is not None:
            self.tenants.interrupt_steps()

    def close(self) -> None:
        """Close the engine (when owned), then the trainer (`TrainerBackend.close`), the pool writer, the pool
        and the event log. The engine goes first: it receives the trainer's weights (vLLM: CUDA IPC or a
        broadcast from verl's actor) and closes gracefully, while the trainer's close kills its actors,
        which waits on no peer."""
        if self._owns_engine:
            self.engine.close()
            self.events.emit("engine.closed", f"{self.config.engine} engine closed")
        # the trainer's close is bounded (verl: its Ray actors, and a local Ray it started); the torch
        # trainer holds nothing outside this process and logs nothing
        if self.training is not None and (closed := self.training.trainer.close()) is not None:
            self.events.emit(
                "trainer.closed", closed.message, "info" if closed.complete else "warning", **closed.data
            )
        self.writer.close()  # commits every finish still queued before the pool closes
        self.pool.close()
        self.events.close()

    @property
    def step(self) -> int:
        """The policy version being served: the training loop's last completed step (0 without one)."""
        return 0 if self.training is None else self.training.step

    # -- for tests and tools (routes use the services) ----------------------------------------------------
    def status(self) -> StatusView:
        """`ControlService.status`."""
        return self.control.status()

    def episode_for_key(self, key: str) -> OpenEpisode:
        """The open episode a key belongs to (`OpenEpisodes.for_key`; 403 otherwise)."""
        return self.episodes.for_key(key)

    def view(self, episode_id: str) -> EpisodeView:
        """`EpisodeService.view`."""
        return self.episode_service.view(episode_id)

    async def reclaim_loop(self) -> None:
        """Background task: every ``config.reclaim_period_s`` seconds reclaim idle episodes and resolve
        prepared ones left undecided (`swarm.server.transactions.resolve_stale`)."""
        async with httpx.AsyncClient(timeout=5.0) as http:
            while True:
                await asyncio.sleep(self.config.reclaim_period_s)
                self.episodes.reclaim_idle()
                await resolve_stale(self.episodes, self.pool, http, timeout_s=self.config.prepare_timeout_s)
