"""The shared FastAPI dependency on the server runtime, as an ``Annotated`` alias (credentials are
`swarm.server.auth`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from swarm.server.runtime import SwarmRuntime


async def get_runtime(request: Request) -> SwarmRuntime:
    # async on purpose (every dependency of the hot routes): FastAPI runs a sync dependency in its
    # thread pool, a thread hop per request that cost ~30 % of the server CPU of begin + finish.
    runtime: SwarmRuntime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[SwarmRuntime, Depends(get_runtime)]
