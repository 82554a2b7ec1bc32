"""Episode routes: begin, finish, abort, heartbeat and the token-level record.

Beginning an episode needs no credential (clients are trusted to report rewards; put the server
behind a network boundary or an admin token for control). Finishing, aborting and heartbeats are
addressed by episode id; the id is not a secret, but the episode key is needed for completions.

Routes are ``async def``: they run on the event loop like the completion route, so the runtime's
episode table is only ever touched from one thread (pool commits take about a millisecond).
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from swarm.protocol import (
    Ack,
    EpisodeAbort,
    EpisodeCommit,
    EpisodeCreate,
    EpisodeCreated,
    EpisodeFinish,
    EpisodePrepare,
    EpisodeView,
)
from swarm.server.deps import RuntimeDep

router = APIRouter(prefix="/api/v1/episodes", tags=["episodes"])


def _base_url(runtime: RuntimeDep, request: Request) -> str:
    if runtime.config.public_url:
        return runtime.config.public_url.rstrip("/") + "/v1"
    return str(request.base_url).rstrip("/") + "/v1"


@router.post("", status_code=201)
async def begin_episode(body: EpisodeCreate, runtime: RuntimeDep, request: Request) -> EpisodeCreated:
    """Open an episode; the answer's ``api_key`` records every completion made with it."""
    return runtime.begin(body, _base_url(runtime, request))


@router.post("/{episode_id}/finish")
async def finish_episode(episode_id: str, body: EpisodeFinish, runtime: RuntimeDep) -> Ack:
    """End the episode with its reward; committed to the pool before the answer is sent."""
    stored = runtime.finish(episode_id, body)
    return Ack(episode_id=stored.id, status=stored.status.value)


@router.post("/{episode_id}/prepare")
async def prepare_episode(episode_id: str, body: EpisodePrepare, runtime: RuntimeDep) -> Ack:
    """Phase one of a multi-server finish: store the episode ``prepared`` with its reward (committed to the
    pool, not trainable until ``commit``); repeating it with the same ``txn_id`` answers again."""
    stored = runtime.prepare(episode_id, body)
    return Ack(episode_id=stored.id, status=stored.status.value)


@router.post("/{episode_id}/commit")
async def commit_episode(episode_id: str, body: EpisodeCommit, runtime: RuntimeDep) -> Ack:
    """Phase two: the prepared episode becomes ``finished`` (idempotent); 409 when its transaction was
    aborted here."""
    stored = runtime.commit(episode_id, body)
    return Ack(episode_id=stored.id, status=stored.status.value)


@router.post("/{episode_id}/abort")
async def abort_episode(episode_id: str, runtime: RuntimeDep, body: EpisodeAbort | None = None) -> Ack:
    """End the episode without a reward (``infra_failure=true`` keeps it out of group statistics).

    The body is optional: no body aborts with reason "aborted by client", not as an infra failure.
    """
    stored = runtime.abort(episode_id, body or EpisodeAbort())
    return Ack(episode_id=stored.id, status=stored.status.value)


@router.post("/{episode_id}/heartbeat")
async def heartbeat(episode_id: str, runtime: RuntimeDep) -> Ack:
    """Keep a slow episode from being reclaimed as idle."""
    runtime.heartbeat(episode_id)
    return Ack(episode_id=episode_id, status="open")


@router.get("/{episode_id}")
async def get_episode(episode_id: str, runtime: RuntimeDep) -> EpisodeView:
    """Token-level record: every call (prompt ids, completion ids, logprobs, …) and the merged samples."""
    return runtime.view(episode_id)
