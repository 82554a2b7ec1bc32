"""Episode routes: begin, finish, abort, heartbeat and the token-level record.

Credentials (`swarm.server.auth`): on a server with client tokens, beginning needs one; on every server an
episode is finished, aborted, heartbeated and read only with its episode key, the client token that began
it or the admin token (401 without a credential, 403 with a wrong one).

Every route depends on the episode service (`swarm.server.deps.EpisodesDep`). Routes are ``async def``:
they run on the event loop like the completion route, so the episode table is only ever touched from one
thread (pool commits take about a millisecond).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from swarm.protocol import (
    Ack,
    EpisodeAbort,
    EpisodeCommit,
    EpisodeCreate,
    EpisodeCreated,
    EpisodeFinish,
    EpisodePrepare,
    EpisodeView,
    NoOptions,
)
from swarm.server.auth import OwnerDep, check_episode_access
from swarm.server.deps import EpisodesDep, error_models
from swarm.server.lean_route import LeanRoute

_AUTH = (
    (401, "No credential (begin: on a server with client tokens)."),
    (403, "A wrong credential: unknown, revoked, or another episode's."),
)
_EPISODE = error_models(*_AUTH, (404, "No such episode."))
_ENDED = error_models(
    *_AUTH, (404, "No such episode."), (409, "The episode has ended, or (finish) a call of it is running.")
)
_BUSY = error_models(
    *_AUTH,
    (404, "No such tenant (or it is retired)."),
    (409, "A tenant named on a server that hosts none, or a tenant being created or retired."),
    (429, "A quota or a client token's limit is full; see Retry-After."),
    (503, "Paused (error type `paused`: the server or the tenant), draining or training; see Retry-After."),
)

router = APIRouter(prefix="/api/v1/episodes", tags=["episodes"], route_class=LeanRoute)
episode_router = APIRouter(
    prefix="/api/v1/episodes",
    tags=["episodes"],
    dependencies=[Depends(check_episode_access)],
    route_class=LeanRoute,
)


@router.post("", status_code=201, responses=_BUSY)
async def begin_episode(
    body: EpisodeCreate, episodes: EpisodesDep, owner: OwnerDep, request: Request
) -> EpisodeCreated:
    """Open an episode (with a client token where the server has any); the answer's ``api_key`` records
    every completion made with it and finishes, aborts or reads this episode only."""
    return episodes.begin(body, episodes.base_url(request), owner)


@episode_router.post("/{episode_id}/finish", responses=_ENDED)
async def finish_episode(episode_id: str, body: EpisodeFinish, episodes: EpisodesDep) -> Ack:
    """End the episode with its reward; committed to the pool before the answer is sent."""
    stored = await episodes.finish(episode_id, body)
    return Ack(episode_id=stored.id, status=stored.status.value)


@episode_router.post("/{episode_id}/prepare", responses=_ENDED)
async def prepare_episode(episode_id: str, body: EpisodePrepare, episodes: EpisodesDep) -> Ack:
    """Phase one of a multi-server finish: store the episode ``prepared`` with its reward (committed to the
    pool, not trainable until ``commit``); repeating it with the same ``txn_id`` answers again."""
    stored = episodes.prepare(episode_id, body)
    return Ack(episode_id=stored.id, status=stored.status.value)


@episode_router.post("/{episode_id}/commit", responses=_ENDED)
async def commit_episode(episode_id: str, body: EpisodeCommit, episodes: EpisodesDep) -> Ack:
    """Phase two: the prepared episode becomes ``finished`` (idempotent); 409 when its transaction was
    aborted here."""
    stored = episodes.commit(episode_id, body.txn_id)
    return Ack(episode_id=stored.id, status=stored.status.value)


@episode_router.post("/{episode_id}/abort", responses=_ENDED)
async def abort_episode(episode_id: str, episodes: EpisodesDep, body: EpisodeAbort | None = None) -> Ack:
    """End the episode without a reward (``infra_failure=true`` keeps it out of group statistics).

    The body is optional: no body aborts with reason "aborted by client", not as an infra failure.
    """
    stored = episodes.abort(episode_id, body or EpisodeAbort())
    return Ack(episode_id=stored.id, status=stored.status.value)


@episode_router.post("/{episode_id}/heartbeat", responses=_ENDED)
async def heartbeat(episode_id: str, episodes: EpisodesDep, body: NoOptions | None = None) -> Ack:
    """Keep a slow episode from being reclaimed as idle."""
    episodes.heartbeat(episode_id)
    return Ack(episode_id=episode_id, status="open")


@router.get("/{episode_id}/transactions/{txn_id}", responses=_EPISODE)
async def transaction_status(episode_id: str, txn_id: str, episodes: EpisodesDep) -> Ack:
    """A member's status in a multi-server finish, for the other members' servers resolving a stale
    prepare (docs/ARCHITECTURE.md §Multi-server finish). The transaction id is the credential: only an
    episode prepared with it answers, and only its status (404 otherwise)."""
    return Ack(episode_id=episode_id, status=episodes.transaction_status(episode_id, txn_id))


@episode_router.get("/{episode_id}", responses=_EPISODE)
async def get_episode(episode_id: str, episodes: EpisodesDep) -> EpisodeView:
    """Token-level record: every call (prompt ids, completion ids, logprobs, …) and the merged samples."""
    return episodes.view(episode_id)
