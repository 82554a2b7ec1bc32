"""The FastAPI app factory: routers, lifespan (model load, pool open) and the JSON error body."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Scope

from swarm.config import ServerConfig
from swarm.engine.base import Engine
from swarm.errors import SwarmError, Unavailable
from swarm.protocol import ErrorBody, ErrorDetail
from swarm.server import anthropic_format, anthropic_routes, control_routes, episode_routes, openai_routes
from swarm.server.deps import json_errors
from swarm.server.lean_route import HotRoutes
from swarm.server.limits import BodySizeLimit
from swarm.server.runtime import SwarmRuntime

ANTHROPIC_PATH = "/v1/messages"
"""Errors of routes under this path have Anthropic's shape (``{"type": "error", "error": {...}}``)."""


def _error(
    request: Request,
    status: int,
    type_: str,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    if request.url.path.startswith(ANTHROPIC_PATH):  # Anthropic's shape; a bad body is a 400 there
        status = 400 if status == 422 else status
        where = f"{param}: " if param and not message.startswith(param) else ""
        body = anthropic_format.error_body(status, where + message)
        return JSONResponse(body, status_code=status, headers=headers)
    detail = ErrorBody(error=ErrorDetail(type=type_, message=message, param=param))
    return JSONResponse(detail.model_dump(exclude_none=True), status_code=status, headers=headers)


async def _swarm_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SwarmError)
    headers = None
    if isinstance(exc, Unavailable):
        headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    return _error(request, exc.status_code, exc.error_type, str(exc), getattr(exc, "param", None), headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":  # its location is a character offset, not a field
            problems.append(
                f"the body is not valid JSON ({(err.get('ctx') or {}).get('error', 'decode error')})"
            )
            continue
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "not a supported field (refused rather than ignored)"
        problems.append(f"{loc or 'body'}: {msg}")
    first = exc.errors()[0] if exc.errors() else {}
    # a JSON syntax error's location is a character offset, not a field
    first_loc = () if first.get("type") == "json_invalid" else first.get("loc", ())
    param = ".".join(str(p) for p in first_loc if p != "body") or None
    return _error(request, 422, "invalid_request_error", "; ".join(problems) or "invalid request", param)


_UNPARSABLE = "There was an error parsing the body"
"""FastAPI's 400 detail for a body it cannot even decode (e.g. not UTF-8)."""

ERROR_RESPONSES = json_errors(
    (413, "The request body is larger than the server's limit."),
    (422, "Invalid input: the message names the field (`param`)."),
)
"""Error answers any route may give, declared on every router with the JSON :class:`ErrorBody` (FastAPI
would declare its own ``HTTPValidationError`` for 422, which is not what the server sends)."""


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == _UNPARSABLE:  # as a JSON syntax error: 422
        return _error(
            request, 422, "invalid_request_error", "the body is not valid JSON (it cannot be decoded)"
        )
    kinds = {404: "not_found", 413: "request_too_large"}
    return _error(request, exc.status_code, kinds.get(exc.status_code, "http_error"), str(exc.detail))


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    return _error(request, 500, "server_error", f"internal error: {type(exc).__name__}")


def _body_limit(scope: Scope) -> int | None:
    """The runtime's current body-size limit (``None`` before the lifespan has built the runtime)."""
    runtime: SwarmRuntime | None = getattr(scope["app"].state, "runtime", None)
    return None if runtime is None else runtime.limits.max_body_bytes


HOT_PATHS = frozenset(
    {
        ("POST", "/api/v1/episodes"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/api/v1/episodes/{episode_id}/finish"),
    }
)
"""The routes every episode calls (begin, a chat completion, finish), served by `HotRoutes` once routed
(`swarm.server.lean_route`); no route declared before them matches their paths."""


class SwarmApp(FastAPI):
    """FastAPI with `HotRoutes` (:attr:`hot_routes`) between its exception middleware and its router."""

    hot_routes: HotRoutes | None = None

    def build_middleware_stack(self) -> ASGIApp:
        router = self.router
        # FastAPI's stack ends in ``self.router``: put the shortcut there while the stack is built, so that
        # it runs inside the exception middleware (errors are answered by the app's handlers as before).
        self.hot_routes = HotRoutes(router, HOT_PATHS)
        self.router = self.hot_routes  # type: ignore[assignment]
        try:
            return super().build_middleware_stack()
        finally:
            self.router = router


def create_app(config: ServerConfig, engine: Engine | None = None) -> FastAPI:
    """Build the swarm server app; the model loads in the lifespan (``engine`` injects a shared one)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await asyncio.to_thread(SwarmRuntime, config, engine)
        app.state.runtime = runtime
        tasks = [asyncio.create_task(runtime.reclaim_loop())]
        if runtime.training is not None:
            tasks.append(asyncio.create_task(runtime.training.run()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            runtime.close()

    extra: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        # FastAPI >= 0.16x checks OpenTelemetry settings on every request; the control plane is hot.
        extra["telemetry"] = {"tracing": False, "metrics": False, "logs": False}
    app = SwarmApp(
        title="swarm server",
        version="0.1.0",
        summary="OpenAI-compatible serving with token-exact episode recording and RL training.",
        lifespan=lifespan,
        **extra,
    )
    app.add_middleware(BodySizeLimit, limit=_body_limit)
    app.add_exception_handler(SwarmError, _swarm_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unhandled)
    for router in (
        openai_routes.router,
        episode_routes.router,
        episode_routes.episode_router,
        control_routes.router,
        control_routes.votes_router,
    ):
        app.include_router(router, responses=ERROR_RESPONSES)
    app.include_router(anthropic_routes.router)  # declares its own errors, in Anthropic's shape
    return app
