"""Shared FastAPI pieces: the dependency on the server runtime (an ``Annotated`` alias) and the OpenAPI
declaration of JSON error answers (credentials are `swarm.server.auth`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from swarm.server.runtime import SwarmRuntime


async def get_runtime(request: Request) -> SwarmRuntime:
    # async on purpose (every dependency of the hot routes): FastAPI runs a sync dependency in its
    # thread pool, a thread hop per request that cost ~30 % of the server CPU of begin + finish.
    runtime: SwarmRuntime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[SwarmRuntime, Depends(get_runtime)]


def json_errors(*answers: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` declaring each ``(status, description)`` as a JSON
    :class:`~swarm.protocol.ErrorBody`, whatever the route's own media type (FastAPI declares a ``model``
    response in the route's media type, an event stream for an SSE route)."""
    schema = {"$ref": "#/components/schemas/ErrorBody"}
    return {
        status: {"description": description, "content": {"application/json": {"schema": schema}}}
        for status, description in answers
    }
