"""What the episode routes do: begin (with its admission), finish, prepare, commit, abort, heartbeat, a
multi-server transaction's status and the token-level record of an episode.

`EpisodeService` composes the parts an episode's life touches (the open-episode table, the pool, the
state machine, the limits and, on a training server, the training loop's admission and client liveness);
each part keeps its own state. Everything here runs on the event loop thread.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from swarm.errors import EpisodeNotFound, Paused, RequestError, Unavailable
from swarm.pool import Pool, StoredEpisode
from swarm.protocol import (
    ADMIN_OWNER,
    EngineState,
    EpisodeAbort,
    EpisodeCreate,
    EpisodeCreated,
    EpisodeFinish,
    EpisodePrepare,
    EpisodeStatus,
    EpisodeView,
)
from swarm.server.auth import Credentials, Owner
from swarm.server.detokenizer import TokenizerDetokenizer
from swarm.server.episodes import OpenEpisodes
from swarm.server.limits import ClientLimits
from swarm.server.phase import Phase
from swarm.server.tenants import NO_TENANTS, TenantRegistry
from swarm.server.training import TrainingLoop
from swarm.tracking.merge import MergeMode, build_samples


@dataclass(kw_only=True, eq=False)
class EpisodeService:
    """The episode routes' service (`swarm.server.deps.EpisodesDep`); also what the credential checks
    read (`swarm.server.auth.Guarded`)."""

    episodes: OpenEpisodes
    pool: Pool
    """The stored episodes."""
    phase: Phase
    """The server's state machine (begin is refused unless it admits episodes)."""
    limits: ClientLimits
    credentials: Credentials
    training: TrainingLoop | None
    """The training loop (``None``: inference mode), for its admission and client liveness."""
    model_name: str
    """The served model, handed back at begin."""
    public_url: str | None
    """The server's public URL, when configured (else the base URL is read from the request)."""
    merge: MergeMode
    """How an episode's calls are merged into samples for its record."""
    detokenizer: TokenizerDetokenizer
    tenants: TenantRegistry | None = None
    """The LoRA tenants (``swarm serve --tenants N``): an episode begun under one is admitted by it."""
    _base_urls: dict[tuple[Any, ...], str] = field(default_factory=dict, init=False)
    """OpenAI base URLs handed out at begin, by the request parts they are built from (a memo)."""

    # -- begin ------------------------------------------------------------------------------------------
    def begin(self, body: EpisodeCreate, base_url: str, owner: Owner | None = None) -> EpisodeCreated:
        """Open an episode and mint its secret key.

        Args:
            body: what the client asked for.
            base_url: the OpenAI base URL handed back to the agent (`base_url`).
            owner: who is beginning it (`swarm.server.auth.Credentials.begin`; ``None``: nobody known).

        Raises:
            Unavailable: 429 + Retry-After when the owner's client token is over its open-episode or
                request-rate limit.
            Unavailable: the server is paused, or draining or training in synchronous mode (503 +
                Retry-After); a family quota is full (429) or, asynchronous, the trainer is too far
                behind (503). The same for the episode's tenant (`TenantRegistry.admit`).
            AuthError: the client token is limited to other tenants (403).
            RequestError: an unknown tenant (404), or a tenant on a server without tenants (409).
        """
        name = owner.name if owner is not None and owner.name != ADMIN_OWNER else None
        self.credentials.check_tenant(name, body.tenant)
        if name is not None:
            self.limits.check_open(name, self.episodes.open_by(name))
            self.limits.take(name)
        if not self.phase.admits():
            refusal = Paused if self.phase.state is EngineState.PAUSED else Unavailable
            raise refusal(f"the server is {self.phase.state.value}; no new episodes now", retry_after_s=2.0)
        if self.training is not None:
            self.training.admit(body.family, body.kind, body.task_id)
            self.training.touch(body.client_id)
        if body.tenant is not None:
            if self.tenants is None:
                raise RequestError(NO_TENANTS, status_code=409, param="tenant")
            self.tenants.admit(body)
        episode, key = self.episodes.begin(body, None if owner is None else owner.name)
        self.phase.episode_begun()
        if body.tenant is not None and self.tenants is not None:
            self.tenants.begun(body.tenant)
        return EpisodeCreated(episode_id=episode.id, base_url=base_url, api_key=key, model=self.model_name)

    def base_url(self, request: Request) -> str:
        """The OpenAI base URL an agent of an episode begun by ``request`` calls: the public URL when
        configured, else this server's address as the request reached it (``…/v1``)."""
        if self.public_url:
            return self.public_url.rstrip("/") + "/v1"
        # Starlette builds the base URL from these parts of the request (a URL object per request otherwise)
        scope = request.scope
        host = next((value for key, value in scope["headers"] if key == b"host"), None)
        parts = (
            scope.get("scheme"),
            scope.get("server"),
            host,
            scope.get("app_root_path"),
            scope.get("root_path"),
        )
        url = self._base_urls.get(parts)
        if url is None:
            url = str(request.base_url).rstrip("/") + "/v1"
            if len(self._base_urls) < 64:  # a few addresses of this server; never grown by odd Host headers
                self._base_urls[parts] = url
        return url

    # -- credentials ------------------------------------------------------------------------------------
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

    # -- end ----------------------------------------------------------------------------------------------
    def heartbeat(self, episode_id: str) -> None:
        """Keep an episode from being reclaimed; its client counts as alive for the voting policies."""
        self.episodes.heartbeat(episode_id)
        self._touch(self.episodes.require(episode_id).request.client_id)

    async def finish(self, episode_id: str, body: EpisodeFinish) -> StoredEpisode:
        """End an episode with its reward; returns once it is committed to the pool
        (`OpenEpisodes.finish_committed`: the commit runs on the pool writer's thread)."""
        return self._touched(await self.episodes.finish_committed(episode_id, body))

    def abort(self, episode_id: str, body: EpisodeAbort) -> StoredEpisode:
        """End an episode without a reward (`OpenEpisodes.abort`)."""
        return self._touched(self.episodes.abort(episode_id, body))

    def prepare(self, episode_id: str, body: EpisodePrepare) -> StoredEpisode:
        """Phase one of a multi-server finish (`OpenEpisodes.prepare`)."""
        return self._touched(self.episodes.prepare(episode_id, body))

    def commit(self, episode_id: str, txn_id: str) -> StoredEpisode:
        """Phase two of a multi-server finish (`OpenEpisodes.commit`)."""
        return self._touched(self.episodes.commit(episode_id, txn_id))

    def _touched(self, stored: StoredEpisode) -> StoredEpisode:
        self._touch(stored.client_id)
        return stored

    def _touch(self, client_id: str) -> None:
        """A sign of life from a client (liveness of the voting policies; nothing without training)."""
        if self.training is not None:
            self.training.touch(client_id)

    # -- read -----------------------------------------------------------------------------------------------
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
        """The token-level record of an open or ended episode, with its merged samples.

        Raises:
            EpisodeNotFound: no such episode (404).
        """
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
        samples, stats = build_samples(episode_id, calls, merge=self.merge, decode=self.detokenizer.decode)
        return EpisodeView(episode_id=episode_id, calls=calls, samples=samples, merge=stats, **base)
