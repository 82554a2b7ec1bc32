"""Control routes (admin token): status, metrics, live config, pause/resume, checkpoint, events.

The admin check is declared once, on ``router``; every answer is a :mod:`swarm.protocol` model, so the
OpenAPI schema is the contract the client reads. Client readiness votes (``/api/v1/clients/{id}/ready``)
need no admin token: clients cast them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from swarm.protocol import (
    CheckpointSaved,
    ClientState,
    ClientTokenCreate,
    ClientTokenCreated,
    ClientTokenRevoked,
    ClientTokenView,
    ConfigChanged,
    ConfigPatch,
    ConfigView,
    Event,
    NoOptions,
    ServerStepMetrics,
    StatusView,
    Vote,
    VoteCast,
)
from swarm.server.auth import require_admin, require_client
from swarm.server.control import ControlService, Subscription
from swarm.server.deps import ControlDep, StoppingDep, error_models, json_errors
from swarm.server.stopping import Stopping
from swarm.server.streaming import encode_events, event_stream_answer


def _guarded_router(prefix: str, tag: str, guard: Callable[..., Any], *errors: tuple[int, str]) -> APIRouter:
    """A router whose every route runs ``guard`` first and documents the statuses the guard sends."""
    return APIRouter(
        prefix=prefix, tags=[tag], dependencies=[Depends(guard)], responses=error_models(*errors)
    )


router = _guarded_router(
    "/api/v1",
    "control",
    require_admin,
    (401, "Missing or wrong admin token."),
    (
        403,
        "A wrong admin token, an episode key or a client token, or no admin token configured and a "
        "caller from another host.",
    ),
)
votes_router = _guarded_router(
    "/api/v1/clients",
    "episodes",
    require_client,
    (401, "No client token, on a server with client tokens."),
    (403, "A wrong client token (unknown or revoked) or an episode key."),
    (429, "The client token's request rate is reached; see Retry-After."),
)

_NO_TRAINING = error_models((409, "Training is disabled on this server."))
_NO_VOTES = error_models(
    (409, "Training is disabled on this server, or it hosts tenants (their batch policies take no votes).")
)


def _sse(event: Event) -> ServerSentEvent:
    return ServerSentEvent(data=event.model_dump(), event=event.kind, id=str(event.seq))


@router.get("/status", response_model_exclude_none=True)  # `distill` only with a teacher
def status(control: ControlDep) -> StatusView:
    """Engine state, policy version, model and episode counts."""
    return control.status()


async def _event_subscription(
    control: ControlDep, follow: bool = True, tenant: str | None = None
) -> AsyncIterator[Subscription | None]:
    """A live follower's subscription, taken before the stream starts and held until the response ends.

    The check and the subscription happen in one step on the event loop, so simultaneous connects
    cannot all pass the check before any of them subscribes.

    Raises:
        RequestError: ``tenant`` names no tenant, resident or retired, of a tenants server (404).
        Unavailable: ``limits.max_event_subscribers`` clients already follow (503 + Retry-After).
    """
    if tenant is not None and control.tenants is not None:
        control.tenants.known(tenant)
    if not follow:
        yield None
        return
    handle = control.follow()
    try:
        yield handle
    finally:
        control.events.unsubscribe(handle)


_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""What FastAPI's own event streams send: no cache, and no buffering in an nginx in front."""


@router.get(
    "/events",
    response_class=StreamingResponse,  # its media type is the stream's (the 200 below), not JSON
    responses={
        200: event_stream_answer("Server-sent events, each an `Event` as JSON `data`."),
        **json_errors(
            (401, "Missing admin token."),
            (403, "A wrong admin token, an episode key or a client token, or a caller from another host."),
            (404, "`tenant` names no tenant (resident or retired) of this tenants server."),
            (503, "Too many followers; see Retry-After."),
        ),
    },
)
async def events(
    control: ControlDep,
    handle: Annotated[Subscription | None, Depends(_event_subscription)],
    stopping: StoppingDep,
    since: int = 0,
    follow: bool = True,
    tenant: str | None = None,
) -> EventSourceResponse:
    """Server-sent events, each an :class:`~swarm.protocol.Event` as JSON ``data`` (``event`` = its kind,
    ``id`` = its seq): buffered events after ``since``, then live ones while ``follow`` is true, until
    the server stops (its last event is ``server.stopping``; the stream then ends). ``tenant`` keeps only
    the events of that LoRA tenant (`Event.tenant`: its steps, checkpoints, episodes and lifecycle)."""
    # Returned as a response rather than written as a generator route: FastAPI's generator routes pass
    # events through a keep-alive task whose send raised BrokenResourceError (a traceback in the log)
    # when a follower left while an event was waiting for it; this stream has its own keep-alive.
    stream = _event_stream(control, handle, stopping, since, tenant)
    return EventSourceResponse(encode_events(stream), headers=_STREAM_HEADERS)


async def _event_stream(
    control: ControlService, handle: Subscription | None, stopping: Stopping, since: int, tenant: str | None
) -> AsyncGenerator[ServerSentEvent, None]:
    """The events of ``GET /api/v1/events`` (see `events`): the buffer after ``since``, then, with a
    subscription ``handle``, live ones until the server stops, a keep-alive comment after every
    `KEEP_ALIVE_S` without one."""
    last = since
    for event in control.events.recent(since):
        last = event.seq
        if _concerns(event, tenant):
            yield _sse(event)
    if handle is None:
        return
    queue = handle[1]
    stopped = asyncio.ensure_future(stopping.wait())
    received: asyncio.Future[Event] | None = None
    try:
        while True:
            received = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait(
                (received, stopped), timeout=KEEP_ALIVE_S, return_when="FIRST_COMPLETED"
            )
            if received not in done:
                received.cancel()  # an item it had taken stays in the queue (asyncio.Queue.get)
                if stopped not in done:
                    yield ServerSentEvent(comment="keep-alive")
                    continue
                for event in _drain(queue):  # what was emitted before the stop (``server.stopping``)
                    if event.seq > last:
                        last = event.seq
                        if _concerns(event, tenant):
                            yield _sse(event)
                return
            event = received.result()
            if event.seq <= last:
                continue
            last = event.seq
            if _concerns(event, tenant):
                yield _sse(event)
    finally:
        stopped.cancel()
        if received is not None:  # a follower that left while waiting: its get must not be left pending
            received.cancel()  # (asyncio logged "Task was destroyed but it is pending!" for each)


