"""LoRA tenants: several policies, each a LoRA adapter, over one frozen base model in one server.

``swarm serve --tenants N --lora-rank R`` hosts up to N tenants (docs/ARCHITECTURE.md §LoRA tenants). The
admin creates, lists, pauses, resumes and retires them over the control API (`swarm.server.tenant_routes`).
A tenant is a one-policy training run in miniature, built from the same parts as the server's own
`TrainingLoop`, each of them its own:

- its adapter, named by its id, in the one peft model over the base (`swarm.train.adapters`), trained by
  its own `TorchTrainer` (AdamW state over its adapter only; each step activates it, the others frozen);
- its training settings (a copy of the server's `TrainingConfig` with the `TenantCreate` overrides);
- its pool partition (`Pool.partition`: episodes stored with its id), its open-episode partition
  (`OpenEpisodes.partition`: its drain and staleness aborts touch its episodes only) and its state
  machine (`Phase`: its drain refuses its begins only);
- its folder ``<run dir>/tenants/<id>/``: ``tenant.json`` (settings, state, seed; a retired tenant's
  final view), ``metrics.jsonl`` (kept readable after retirement), ``events.jsonl`` (each event also on
  the server's log, naming the tenant: `TenantEventLog`) and ``checkpoints/`` (each a plain LoRA
  checkpoint, `NamedAdapter`), from which a restarted server resumes every tenant exactly as a
  one-policy server resumes (`resume`).

Episodes begin under a tenant (``EpisodeCreate.tenant``); every call samples with the tenant's current
adapter (`SamplingParams.adapter`) and its record names the tenant and its policy version. Steps of
different tenants queue on one lock (one trainer at a time); the ``hf`` engine pauses sampling during a
step (its served module is the trained one), ``vllm`` keeps sampling the other tenants
(`Engine.samples_while_training`). A failed step or a batch the trainer rejects (a non-finite gradient)
stops its tenant only (``failed``, with the reason); the admin may resume it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ValidationError
from torch import nn

from swarm.config import ServerConfig, TrainingConfig
from swarm.engine.base import Engine
from swarm.errors import RequestError, Unavailable
from swarm.pool import Pool
from swarm.precision import MixedPrecision
from swarm.protocol import (
    EpisodeCreate,
    ServerStepMetrics,
    TenantCreate,
    TenantState,
    TenantView,
)
from swarm.server.checkpoints import latest_checkpoint
from swarm.server.episodes import OpenEpisodes
from swarm.server.events import EventLog, TenantEventLog
from swarm.server.phase import Phase
from swarm.server.step_history import read_rows
from swarm.server.training import TrainingLoop
from swarm.train import TorchTrainer
from swarm.train.adapters import add_adapter, remove_adapter

__all__ = ["Tenant", "TenantRegistry", "tenant_training"]


class _Record(BaseModel):
    """``tenant.json``: what a restarted server rebuilds a tenant from."""

    settings: TenantCreate
    seed: int
    """The adapter's initialisation seed (drawn when the admin gave none, so a restart re-creates it)."""
    state: TenantState = TenantState.ACTIVE
    reason: str | None = None
    checkpoint: str | None = None
    final: TenantView | None = None
    """A retired tenant's view when it retired: its last step, episode counts and effective settings."""


def tenant_training(base: TrainingConfig, body: TenantCreate) -> TrainingConfig:
    """The server's training configuration with a tenant's overrides (fields it leaves out keep the
    server's), always enabled.

    Raises:
        RequestError: an invalid combination (422), e.g. a batch policy the batch size does not suit.
    """
    data = base.model_dump()
    data["enabled"] = True
    trainer, batch = data["trainer"], data["batch"]
    for name in ("lr", "kl_coef", "ppo_epochs", "minibatches"):
        if getattr(body, name) is not None:
            trainer[name] = getattr(body, name)
    if body.clip_eps is not None:
        trainer["clip_eps_low"] = trainer["clip_eps_high"] = body.clip_eps
    if body.batch_size is not None:
        batch["batch_size"] = body.batch_size
    if body.group_size is not None:
        batch["group_size"] = body.group_size
    if body.batch_policy is not None:
        batch["policy"] = body.batch_policy
    if body.max_steps is not None:
        data["max_steps"] = body.max_steps
    try:
        return TrainingConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise RequestError(f"tenant {body.id!r}: {where}: {err['msg']}", status_code=422) from None


