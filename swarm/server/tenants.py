"""LoRA tenants: several policies, each a LoRA adapter, over one frozen base model in one server.

``swarm serve --tenants N --lora-rank R`` hosts up to N tenants (docs/ARCHITECTURE.md §LoRA tenants). The
admin creates, lists, pauses, resumes and retires them over the control API (`swarm.server.tenant_routes`).
A tenant is a one-policy training run in miniature, built from the same parts as the server's own
`TrainingLoop`, each of them its own:

- its adapter, named by its id, in the one peft model over the base (`swarm.train.adapters`), trained by
  its own `TorchTrainer` (AdamW state over its adapter only; each step activates it, the others frozen);
- its training settings (`TenantSettings`: the `TenantCreate` overrides with the server's values filled in
  at creation, kept in ``tenant.json``, so a restart with other flags leaves them unchanged);
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
step (its served module is the trained one) unless ``--tenant-overlap`` gives it a twin of the adapters
(`swarm.engine.adapter_twin`), ``vllm`` keeps sampling the other tenants (`Engine.samples_while_training`). A failed step or a batch the trainer rejects (a non-finite gradient)
stops its tenant only (``failed``, with the reason); the admin may resume it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from swarm.batch import BatchPolicy, tenant_policy_refusal
from swarm.config import ServerConfig, TrainingConfig
from swarm.engine.base import Engine
from swarm.engine.priority_lock import PriorityLock
from swarm.errors import ConfigError, InsufficientMemory, Paused, RequestError, Unavailable
from swarm.pool import Pool
from swarm.precision import MixedPrecision
from swarm.protocol import (
    EpisodeCreate,
    ServerStepMetrics,
    TenantBrief,
    TenantCreate,
    TenantsStatus,
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

__all__ = [
    "NO_TENANTS",
    "Tenant",
    "TenantRegistry",
    "TenantSettings",
    "TenantsOnDisk",
    "check_tenants_on_disk",
    "tenant_training",
]


NO_TENANTS = "this server hosts no tenants (start it with swarm serve --tenants N)"
"""The 409 of every tenant route, and of a begin under a tenant, on a server without ``--tenants``."""


class TenantSettings(BaseModel):
    """A tenant's training settings, resolved at its creation: its `TenantCreate` overrides with the
    server's values (its ``swarm serve`` options) filled in for the fields it left out. Kept in
    ``tenant.json``; a restarted server rebuilds the tenant from them, whatever its own flags are now."""

    model_config = ConfigDict(extra="forbid")

    lr: float
    kl_coef: float
    clip_eps_low: float
    clip_eps_high: float
    ppo_epochs: int
    minibatches: int
    batch_policy: BatchPolicy
    batch_size: int
    """B: tasks (or episodes, by policy) per step."""
    group_size: int
    """G: episodes per task."""
    max_steps: int | None
    """``None``: no limit."""

    @classmethod
    def of(cls, training: TrainingConfig) -> TenantSettings:
        """The settings a training configuration gives a tenant."""
        t, b = training.trainer, training.batch
        return cls(
            lr=t.lr,
            kl_coef=t.kl_coef,
            clip_eps_low=t.clip_eps_low,
            clip_eps_high=t.clip_eps_high,
            ppo_epochs=t.ppo_epochs,
            minibatches=t.minibatches,
            batch_policy=b.policy,
            batch_size=b.batch_size,
            group_size=b.group_size,
            max_steps=training.max_steps,
        )

    def training(self, base: TrainingConfig, tenant_id: str) -> TrainingConfig:
        """``base`` (the server's configuration: LoRA, loss, checkpointing…) with these settings, enabled.

        Raises:
            RequestError: an invalid combination (422), e.g. a batch policy the batch size does not suit.
        """
        data = base.model_dump()
        data["enabled"] = True
        data["max_steps"] = self.max_steps
        for name in ("lr", "kl_coef", "clip_eps_low", "clip_eps_high", "ppo_epochs", "minibatches"):
            data["trainer"][name] = getattr(self, name)
        data["batch"].update(policy=self.batch_policy, batch_size=self.batch_size, group_size=self.group_size)
        try:
            return TrainingConfig.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise RequestError(f"tenant {tenant_id!r}: {where}: {err['msg']}", status_code=422) from None


class _Record(BaseModel):
    """``tenant.json``: what a restarted server rebuilds a tenant from."""

    settings: TenantCreate
    """What the admin posted (fields left out are ``None``)."""
    resolved: TenantSettings | None = None
    """Its settings, resolved at creation (`TenantSettings`). ``None`` in a record written before they
    were kept: the first server that resumes it fills them in from its own flags, once, and saves them."""
    seed: int
    """The adapter's initialisation seed (drawn when the admin gave none, so a restart re-creates it)."""
    lora_rank: int | None = None
    """The adapter's LoRA rank (``--lora-rank`` at creation; a restart at another rank is refused:
    `check_tenants_on_disk`). ``None`` in a record written before it was kept: filled in when rebuilt."""
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
    return _resolve(base, body).training(base, body.id)


def _resolve(base: TrainingConfig, body: TenantCreate) -> TenantSettings:
    """``body``'s settings with ``base``'s values for the fields it leaves out."""
    settings = TenantSettings.of(base).model_dump()
    settings.update(body.model_dump(include=set(settings), exclude_none=True))
    if body.clip_eps is not None:
        settings["clip_eps_low"] = settings["clip_eps_high"] = body.clip_eps
    return TenantSettings.model_validate(settings)


class TenantsOnDisk(ConfigError):
    """A run dir holds more tenants than the server would host (none without ``--tenants``)."""


def check_tenants_on_disk(config: ServerConfig) -> None:
    """Refuse to serve ``config.run_dir`` when it holds tenants that a server of ``config.tenants`` tenants
    (0: none, a one-policy server) cannot resume: any tenant at all without ``--tenants`` (a one-policy
    server would train their episodes as its own), more resident (not retired) tenants than that, or
    resident tenants whose adapters have another LoRA rank than the server's ``--lora-rank`` (not checked
    without LoRA settings), as ``tenant.json`` records it (or, in a record written before it was kept, the
    newest checkpoint's ``adapter_config.json``). Reads ``<run dir>/tenants/`` only; creates and changes
    nothing.

    Raises:
        TenantsOnDisk: one line naming the run dir, the tenants and the ``--tenants`` (or ``--lora-rank``)
            that resumes them.
    """
    run_dir, cap, lora = config.run_dir, config.tenants, config.training.trainer.lora
    lora_rank = lora.r if lora is not None else None
    root = run_dir / "tenants"
    resident: list[str] = []
    retired: list[str] = []
    ranks: dict[int, list[str]] = {}
    for path in sorted(root.glob("*/tenant.json")) if root.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            state = record.get("state", TenantState.ACTIVE.value)
        except (OSError, ValueError, AttributeError):
            record, state = {}, TenantState.ACTIVE.value  # unreadable: the server would fail on it; count it
        (retired if state == TenantState.RETIRED.value else resident).append(path.parent.name)
        rank = record.get("lora_rank") or _checkpoint_rank(path.parent)
        if state != TenantState.RETIRED.value and rank is not None and rank != lora_rank:
            ranks.setdefault(rank, []).append(path.parent.name)
    if (not cap and (resident or retired)) or len(resident) > cap:
        names = ", ".join(resident[:4]) + ("…" if len(resident) > 4 else "")
        if retired:
            names += f"{'; ' if resident else ''}{len(retired)} retired"
        given = f"--tenants {cap}" if cap else "no --tenants"
        raise TenantsOnDisk(
            f"--run-dir {run_dir} holds {len(resident)} tenants ({names}) and {given} was given: start it "
            f"with --tenants {max(len(resident), 1)} or more, or use another --run-dir"
        )
    if lora_rank is not None and ranks:
        rank, names_at = sorted(ranks.items(), key=lambda kv: -len(kv[1]))[0]
        listed = ", ".join(names_at[:4]) + ("…" if len(names_at) > 4 else "")
        raise TenantsOnDisk(
            f"--run-dir {run_dir} holds tenants created at --lora-rank {rank} ({listed}) and --lora-rank "
            f"{lora_rank} was given: start it with --lora-rank {rank}, or use another --run-dir"
        )


def _checkpoint_rank(folder: Path) -> int | None:
    """The LoRA rank of a tenant's newest checkpoint (its ``adapter_config.json``'s ``r``), or ``None``."""
    latest = latest_checkpoint(folder)
    try:
        config = json.loads((latest[1] / "adapter_config.json").read_text()) if latest else {}
    except (OSError, ValueError):
        return None
    rank = config.get("r") if isinstance(config, dict) else None
    return rank if isinstance(rank, int) else None


class _AdapterEngine:
    """The engine as one tenant's `TrainingLoop` sees it: its weights are adapter ``name`` (served with
    `Engine.serve_adapter`), and a step holds the registry's train lock (tenants' steps queue) and, where
    the engine cannot sample while training (``hf`` without ``--tenant-overlap``), the engine's pause;
    where it can, `Engine.training_alongside`."""

    def __init__(self, engine: Engine, name: str, train_lock: PriorityLock) -> None:
        self._engine, self._name, self._lock = engine, name, train_lock

    @property
    def tokenizer(self) -> Any:
        return self._engine.tokenizer

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        with self._lock.after_first():
            if self._engine.samples_while_training:
                with self._engine.training_alongside():
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
        _save(self.folder, self.record)

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
        self._lock = PriorityLock()  # steps queue (after_first); adapter injection and removal go first
        """Held by each tenant's step (they queue) and, before them, by adapter injection and removal."""
        self._model: nn.Module = engine.trainable_module()
        """The base model, then the peft model holding every tenant's adapter."""
        self._tenants: dict[str, Tenant] = {}
        self._retired: dict[str, _Record] = {}
        self._creating: dict[str, TenantCreate] = {}
        """Tenants being created (``creating``: they count against the cap and their ids are taken)."""
        self._create_tasks: set[asyncio.Task[None]] = set()
        self._retiring: dict[str, asyncio.Task[TenantView]] = {}
        """Retires under way: a second retire of the tenant awaits the first and gets its answer."""
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
            RequestError: no resident tenant has this id (404; a retired one says so), or it is still being
                created (409: retry once ``GET`` shows it ``active``).
        """
        tenant = self._tenants.get(tenant_id)
        if tenant is None and tenant_id in self._creating:
            raise RequestError(
                f"tenant {tenant_id!r} is being created; retry when it is active",
                status_code=409,
                param="tenant",
            )
        if tenant is None:
            retired = " (retired)" if tenant_id in self._retired else ""
            raise RequestError(f"no tenant {tenant_id!r}{retired}", status_code=404, param="tenant")
        return tenant

    def known(self, tenant_id: str) -> None:
        """Return when a tenant, resident, being created or retired, has this id.

        Raises:
            RequestError: none has (404).
        """
        if (
            tenant_id not in self._tenants
            and tenant_id not in self._creating
            and tenant_id not in self._retired
        ):
            raise RequestError(f"no tenant {tenant_id!r}", status_code=404, param="tenant")

    def _changeable(self, tenant_id: str) -> Tenant:
        """The resident tenant ``tenant_id``, which no retire is retiring (`get`'s errors).

        Raises:
            RequestError: as `get`, or it is being retired (409).
        """
        if tenant_id in self._retiring:
            raise RequestError(f"tenant {tenant_id!r} is being retired", status_code=409, param="tenant")
        return self.get(tenant_id)

    def view(self, tenant_id: str) -> TenantView:
        """One tenant, resident, being created or retired."""
        if tenant_id in self._creating and tenant_id not in self._tenants:
            return TenantView(
                id=tenant_id,
                state=TenantState.CREATING,
                step=0,
                settings=self._creating[tenant_id].model_dump(exclude={"id"}, exclude_none=True),
            )
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
        """Every tenant of this run dir (resident or being created first, then retired), by id."""
        current = sorted(set(self._tenants) | set(self._creating))
        return [self.view(t) for t in current] + [self.view(t) for t in sorted(self._retired)]

    def summary(self) -> TenantsStatus:
        """The tenants in brief (`StatusView.tenants`): the cap, and each resident tenant's state and step,
        read from memory (no pool query, no lock)."""
        brief = [
            TenantBrief(id=t, state=TenantState.CREATING, step=0)
            if (tenant := self._tenants.get(t)) is None
            else TenantBrief(id=t, state=tenant.state, step=tenant.loop.step)
            for t in sorted(set(self._tenants) | set(self._creating))
        ]
        return TenantsStatus(cap=self.cap, resident=len(brief), retired=len(self._retired), tenants=brief)

    def retired_ids(self) -> list[str]:
        """The ids of the retired tenants, sorted."""
        return sorted(self._retired)

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
        injected while generation pauses, after the running batch and step at most), and start training it.
        Meanwhile it is ``creating``: ``GET`` shows it, a second create and its other routes answer 409. The
        work goes on if the client stops waiting (the tenant then becomes active: retire it).

        Raises:
            RequestError: the id is taken (409), ``--tenants`` tenants are resident already (409: the
                cap on resident adapters and optimizer states), or its settings or id are invalid (422; a
                voting batch policy included: `TENANT_BATCH_POLICIES`).
            InsufficientMemory: its adapter, trainer or optimizer state did not fit (507); nothing of it is
                kept, so the id can be created again.
        """
        if body.id in "lora_":  # peft renames state-dict keys by adapter name: "a" or "lo" would clash
            raise RequestError(f"tenant id {body.id!r} is part of 'lora_'; choose another", status_code=422)
        if body.id in self._creating:
            raise RequestError(
                f"tenant {body.id!r} is being created already (GET shows it 'creating')",
                status_code=409,
                param="id",
            )
        if body.id in self._retired:
            raise RequestError(
                f"tenant {body.id!r} was retired (its id stays taken: its checkpoint, metrics and events keep "
                "it); choose another id",
                status_code=409,
                param="id",
            )
        if body.id in self._tenants:
            raise RequestError(f"tenant {body.id!r} exists already", status_code=409, param="id")
        if (resident := len(self._tenants) + len(self._creating)) >= self.cap:
            raise RequestError(
                f"{resident} tenant{' is' if resident == 1 else 's are'} resident, the cap of this server "
                f"(--tenants {self.cap}: adapters and optimizer states held in memory); retire one first",
                status_code=409,
            )
        resolved = _resolve(self.config.training, body)
        resolved.training(self.config.training, body.id)  # 422 before anything is created
        if (refusal := tenant_policy_refusal(resolved.batch_policy)) is not None:
            raise RequestError(f"tenant {body.id!r}: {refusal}", status_code=422, param="batch_policy")
        seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
        self._creating[body.id] = body
        lora = self.config.training.trainer.lora
        record = _Record(settings=body, resolved=resolved, seed=seed, lora_rank=lora.r if lora else None)
        task = asyncio.get_running_loop().create_task(self._create(body, record), name=f"create-{body.id}")
        self._create_tasks.add(task)
        task.add_done_callback(self._create_tasks.discard)
        await asyncio.shield(task)  # a client that stops waiting does not stop it half-way
        return self.view(body.id)

    async def _create(self, body: TenantCreate, record: _Record) -> None:
        try:
            tenant = await asyncio.to_thread(self._build, body.id, record)
            tenant.save()
            self._start(tenant)
        except torch.OutOfMemoryError as error:
            first = str(error).splitlines()[0] if str(error) else "out of memory"
            raise InsufficientMemory(
                f"tenant {body.id!r} did not fit in memory ({first}); nothing of it was kept: retire a "
                f"tenant, or start the server with a smaller --lora-rank"
            ) from error
        finally:
            del self._creating[body.id]
        self.events.emit("tenant.created", f"tenant {body.id} created", tenant=body.id)

    def start(self) -> None:
        """Start the training loops of the tenants rebuilt at startup (on the event loop)."""
        for tenant in self._tenants.values():
            if tenant.task is None:
                self._start(tenant)

    def pause(self, tenant_id: str) -> TenantView:
        """Pause a tenant: no new episodes (503) and no step until resumed; open ones keep sampling."""
        self._changeable(tenant_id).move(TenantState.PAUSED, "paused by the admin")
        self.events.emit("tenant.paused", f"tenant {tenant_id} paused", tenant=tenant_id)
        return self.view(tenant_id)

    def resume(self, tenant_id: str) -> TenantView:
        """Resume a paused or failed tenant."""
        self._changeable(tenant_id).move(TenantState.ACTIVE, None)
        self.events.emit("tenant.resumed", f"tenant {tenant_id} resumed", tenant=tenant_id)
        return self.view(tenant_id)

    async def retire(self, tenant_id: str) -> TenantView:
        """Retire a tenant: its open episodes are aborted, its running step ends, its adapter is saved as a
        LoRA checkpoint (``TenantView.checkpoint``) and leaves memory (a place under the cap is free).

        A retire sent while one is under way (concurrent, or a client's retry after a timeout) waits for it
        and answers the same view; the work goes on if the client stops waiting.

        Raises:
            RequestError: no resident tenant has this id (404; a retired one says so), or it is still being
                created (409).
        """
        if (running := self._retiring.get(tenant_id)) is None:
            tenant = self.get(tenant_id)
            running = asyncio.get_running_loop().create_task(self._retire(tenant), name=f"retire-{tenant_id}")
            self._retiring[tenant_id] = running
            running.add_done_callback(lambda _: self._retiring.pop(tenant_id, None))
        return await asyncio.shield(running)

    async def _retire(self, tenant: Tenant) -> TenantView:
        tenant_id = tenant.id
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
        with self._lock.first():  # after its step, if one runs
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

    def interrupt_steps(self) -> None:
        """The server is stopping: no tenant starts a step, and one under way gives up before its first
        update (`TrainingLoop.interrupt`)."""
        for tenant in list(self._tenants.values()):
            tenant.loop.interrupt()

    def close(self) -> None:
        """Stop every tenant's loop (the app's shutdown awaits the tasks)."""
        for tenant in self._tenants.values():
            if tenant.task is not None:
                tenant.task.cancel()

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return [t.task for t in self._tenants.values() if t.task is not None]

    # -- clients -------------------------------------------------------------------------------------------
    def touch(self, client_id: str) -> None:
        """A client's sign of life (heartbeat), for every resident tenant."""
        for tenant in self._tenants.values():
            tenant.loop.touch(client_id)

    def leave(self, client_id: str) -> None:
        """A client leaves every resident tenant."""
        for tenant in self._tenants.values():
            tenant.loop.leave(client_id)

    def client_active(self, client_id: str) -> bool:
        """Whether any resident tenant counts ``client_id`` as active (begun an episode or heartbeat lately)."""
        return any(client_id in tenant.loop.votes.active() for tenant in self._tenants.values())

    # -- episodes ------------------------------------------------------------------------------------------
    def admit(self, body: EpisodeCreate) -> None:
        """Admit an episode begun under ``body.tenant``: the tenant is active, its phase admits (not
        draining or training in synchronous mode), and its admission control agrees (quotas 429,
        asynchronous bound 503).

        Raises:
            RequestError: no such tenant (404), or it is retired (404) or being retired (409).
            Paused: the tenant is paused or failed (503 + Retry-After, type ``paused``).
            Unavailable: it does not admit now (503 + Retry-After).
        """
        assert body.tenant is not None
        tenant = self._changeable(body.tenant)
        if tenant.state is not TenantState.ACTIVE:
            why = f": {tenant.record.reason}" if tenant.record.reason else ""
            raise Paused(f"tenant {tenant.id} is {tenant.state.value}{why}", retry_after_s=5.0)
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
        """A tenant's adapter, trainer and training loop (resumed from its folder); not started. A record
        without resolved settings (written by an older server) takes this server's flags, once, saved."""
        if record.resolved is None:
            record.resolved = _resolve(self.config.training, record.settings)
            _save(self.root / tenant_id, record)
        training = record.resolved.training(self.config.training, tenant_id)
        lora = training.trainer.lora
        assert lora is not None  # ServerConfig checks that tenants have LoRA settings
        if record.lora_rank is None:  # created before the rank was kept: it is this server's (checked)
            record.lora_rank = lora.r
            _save(self.root / tenant_id, record)
        folder = self.root / tenant_id
        new_folder = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with self._lock.first(), self.engine.pause():  # no batch or step runs while adapters are injected
                self._model = add_adapter(self._model, tenant_id, lora, seed=record.seed)
            return self._assemble(tenant_id, folder, record, training)
        except BaseException:
            self._undo_build(tenant_id, folder if new_folder else None)
            raise

    def _assemble(self, tenant_id: str, folder: Path, record: _Record, training: TrainingConfig) -> Tenant:
        """The trainer and training loop around tenant ``tenant_id``'s injected adapter; registered."""
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

    def _undo_build(self, tenant_id: str, new_folder: Path | None) -> None:
        """A build that failed part-way (out of memory, say) leaves nothing behind: the adapter, if it was
        injected, is deleted, and the folder it created is removed, so the same id can be created again."""
        with self._lock.first(), self.engine.pause():
            if tenant_id in getattr(self._model, "peft_config", {}):
                remove_adapter(self._model, tenant_id)
        if new_folder is not None and not (new_folder / "tenant.json").exists():
            shutil.rmtree(new_folder, ignore_errors=True)

    def _start(self, tenant: Tenant) -> None:
        tenant.task = asyncio.get_running_loop().create_task(tenant.loop.run(), name=f"tenant-{tenant.id}")

    def _failed(self, tenant: Tenant, reason: str) -> None:
        """A step of ``tenant`` failed: it stops (``failed``), the others train on."""
        tenant.move(TenantState.FAILED, reason)
        self.events.emit(
            "tenant.failed", f"tenant {tenant.id} failed: {reason}", level="error", tenant=tenant.id
        )


def _save(folder: Path, record: _Record) -> None:
    """Write ``folder/tenant.json`` atomically."""
    tmp = folder / ".tenant.json.tmp"
    tmp.write_text(record.model_dump_json(indent=1))
    tmp.replace(folder / "tenant.json")


def _checkpoint_step(checkpoint: str | None) -> int:
    """The step of a checkpoint folder (``…/step-000004`` → 4; ``None`` → 0)."""
    if checkpoint is None:
        return 0
    meta = Path(checkpoint) / "meta.json"
    return int(json.loads(meta.read_text())["step"]) if meta.exists() else 0