def _concerns(event: Event, tenant: str | None) -> bool:
    """Whether ``event`` passes the ``tenant`` filter of ``GET /api/v1/events`` (``None``: every event)."""
    return tenant is None or event.tenant == tenant


KEEP_ALIVE_S = 15.0
"""A follower with no event for this long gets an SSE comment (seconds), so that proxies keep the stream."""


def _drain(queue: asyncio.Queue[Event]) -> list[Event]:
    """What ``queue`` holds now, emptied."""
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


@router.get("/metrics")
def metrics(control: ControlDep, since_step: int = 0) -> list[ServerStepMetrics]:
    """Per-step training metrics after ``since_step``, oldest first (the rows of ``metrics.jsonl``;
    empty on a server in inference mode)."""
    return control.metrics(since_step)


@router.get("/config")
def get_config(control: ControlDep) -> ConfigView:
    """The configuration the next step will use, and the limits in force (on a server in inference
    mode: the sampling defaults and the limits, which stay patchable, with an empty ``training``)."""
    return control.config_view()


@router.patch("/config", responses=_NO_TRAINING)
def patch_config(body: ConfigPatch, control: ControlDep) -> ConfigChanged:
    """Change lr, batch policy/size, group size, temperature, clip range, KL coefficient… live.

    Validated at once (422 on an invalid combination), effective from the next step, logged as a
    ``config.changed`` event. ``limits`` changes (:class:`~swarm.protocol.LimitsPatch`) apply at once,
    on a server in inference mode too (409 there for any other field).
    """
    return control.patch_config(body)


@router.get("/client-tokens")
def client_tokens(control: ControlDep) -> list[ClientTokenView]:
    """The client tokens that work now, by name, with their open episodes and the tenants each is limited
    to (never the secrets)."""
    return [
        ClientTokenView(
            name=name,
            open_episodes=control.episodes.open_by(name),
            tenants=control.credentials.tenants_of(name),
        )
        for name in control.credentials.names()
    ]


@router.post(
    "/client-tokens",
    status_code=201,
    responses=error_models(
        (409, "The name or the secret is already in use, or `tenants` on a server that hosts no tenants.")
    ),
)
def add_client_token(body: ClientTokenCreate, control: ControlDep) -> ClientTokenCreated:
    """Add a client token at once (the server mints one when ``token`` is left out); from now on every
    begin needs a client token. The answer is the only place the server ever shows it."""
    return ClientTokenCreated(
        name=body.name, token=control.add_client_token(body.name, body.token, body.tenants)
    )


@router.delete(
    "/client-tokens/{name}",
    responses=error_models((404, "No client token has this name.")),
)
def revoke_client_token(name: str, control: ControlDep) -> ClientTokenRevoked:
    """Revoke a client token at once: it no longer begins, finishes or reads anything (its open episodes
    keep their episode keys until they end)."""
    return ClientTokenRevoked(name=name, open_episodes=control.revoke_client_token(name))


@router.post("/pause", response_model_exclude_none=True)  # `distill` only with a teacher
def pause(control: ControlDep, body: NoOptions | None = None) -> StatusView:
    """No new episodes and no training until resumed; open episodes keep being served."""
    control.pause()
    return control.status()


@router.post("/resume", response_model_exclude_none=True)  # `distill` only with a teacher
def resume(control: ControlDep, body: NoOptions | None = None) -> StatusView:
    control.resume()
    return control.status()


@router.post("/checkpoint", responses=_NO_TRAINING)
async def checkpoint(control: ControlDep, body: NoOptions | None = None) -> CheckpointSaved:
    """Save weights, optimizer state and step now (waits for a running step to end)."""
    return await control.checkpoint()


@votes_router.post("/{client_id}/ready", responses=_NO_VOTES)
async def vote(client_id: str, control: ControlDep, body: Vote | None = None) -> VoteCast:
    """A client's readiness vote for the ``all_clients_ready`` / ``any_client_ready`` batch policies.

    The body is optional: no body votes ready (``{"ready": true}``), as ``{}`` does."""
    ready = (body or Vote()).ready
    control.vote(client_id, ready)
    return VoteCast(client_id=client_id, ready=ready)


@votes_router.post("/{client_id}/heartbeat", responses=_NO_TRAINING)
async def client_heartbeat(client_id: str, control: ControlDep, body: NoOptions | None = None) -> ClientState:
    """A client's sign of life between episodes: it stays active for the voting policies (a client silent
    for the server's client timeout stops counting, so a dead one cannot block ``all_clients_ready``)."""
    control.liveness().touch(client_id)
    return control.client_state(client_id)


@votes_router.delete("/{client_id}", responses=_NO_TRAINING)
async def client_leave(client_id: str, control: ControlDep) -> ClientState:
    """A client says goodbye: it and its vote no longer count (its finished episodes are still trained)."""
    control.liveness().leave(client_id)
    return control.client_state(client_id)
