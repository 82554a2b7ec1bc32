"""Control routes (admin token): status, metrics, live config, pause/resume, checkpoint, events.

Client readiness votes (``/api/v1/clients/{id}/ready``) need no admin token: clients cast them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from typing import Any

from fastapi import APIRouter
from fastapi.sse import EventSourceResponse, ServerSentEvent

from swarm.errors import RequestError
from swarm.protocol import StatusView
from swarm.server.deps import AdminDep, RuntimeDep
from swarm.server.training import ConfigPatch, ServerStepMetrics, TrainingLoop, Vote

router = APIRouter(prefix="/api/v1", tags=["control"])
votes_router = APIRouter(prefix="/api/v1/clients", tags=["episodes"])


@router.get("/status")
def status(runtime: RuntimeDep, _: AdminDep) -> StatusView:
    """Engine state, policy version, model and episode counts."""
    return runtime.status()


@router.get("/events", response_class=EventSourceResponse)
async def events(
    runtime: RuntimeDep, _: AdminDep, since: int = 0, follow: bool = True
) -> AsyncIterable[ServerSentEvent]:
    """Server-sent events: buffered events after ``since``, then live ones while ``follow`` is true."""
    handle = runtime.events.subscribe() if follow else None
    try:
        last = since
        for event in runtime.events.recent(since):
            last = event.seq
            yield ServerSentEvent(data=event.model_dump(), event=event.kind, id=str(event.seq))
        if handle is None:
            return
        queue = handle[1]
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), timeout=15.0)
            except TimeoutError:
                yield ServerSentEvent(comment="keep-alive")
                continue
            if event.seq <= last:
                continue
            last = event.seq
            yield ServerSentEvent(data=event.model_dump(), event=event.kind, id=str(event.seq))
    finally:
        if handle is not None:
            runtime.events.unsubscribe(handle)


def _training(runtime: RuntimeDep) -> TrainingLoop:
    if runtime.training is None:
        raise RequestError("training is disabled on this server (started in inference mode)", status_code=409)
    return runtime.training


@router.get("/metrics")
def metrics(runtime: RuntimeDep, _: AdminDep, since_step: int = 0) -> list[ServerStepMetrics]:
    """Per-step training metrics (the same objects as ``metrics.jsonl`` in the run dir)."""
    if runtime.training is None:
        return []
    return [m for m in runtime.training.history if m.step > since_step]


@router.get("/config")
def get_config(runtime: RuntimeDep, _: AdminDep) -> dict[str, Any]:
    """The configuration the next step will use."""
    return _training(runtime).effective_config()


@router.patch("/config")
def patch_config(body: ConfigPatch, runtime: RuntimeDep, _: AdminDep) -> dict[str, Any]:
    """Change lr, batch policy/size, group size, temperature, clip range, KL coefficient… live.

    Validated at once (422 on an invalid combination), effective from the next step, logged as a
    ``config.changed`` event.
    """
    changed = _training(runtime).apply(body)
    return {"changed": changed, "config": _training(runtime).effective_config()}


@router.post("/pause")
def pause(runtime: RuntimeDep, _: AdminDep) -> StatusView:
    """No new episodes and no training until resumed; open episodes keep being served."""
    runtime.pause()
    return runtime.status()


@router.post("/resume")
def resume(runtime: RuntimeDep, _: AdminDep) -> StatusView:
    runtime.resume()
    return runtime.status()


@router.post("/checkpoint")
async def checkpoint(runtime: RuntimeDep, _: AdminDep) -> dict[str, Any]:
    """Save weights, optimizer state and step now (waits for a running step to end)."""
    step = await asyncio.to_thread(_training(runtime).checkpoint)
    return {"step": step, "path": str(runtime.config.run_dir / "checkpoints" / f"step-{step:06d}")}


@votes_router.post("/{client_id}/ready")
async def vote(client_id: str, body: Vote, runtime: RuntimeDep) -> dict[str, Any]:
    """A client's readiness vote for the ``all_clients_ready`` / ``any_client_ready`` batch policies."""
    _training(runtime).vote(client_id, body.ready)
    return {"client_id": client_id, "ready": body.ready}
