"""Shared FastAPI dependencies: the runtime and episode keys as ``Annotated`` aliases, and the admin-token
check that the control router declares once for all its routes."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from swarm.errors import AuthError
from swarm.server.episodes import KEY_PREFIX, OpenEpisode
from swarm.server.runtime import SwarmRuntime

_bearer = HTTPBearer(auto_error=False)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def get_runtime(request: Request) -> SwarmRuntime:
    # async on purpose (all three dependencies here): FastAPI runs a sync dependency in its thread
    # pool, a thread hop per request that cost ~30 % of the server CPU of begin + finish.
    runtime: SwarmRuntime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[SwarmRuntime, Depends(get_runtime)]


async def get_episode(runtime: RuntimeDep, credentials: BearerDep) -> OpenEpisode:
    """The open episode named by ``Authorization: Bearer <episode key>`` (401 otherwise)."""
    if credentials is None:
        raise AuthError(
            "missing episode API key: send 'Authorization: Bearer <api_key from POST /api/v1/episodes>'"
        )
    return runtime.episode_for_key(credentials.credentials)


EpisodeDep = Annotated[OpenEpisode, Depends(get_episode)]


async def get_messages_episode(
    runtime: RuntimeDep, credentials: BearerDep, x_api_key: Annotated[str | None, Header()] = None
) -> OpenEpisode:
    """Anthropic clients: the episode key as ``x-api-key`` (the SDK's ``api_key``) or a bearer token."""
    if credentials is None and x_api_key:
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=x_api_key)
    return await get_episode(runtime, credentials)


async def require_admin(runtime: RuntimeDep, credentials: BearerDep, request: Request) -> None:
    """Control routes: the admin token when one is configured; episode keys are always refused (403).

    Without a configured token, control routes are open to loopback clients only.
    """
    token = runtime.config.admin_token
    given = credentials.credentials if credentials is not None else None
    if given is not None and given.startswith(KEY_PREFIX):
        raise AuthError("episode API keys cannot call control routes; use the admin token", status_code=403)
    if token is None:
        host = request.client.host if request.client else ""
        if host not in ("127.0.0.1", "::1", "localhost", "testclient"):
            raise AuthError(
                "control routes need an admin token when called from another host", status_code=403
            )
        return
    if given is None or not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise AuthError("missing or wrong admin token for a control route")
