"""Control routes (admin token): status, events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable

from fastapi import APIRouter
from fastapi.sse import EventSourceResponse, ServerSentEvent

from swarm.protocol import StatusView
from swarm.server.deps import AdminDep, RuntimeDep

router = APIRouter(prefix="/api/v1", tags=["control"])


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