class _AdapterEngine:
    """The engine as one tenant's `TrainingLoop` sees it: its weights are adapter ``name`` (served with
    `Engine.serve_adapter`), and a step holds the registry's train lock (tenants' steps queue) and, where
    the engine cannot sample while training (``hf``), the engine's pause."""

    def __init__(self, engine: Engine, name: str, train_lock: threading.RLock) -> None:
        self._engine, self._name, self._lock = engine, name, train_lock

    @property
    def tokenizer(self) -> Any:
        return self._engine.tokenizer

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        with self._lock:
            if self._engine.samples_while_training:
                yield
            else:
                with self._engine.pause():
                    yield

    def release_memory(self) -> None:
        """Nothing: the other tenants keep sampling (``vllm``), or nothing is held (``hf``)."""

    def restore_memory(self) -> None:
        """Nothing (see :meth:`release_memory`)."""

    def load_weights(self, module: nn.Module, policy_version: int) -> None:
        self._engine.serve_adapter(self._name, module, policy_version)


class Tenant:
    """One LoRA tenant: its record, state machine, training loop and background task."""

    def __init__(
        self, tenant_id: str, folder: Path, record: _Record, phase: Phase, loop: TrainingLoop
    ) -> None:
        self.id = tenant_id
        self.folder = folder
        self.record = record
        self.phase = phase
        self.loop = loop
        self.task: asyncio.Task[None] | None = None

    @property
    def state(self) -> TenantState:
        return self.record.state

    def save(self) -> None:
        """Write ``tenant.json`` atomically."""
        tmp = self.folder / ".tenant.json.tmp"
        tmp.write_text(self.record.model_dump_json(indent=1))
        tmp.replace(self.folder / "tenant.json")

    def move(self, state: TenantState, reason: str | None) -> None:
        """Change state (persisted); ``paused``/``failed`` stop its begins and steps, ``active`` resumes."""
        self.record.state, self.record.reason = state, reason
        if state is TenantState.ACTIVE:
            self.phase.resume()
            self.loop.wake()
        else:
            self.phase.pause()
        self.save()

    def view(self, open_episodes: int) -> TenantView:
        counts = self.loop.pool.counts()
        settings = self.record.settings.model_dump(exclude={"id"}, exclude_none=True)
        config = self.loop.config
        settings.update(
            lr=config.trainer.lr,
            batch_size=config.batch.batch_size,
            group_size=config.batch.group_size,
            kl_coef=config.trainer.kl_coef,
            clip_eps=config.trainer.clip_eps_low,
            ppo_epochs=config.trainer.ppo_epochs,
            minibatches=config.trainer.minibatches,
            batch_policy=config.batch.policy.value,
            max_steps=config.max_steps,
        )
        return TenantView(
            id=self.id,
            state=self.state,
            reason=self.record.reason,
            step=self.loop.step,
            open_episodes=open_episodes,
            pending=counts.pending,
            trained=counts.trained,
            settings=settings,
            checkpoint=self.record.checkpoint,
        )


