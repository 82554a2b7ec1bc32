"""What the control and client-vote routes do: status, pause/resume, the live config and limits, client
tokens, event followers, and the training loop's votes, metrics and checkpoints.

`ControlService` composes the parts an operator acts on; each keeps its own state (`Phase` the state
machine, `ClientLimits` the limits, `Credentials` the tokens, `TrainingLoop` the trainer). Everything
here runs on the event loop thread, except `ControlService.checkpoint`'s save (a worker thread).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swarm.config import ServerConfig
from swarm.errors import RequestError, Unavailable
from swarm.pool import Pool
from swarm.protocol import (
    CheckpointSaved,
    ClientState,
    ConfigChanged,
    ConfigPatch,
    ConfigView,
    EpisodeCounts,
    Event,
    ServerStepMetrics,
    StatusView,
)
from swarm.server.auth import Credentials
from swarm.server.episodes import OpenEpisodes
from swarm.server.events import EventLog
from swarm.server.limits import ClientLimits
from swarm.server.phase import Phase
from swarm.server.tenants import TenantRegistry
from swarm.server.training import TrainingLoop

Subscription = tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event]]
"""A live event follower's handle (`EventLog.subscribe`)."""


@dataclass(kw_only=True, eq=False)
class ControlService:
    """The control routes' service (`swarm.server.deps.ControlDep`)."""

    config: ServerConfig
    """The server's configuration (sampling defaults, run dir)."""
    model_name: str
    episodes: OpenEpisodes
    """The open-episode table (counts, clients, a client token's open episodes)."""
    pool: Pool
    phase: Phase
    limits: ClientLimits
    credentials: Credentials
    events: EventLog
    """The server's event log (followers, and the changes logged here)."""
    training_loop: TrainingLoop | None
    """The training loop (``None``: inference mode; `training` answers 409 then)."""
    policy_version: Callable[[], int]
    """The policy version being served (completed trainer steps)."""
    started: float
    """Unix time (s) the server started (its uptime counts from there)."""
    tenants: TenantRegistry | None = None
    """The LoRA tenants (``--tenants N``; ``None``: none), summed up in `status`."""

    # -- state ------------------------------------------------------------------------------------------
    def status(self) -> StatusView:
        """Engine state, policy version, model, episode counts and the clients the voting policies see."""
        stored = self.pool.counts()
        counts = EpisodeCounts(**{**stored.model_dump(), "open": len(self.episodes)})
        if self.tenants is not None:  # fresh-s6 #6: pending counts them, yet no step will train them
            counts.pending_retired = self.pool.untrained_of(self.tenants.retired_ids())
        training = self.training_loop
        return StatusView(
            state=self.phase.state,
            step=self.policy_version(),
            model=self.model_name,
            episodes=counts,
            clients=dict(self.episodes.clients()),
            uptime_s=time.time() - self.started,
            run_dir=str(self.config.run_dir),
            training_enabled=training is not None and training.config.enabled,
            active_clients=[] if training is None else training.votes.active(),
            ready_clients=[] if training is None else training.votes.ready(),
            distill=None if training is None or training.scorer is None else training.scorer.status(),
            tenants=None if self.tenants is None else self.tenants.summary(),
            training_per_tenant=None if self.tenants is None else True,
        )

    def pause(self) -> None:
        """No new episodes and no training until resumed."""
        self.phase.pause()
        self.events.emit("server.paused", "paused: no new episodes, no training")

    def resume(self) -> None:
        if self.phase.resume():
            self.events.emit("server.resumed", "resumed")
        if self.training_loop is not None:
            self.training_loop.wake()

    # -- configuration ------------------------------------------------------------------------------------
    def config_view(self) -> ConfigView:
        """The configuration the next step will use and the limits in force (in inference mode: the
        sampling defaults and the limits, with an empty ``training``)."""
        limits = self.limits.limits
        if self.training_loop is None:
            return ConfigView(training={}, sampling=self.config.sampling, limits=limits)
        return ConfigView.model_validate({**self.training_loop.effective_config(), "limits": limits})

    def patch_config(self, body: ConfigPatch) -> ConfigChanged:
        """Apply a live config change: limits at once, the rest from the next step (`TrainingLoop.apply`).
        A bad limit fails the whole patch before anything changes.

        Raises:
            RequestError: an invalid value (422), or a training field on a server in inference mode (409).
        """
        rest = ConfigPatch.model_validate(body.model_dump(exclude_unset=True, exclude={"limits"}))
        training = self.training() if rest.model_fields_set or body.limits is None else None
        if body.limits is not None:
            self.limits.checked(body.limits)
        changed = training.apply(rest) if training is not None and rest.model_fields_set else {}
        if body.limits is not None:
            limits = self.limits.replace(body.limits)
            self.events.emit("limits.changed", f"limits changed: {limits}", changed=limits)
            changed["limits"] = limits
        return ConfigChanged(changed=changed, config=self.config_view())

    # -- client tokens ------------------------------------------------------------------------------------
    def add_client_token(self, name: str, token: str | None, tenants: list[str] | None = None) -> str:
        """Add a client token live (`Credentials.add`, limited to ``tenants`` when given); returns the
        secret (minted when ``token`` is None).

        Raises:
            RequestError: ``tenants`` on a server started without ``--tenants`` (409: such a token could
                begin nothing here), or what `Credentials.add` raises.
        """
        if tenants is not None and not self.config.tenants:
            raise RequestError(
                "this server hosts no tenants (start it with swarm serve --tenants N): a token limited to "
                "tenants could begin nothing here; leave tenants out",
                status_code=409,
                param="tenants",
            )
        secret = self.credentials.add(name, token, tenants)
        self.events.emit("client_token.added", f"client token {name!r} added", name=name)
        return secret

    def revoke_client_token(self, name: str) -> int:
        """Revoke a client token live (`Credentials.revoke`); returns how many episodes it has open."""
        self.credentials.revoke(name)
        self.limits.rates.forget(name)
        still_open = self.episodes.open_by(name)
        self.events.emit(
            "client_token.revoked", f"client token {name!r} revoked", name=name, open_episodes=still_open
        )
        return still_open

    # -- event followers ----------------------------------------------------------------------------------
    def follow(self) -> Subscription:
        """Subscribe a live follower of the events (`EventLog.subscribe`; release with `EventLog.unsubscribe`).

        Raises:
            Unavailable: ``limits.max_event_subscribers`` clients already follow (503 + Retry-After).
        """
        cap = self.limits.limits.max_event_subscribers
        if self.events.subscribers() >= cap:
            raise Unavailable(
                f"{cap} {'client already follows' if cap == 1 else 'clients already follow'} the events, "
                "this server's limit",
                retry_after_s=5.0,
            )
        return self.events.subscribe()

    # -- training -----------------------------------------------------------------------------------------
    def training(self) -> TrainingLoop:
        """The training loop.

        Raises:
            RequestError: training is disabled on this server (409).
        """
        if self.training_loop is None:
            why = (  # a tenants server trains each tenant with its own settings, not the server's
                "training settings are per tenant, fixed at creation (POST /api/v1/tenants)"
                if self.config.tenants
                else "training is disabled on this server (started in inference mode)"
            )
            raise RequestError(why, status_code=409)
        return self.training_loop

    def vote(self, client_id: str, ready: bool) -> None:
        """Record a client's readiness vote.

        Raises:
            RequestError: training is disabled on this server, or it hosts tenants, whose batch policies
                take no votes (409).
        """
        if self.tenants is not None:
            raise RequestError(
                "readiness votes are not taken on a tenants server: a vote names no tenant, and tenants "
                "train by sized batch policies (episodes, tasks, informative_tasks); leave voting out",
                status_code=409,
            )
        self.training().vote(client_id, ready)

    def liveness(self) -> TenantRegistry | TrainingLoop:
        """Where a client's heartbeat and leave go (their ``touch``/``leave``): on a tenants server every
        resident tenant, else the training loop.

        Raises:
            RequestError: training is disabled on this server (409).
        """
        return self.tenants if self.tenants is not None else self.training()

    def client_state(self, client_id: str) -> ClientState:
        """Whether ``client_id`` counts for the voting policies, and its vote (on a tenants server: whether
        any tenant counts it as active; no vote stands there).

        Raises:
            RequestError: training is disabled on this server (409).
        """
        if self.tenants is not None:
            return ClientState(client_id=client_id, active=self.tenants.client_active(client_id), ready=False)
        votes = self.training().votes
        return ClientState(
            client_id=client_id, active=client_id in votes.active(), ready=client_id in votes.ready()
        )

    def metrics(self, since_step: int) -> list[ServerStepMetrics]:
        """Per-step training metrics after ``since_step``, oldest first (empty in inference mode)."""
        if self.training_loop is None:
            return []
        return [m for m in self.training_loop.history if m.step > since_step]

    async def checkpoint(self) -> CheckpointSaved:
        """Save weights, optimizer state and step now (waits for a running step to end).

        Raises:
            RequestError: training is disabled on this server (409).
        """
        step = await asyncio.to_thread(self.training().checkpoint)
        path: Path = self.config.run_dir / "checkpoints" / f"step-{step:06d}"
        return CheckpointSaved(step=step, path=str(path))
