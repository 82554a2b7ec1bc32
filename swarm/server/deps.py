"""Shared FastAPI pieces: the services routes depend on (``Annotated`` aliases, one per service) and the
OpenAPI declaration of JSON error answers (credentials are `swarm.server.auth`).

A route names the one service it uses, never the whole runtime: `EpisodesDep` (begin, finish, abort,
records), `ChatDep` (chat calls of both wire formats) or `ControlDep` (status, config, tokens, events,
votes, checkpoints). Each is read from the runtime the app's lifespan built (``app.state.runtime``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from swarm.errors import RequestError
from swarm.protocol import ErrorBody
from swarm.server.chat_service import ChatService
from swarm.server.control import ControlService
from swarm.server.episode_service import EpisodeService
from swarm.server.stopping import Stopping
from swarm.server.tenants import NO_TENANTS, TenantRegistry

# Every dependency here is async on purpose (those of the hot routes above all): FastAPI runs a sync
# dependency in its thread pool, a thread hop per request that cost ~30 % of the server CPU of begin +
# finish. Each is one attribute read, as the runtime dependency it replaces was.


async def get_episodes(request: Request) -> EpisodeService:
    service: EpisodeService = request.app.state.runtime.episode_service
    return service


async def get_chat(request: Request) -> ChatService:
    service: ChatService = request.app.state.runtime.chat
    return service


async def get_control(request: Request) -> ControlService:
    service: ControlService = request.app.state.runtime.control
    return service


async def get_stopping(request: Request) -> Stopping:
    """The server's stop, which long-lived responses watch (`swarm.server.stopping`)."""
    stopping: Stopping = request.app.state.stopping
    return stopping


async def get_tenants(request: Request) -> TenantRegistry:
    """The LoRA tenants; 409 on a server started without ``--tenants``."""
    tenants: TenantRegistry | None = request.app.state.runtime.tenants
    if tenants is None:
        raise RequestError(NO_TENANTS, status_code=409)
    return tenants


EpisodesDep = Annotated[EpisodeService, Depends(get_episodes)]
ChatDep = Annotated[ChatService, Depends(get_chat)]
ControlDep = Annotated[ControlService, Depends(get_control)]
TenantsDep = Annotated[TenantRegistry, Depends(get_tenants)]
StoppingDep = Annotated[Stopping, Depends(get_stopping)]


def error_models(*answers: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` declaring each ``(status, description)`` as an
    :class:`~swarm.protocol.ErrorBody` in the route's own (JSON) media type."""
    return {status: {"model": ErrorBody, "description": description} for status, description in answers}


def json_errors(*answers: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` declaring each ``(status, description)`` as a JSON
    :class:`~swarm.protocol.ErrorBody`, whatever the route's own media type (FastAPI declares a ``model``
    response in the route's media type, an event stream for an SSE route)."""
    schema = {"$ref": "#/components/schemas/ErrorBody"}
    return {
        status: {"description": description, "content": {"application/json": {"schema": schema}}}
        for status, description in answers
    }


ALLOW_HEADER = {
    "Allow": {
        "description": "The methods this path serves (RFC 9110 section 10.2.1; HEAD wherever GET is).",
        "schema": {"type": "string"},
    }
}
"""The header every 405 answer carries."""

METHOD_NOT_ALLOWED = (405, "A method this path does not serve; `Allow` lists those it does.")
"""The 405 every operation declares (with `ALLOW_HEADER`): its path answers the methods it does not serve."""
REQUEST_TIMEOUT = (
    408,
    "The request did not arrive whole in time (a body shorter than its Content-Length); answered by the "
    "HTTP layer in this JSON shape on every path, and the connection is closed.",
)
"""The 408 every operation declares (`swarm.server.http_protocol`)."""
HEAD_TOO_LARGE = (
    431,
    "The request's target and headers are larger than the server's limit (`swarm serve "
    "--max-header-bytes`); answered by the HTTP layer in this JSON shape on every path, and the connection "
    "is closed.",
)
"""The 431 every operation declares (`swarm.server.http_protocol`)."""