class TenantRegistry:
    """The tenants of one server: creation (up to the cap), lookup, lifecycle, admission of their episodes.

    Built by the runtime (``ServerConfig.tenants > 0``); rebuilds every tenant that was not retired from
    ``<run dir>/tenants/*/tenant.json``, each resumed from its newest checkpoint (and journal) with its
    pool partition rewound, so a kill -9 resumes every tenant once.

    Args:
        config: the server's configuration (``tenants`` is the cap; ``training`` the tenants' defaults).
        engine: the served engine (its `Engine.trainable_module` is the base the adapters wrap).
        pool: the server's pool (each tenant trains on its partition).
        episodes: the server's open episodes (each tenant drains its partition).
        events: the server's event log (``tenant.*`` events; a tenant's steps log to its own folder and
            here, naming the tenant).
        mixed_precision: the trainer's compute dtype (resolved).
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        engine: Engine,
        pool: Pool,
        episodes: OpenEpisodes,
        events: EventLog,
        mixed_precision: MixedPrecision,
    ) -> None:
        self.cap = config.tenants
        self.config = config
        self.engine = engine
        self.pool = pool
        self.episodes = episodes
        self.events = events
        self.mixed_precision = mixed_precision
        self.root = config.run_dir / "tenants"
        self._lock = threading.RLock()
        """Held by each tenant's step (they queue) and by adapter injection and removal."""
        self._model: nn.Module = engine.trainable_module()
        """The base model, then the peft model holding every tenant's adapter."""
        self._tenants: dict[str, Tenant] = {}
        self._retired: dict[str, _Record] = {}
        self._creating: set[str] = set()
        """Ids being created (they count against the cap and are taken)."""
        for path in sorted(self.root.glob("*/tenant.json")) if self.root.exists() else []:
            record = _Record.model_validate_json(path.read_text())
            if record.state is TenantState.RETIRED:
                self._retired[path.parent.name] = record
            else:
                self._build(path.parent.name, record)

    # -- lookup --------------------------------------------------------------------------------------------
    def get(self, tenant_id: str) -> Tenant:
        """The resident tenant ``tenant_id``.

        Raises:
            RequestError: no resident tenant has this id (404; a retired one says so).
        """
        tenant = self._tenants.get(tenant_id)
        if tenant is None:
            retired = " (retired)" if tenant_id in self._retired else ""
            raise RequestError(f"no tenant {tenant_id!r}{retired}", status_code=404, param="tenant")
        return tenant

    def view(self, tenant_id: str) -> TenantView:
        """One tenant, resident or retired."""
        if tenant_id in self._retired:
            record = self._retired[tenant_id]
            if record.final is not None:
                return record.final.model_copy(
                    update={"state": record.state, "reason": record.reason, "checkpoint": record.checkpoint}
                )
            return TenantView(  # retired before final views were recorded
                id=tenant_id,
                state=record.state,
                reason=record.reason,
                step=_checkpoint_step(record.checkpoint),
                settings=record.settings.model_dump(exclude={"id"}, exclude_none=True),
                checkpoint=record.checkpoint,
            )
        tenant = self.get(tenant_id)
        return tenant.view(len(self.episodes.partition(tenant_id)))

    def views(self) -> list[TenantView]:
        """Every tenant ever created on this run dir (resident first, then retired), by id."""
        return [self.view(t) for t in sorted(self._tenants)] + [self.view(t) for t in sorted(self._retired)]

    def metrics(self, tenant_id: str, since_step: int) -> list[ServerStepMetrics]:
        """A tenant's metrics rows after ``since_step``: a resident one's history, a retired one's
        ``metrics.jsonl``.

        Raises:
            RequestError: no tenant, resident or retired, has this id (404).
        """
        if tenant_id in self._retired:
            rows = read_rows(self.root / tenant_id / "metrics.jsonl")
        else:
            rows = self.get(tenant_id).loop.history
        return [row for row in rows if row.step > since_step]

    # -- lifecycle -----------------------------------------------------------------------------------------
    async def create(self, body: TenantCreate) -> TenantView:
        """Create a tenant, its adapter and its training loop (in a worker thread: the adapter is
        injected while generation pauses), and start training it.

        Raises:
            RequestError: the id is taken (409), ``--tenants`` tenants are resident already (409: the
                cap on resident adapters and optimizer states), or its settings or id are invalid (422).
        """
        if body.id in "lora_":  # peft renames state-dict keys by adapter name: "a" or "lo" would clash
            raise RequestError(f"tenant id {body.id!r} is part of 'lora_'; choose another", status_code=422)
        if body.id in self._tenants or body.id in self._retired or body.id in self._creating:
            raise RequestError(f"tenant {body.id!r} exists already", status_code=409, param="id")
        if (resident := len(self._tenants) + len(self._creating)) >= self.cap:
            raise RequestError(
                f"{resident} tenant{' is' if resident == 1 else 's are'} resident, the cap of this server "
                f"(--tenants {self.cap}: adapters and optimizer states held in memory); retire one first",
                status_code=409,
            )
        tenant_training(self.config.training, body)  # 422 before anything is created
        seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
        self._creating.add(body.id)
        try:
            tenant = await asyncio.to_thread(self._build, body.id, _Record(settings=body, seed=seed))
        finally:
            self._creating.discard(body.id)
        tenant.save()
        self._start(tenant)
        self.events.emit("tenant.created", f"tenant {body.id} created", tenant=body.id)
        return self.view(body.id)

    def start(self) -> None:
        """Start the training loops of the tenants rebuilt at startup (on the event loop)."""
        for tenant in self._tenants.values():
            if tenant.task is None:
                self._start(tenant)

    def pause(self, tenant_id: str) -> TenantView:
        """Pause a tenant: no new episodes (503) and no step until resumed; open ones keep sampling."""
        self.get(tenant_id).move(TenantState.PAUSED, "paused by the admin")
        self.events.emit("tenant.paused", f"tenant {tenant_id} paused", tenant=tenant_id)
        return self.view(tenant_id)

    def resume(self, tenant_id: str) -> TenantView:
        """Resume a paused or failed tenant."""
        self.get(tenant_id).move(TenantState.ACTIVE, None)
        self.events.emit("tenant.resumed", f"tenant {tenant_id} resumed", tenant=tenant_id)
        return self.view(tenant_id)

    async def retire(self, tenant_id: str) -> TenantView:
        """Retire a tenant: its open episodes are aborted, its running step ends, its adapter is saved as a
        LoRA checkpoint (``TenantView.checkpoint``) and leaves memory (a place under the cap is free)."""
        tenant = self.get(tenant_id)
        tenant.phase.pause()
        self.episodes.partition(tenant_id).abort_open(f"tenant {tenant_id} was retired")
        if tenant.task is not None:
            tenant.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tenant.task
        await asyncio.to_thread(self._retire_blocking, tenant)
        self.events.emit(
            "tenant.retired",
            f"tenant {tenant_id} retired at step {tenant.loop.step}; adapter in {tenant.record.checkpoint}",
            tenant=tenant_id,
            checkpoint=tenant.record.checkpoint,
        )
        return self.view(tenant_id)

    def _retire_blocking(self, tenant: Tenant) -> None:
        with self._lock:  # after its step, if one runs
            tenant.loop.checkpoint()
            latest = latest_checkpoint(tenant.folder)
            tenant.record.checkpoint = None if latest is None else str(latest[1])
            tenant.record.final = tenant.view(open_episodes=0)  # its open episodes were aborted
            tenant.record.state, tenant.record.reason = TenantState.RETIRED, "retired by the admin"
            tenant.save()
            with self.engine.pause():
                self.engine.drop_adapter(tenant.id)
                remove_adapter(self._model, tenant.id)
            del self._tenants[tenant.id]
            self._retired[tenant.id] = tenant.record

    def close(self) -> None:
        """Stop every tenant's loop (the app's shutdown awaits the tasks)."""
        for tenant in self._tenants.values():
            if tenant.task is not None:
                tenant.task.cancel()

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return [t.task for t in self._tenants.values() if t.task is not None]

    # -- episodes ------------------------------------------------------------------------------------------
    def admit(self, body: EpisodeCreate) -> None:
        """Admit an episode begun under ``body.tenant``: the tenant is active, its phase admits (not
        draining or training in synchronous mode), and its admission control agrees (quotas 429,
        asynchronous bound 503).

        Raises:
            RequestError: no such tenant (404), or it is retired.
            Unavailable: the tenant is paused or failed, or it does not admit now (503 + Retry-After).
        """
        assert body.tenant is not None
        tenant = self.get(body.tenant)
        if tenant.state is not TenantState.ACTIVE:
            why = f": {tenant.record.reason}" if tenant.record.reason else ""
            raise Unavailable(f"tenant {tenant.id} is {tenant.state.value}{why}", retry_after_s=5.0)
        if not tenant.phase.admits():
            raise Unavailable(
                f"tenant {tenant.id} is {tenant.phase.state.value}; no new episodes now", retry_after_s=2.0
            )
        tenant.loop.admit(body.family, body.kind, body.task_id)
        tenant.loop.touch(body.client_id)

    def begun(self, tenant_id: str) -> None:
        """An admitted episode of ``tenant_id`` began (its phase leaves ``idle``)."""
        self.get(tenant_id).phase.episode_begun()

    # -- building ------------------------------------------------------------------------------------------
    def _build(self, tenant_id: str, record: _Record) -> Tenant:
        """A tenant's adapter, trainer and training loop (resumed from its folder); not started."""
        training = tenant_training(self.config.training, record.settings)
        lora = training.trainer.lora
        assert lora is not None  # ServerConfig checks that tenants have LoRA settings
        folder = self.root / tenant_id
        folder.mkdir(parents=True, exist_ok=True)
        with self._lock, self.engine.pause():  # no batch runs while adapters are injected
            self._model = add_adapter(self._model, tenant_id, lora, seed=record.seed)
        pad = self.engine.tokenizer.pad_token_id
        trainer = TorchTrainer(
            self._model,
            training.trainer,
            pad_token_id=int(pad if pad is not None else 0),
            mixed_precision=self.mixed_precision,
            adapter=tenant_id,
        )
        phase = Phase(asynchronous=training.max_staleness is not None)
        holder: list[Tenant] = []
        loop = TrainingLoop(
            training,
            engine=cast(Engine, _AdapterEngine(self.engine, tenant_id, self._lock)),
            pool=self.pool.partition(tenant_id),
            episodes=self.episodes.partition(tenant_id),
            events=TenantEventLog(folder / "events.jsonl", self.events, tenant_id),
            phase=phase,
            run_dir=folder,
            sampling=self.config.sampling,
            mixed_precision=self.mixed_precision,
            trainer=trainer,
            on_failure=lambda reason: self._failed(holder[0], reason),
        )
        tenant = Tenant(tenant_id, folder, record, phase, loop)
        holder.append(tenant)
        if record.state is not TenantState.ACTIVE:
            phase.pause()
        self._tenants[tenant_id] = tenant
        return tenant

    def _start(self, tenant: Tenant) -> None:
        tenant.task = asyncio.get_running_loop().create_task(tenant.loop.run(), name=f"tenant-{tenant.id}")

    def _failed(self, tenant: Tenant, reason: str) -> None:
        """A step of ``tenant`` failed: it stops (``failed``), the others train on."""
        tenant.move(TenantState.FAILED, reason)
        self.events.emit(
            "tenant.failed", f"tenant {tenant.id} failed: {reason}", level="error", tenant=tenant.id
        )


def _checkpoint_step(checkpoint: str | None) -> int:
    """The step of a checkpoint folder (``…/step-000004`` → 4; ``None`` → 0)."""
    if checkpoint is None:
        return 0
    meta = Path(checkpoint) / "meta.json"
    return int(json.loads(meta.read_text())["step"]) if meta.exists() else 0
