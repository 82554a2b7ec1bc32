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
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from swarm.config import ServerConfig
from swarm.engine.base import Engine
from swarm.errors import SwarmError, Unavailable, quoted
from swarm.protocol import ErrorBody, ErrorDetail
from swarm.server import (
    anthropic_format,
    anthropic_routes,
    control_routes,
    episode_routes,
    openai_routes,
    score_routes,
    tenant_routes,
)
from swarm.server.auth import check_before_body, optional_security
from swarm.server.deps import (
    ALLOW_HEADER,
    HEAD_TOO_LARGE,
    METHOD_NOT_ALLOWED,
    REQUEST_TIMEOUT,
    json_errors,
)
from swarm.server.lean_route import HotRoutes, is_json_type, lean_routes_on, replayed
from swarm.server.limits import BodySizeLimit
from swarm.server.runtime import SwarmRuntime
from swarm.server.stopping import Stopping

ANTHROPIC_PATH = "/v1/messages"
"""Errors of routes under this path have Anthropic's shape (``{"type": "error", "error": {...}}``)."""


def _error(
    request: Request,
    status: int,
    type_: str,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    code: str | None = None,
) -> JSONResponse:
    if request.url.path.startswith(ANTHROPIC_PATH):  # Anthropic's shape; a bad body is a 400 there
        status = 400 if status == 422 else status
        where = f"{param}: " if param and not message.startswith(param) else ""
        body = anthropic_format.error_body(status, where + message)
        return JSONResponse(body, status_code=status, headers=headers)
    detail = ErrorBody(error=ErrorDetail(type=type_, message=message, param=param, code=code))
    return JSONResponse(detail.model_dump(exclude_none=True), status_code=status, headers=headers)


async def _swarm_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SwarmError)
    headers = None
    if isinstance(exc, Unavailable):
        headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
    param = getattr(exc, "param", None)
    return _error(request, exc.status_code, exc.error_type, str(exc), param, headers, exc.error_code)


_NOT_JSON = "the body is not valid JSON"
"""How every body that cannot be parsed begins its 400 answer (OpenAI and Anthropic answer 400 too)."""


_WANTS_JSON = "this route needs a JSON body sent with 'Content-Type: application/json'"
"""How a 415 and a missing body's 422 begin: what the route takes."""


def _body_missing(errors: list[Any]) -> bool:
    """Whether the route's required body was not sent at all (FastAPI: ``missing`` at ``("body",)``; an
    empty body is no body)."""
    return any(tuple(err.get("loc", ())) == ("body",) and err.get("type") == "missing" for err in errors)


def _mislabelled(request: Request, errors: list[Any]) -> str | None:
    """How the request's ``Content-Type`` reads in a 415 (``"'text/plain'"``, or ``"missing"``) when it is
    not JSON and the body was refused as a whole (FastAPI validates such a body as raw bytes: "Input should
    be a valid dictionary", or finds none: ``missing``), else ``None``."""
    content_type = request.headers.get("content-type")
    if is_json_type(content_type):
        return None
    whole = [err for err in errors if tuple(err.get("loc", ())) == ("body",)]
    if content_type:
        return quoted(content_type) if whole else None
    return "missing" if whole else None


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """A body that does not validate: 422 naming the field (400 on Anthropic's routes); a body that is not
    JSON: 400 on every route; a body sent with a content type that is not JSON, or a request with neither
    a body nor a content type where the route needs a body: 415 saying so; a JSON content type with an
    empty body where the route needs one: 422 saying that the body is empty."""
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    content_type = _mislabelled(request, errors)
    if content_type is not None:
        if content_type == "missing" and _body_missing(errors):
            message = f"{_WANTS_JSON}; this request has no body and no Content-Type"
        else:
            message = (
                f"the body must be JSON sent with 'Content-Type: application/json'; this request's "
                f"Content-Type is {content_type}"
            )
        return _error(request, 415, "invalid_request_error", message)
    if _body_missing(errors):
        return _error(request, 422, "invalid_request_error", f"{_WANTS_JSON}; this request's body is empty")
    if any(err.get("type") == "json_invalid" for err in errors):
        refused = await _credentials_first(request)
        if refused is not None:
            return refused
    problems = []
    for err in errors:
        if err.get("type") == "json_invalid":  # its location is a character offset, not a field
            problems.append(f"{_NOT_JSON} ({(err.get('ctx') or {}).get('error', 'decode error')})")
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
    status = 400 if any(err.get("type") == "json_invalid" for err in exc.errors()) else 422
    return _error(request, status, "invalid_request_error", "; ".join(problems) or "invalid request", param)


async def _credentials_first(request: Request) -> JSONResponse | None:
    """The route's credential refusal (`check_before_body`) for a body that could not be parsed, which
    FastAPI reports before the route's dependencies run; ``None`` when the credentials pass."""
    try:
        await check_before_body(request)
    except SwarmError as exc:
        return await _swarm_error(request, exc)
    return None


_UNPARSABLE = "There was an error parsing the body"
"""FastAPI's 400 detail for a body it cannot even decode (e.g. not UTF-8)."""

ERROR_RESPONSES = json_errors(
    (400, "The body is not valid JSON (or not UTF-8)."),
    METHOD_NOT_ALLOWED,
    REQUEST_TIMEOUT,
    (413, "The request body is larger than the server's limit."),
    (415, "A body sent with a Content-Type that is not JSON, or without one."),
    (422, "Invalid input: the message names the field (`param`)."),
    HEAD_TOO_LARGE,
)
ERROR_RESPONSES[405]["headers"] = ALLOW_HEADER
"""Error answers any route may give, declared on every router with the JSON :class:`ErrorBody` (FastAPI
would declare its own ``HTTPValidationError`` for 422, which is not what the server sends)."""


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == _UNPARSABLE:  # as a JSON syntax error: 400
        refused = await _credentials_first(request)
        if refused is not None:
            return refused
        return _error(request, 400, "invalid_request_error", f"{_NOT_JSON} (it cannot be decoded)")
    kinds = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
    headers = dict(exc.headers or {})
    message = str(exc.detail)
    if exc.status_code == 405:  # RFC 9110: every method the resource has, not only the matched route's
        headers["Allow"] = ", ".join(_allowed_methods(request))
        message = f"method {request.method} not allowed on {request.url.path}; it takes {headers['Allow']}"
    kind = kinds.get(exc.status_code, "http_error")
    return _error(request, exc.status_code, kind, message, headers=headers or None)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> list[str]:
    """The methods some route serves at the request's path, HEAD included wherever GET is (`SwarmApp`),
    asked of each route through Starlette's ``matches`` with the method swapped: FastAPI (0.16x) wraps
    included routers in objects without ``path_regex``/``methods``, so reading those attributes found
    nothing."""
    routes, scope = request.app.router.routes, request.scope
    served = [
        method
        for method in _METHODS
        if any(route.matches({**scope, "method": method})[0] is Match.FULL for route in routes)
    ]
    if "GET" in served and "HEAD" not in served:
        served.insert(served.index("GET") + 1, "HEAD")
    return served


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    return _error(request, 500, "server_error", f"internal error: {type(exc).__name__}")


def _body_limit(scope: Scope) -> int | None:
    """The runtime's current body-size limit (``None`` before the lifespan has built the runtime)."""
    runtime: SwarmRuntime | None = getattr(scope["app"].state, "runtime", None)
    return None if runtime is None else runtime.limits.limits.max_body_bytes


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
    """FastAPI whose hot routes (`HOT_PATHS`, once routed) skip its router and most of its middleware.

    A request :attr:`hot_routes` matches goes through a short stack built from the app's own parts:
    Starlette's ``ServerErrorMiddleware`` with the app's 500 handler, the app's user middleware (the
    body-size limit), Starlette's ``ExceptionMiddleware`` with the app's other handlers, then the route's
    lean plan (`swarm.server.lean_route`). Errors are therefore answered by the same handlers in the same
    order as through the full stack. What the short stack leaves out does nothing for these routes:
    FastAPI's ``AsyncExitStackMiddleware`` (closes uploaded files; the hot routes take JSON), its
    ``ExceptionTelemetryMiddleware`` (telemetry is off, see `create_app`) and its
    ``AppBodyLimitMiddleware`` (the short stack is only used when FastAPI's ``max_body_size`` is unset).
    A request the plan declines (invalid, unusual, a wrong credential) is handed to the full app with its
    body replayed, so FastAPI answers it exactly as before. Outside the tested framework versions
    (`lean_routes_on`) there is no short stack: every request takes the full app.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state.stopping = Stopping()  # the routes read it (`swarm.server.deps.get_stopping`)
        self.hot_routes = HotRoutes(HOT_PATHS)
        self._hot_stack: ASGIApp | None = None
        self._documents: dict[tuple[bool, bool], dict[str, Any]] = {}

    def begin_stop(self) -> None:
        """The server's stop begins: log it (``server.stopping``) and end the responses that would
        outlive it (`swarm.server.stopping`). ``swarm serve`` calls it before uvicorn waits for the open
        connections; idempotent."""
        stopping: Stopping = self.state.stopping
        if stopping.is_set():
            return
        runtime: SwarmRuntime | None = getattr(self.state, "runtime", None)
        if runtime is not None:  # before the followers' streams end, so that it is the last they read
            runtime.events.emit(
                "server.stopping",
                f"stopping: ending {runtime.events.subscribers()} event stream(s) and every live chat stream",
            )
            runtime.interrupt_training()
        stopping.set()

    def _get_only(self, scope: Scope) -> bool:
        """Whether a route serves GET at ``scope``'s path and none serves HEAD there."""
        routes = self.router.routes
        return not any(route.matches(scope)[0] is Match.FULL for route in routes) and any(
            route.matches({**scope, "method": "GET"})[0] is Match.FULL for route in routes
        )

    def openapi(self) -> dict[str, Any]:
        """The OpenAPI document as this server enforces credentials now (`auth.optional_security`: which
        operations need none depends on its tokens, and a client token added live changes it)."""
        first = self.openapi_schema is None
        document = super().openapi()
        if first:
            _link_begin(document)
        runtime: SwarmRuntime | None = getattr(self.state, "runtime", None)
        if runtime is None:
            return document
        credentials = runtime.credentials
        key = (credentials.required, credentials.has_admin)
        if key not in self._documents:
            self._documents[key] = optional_security(document, self.routes, credentials)
        return self._documents[key]

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        own_limit = getattr(self, "max_body_size", None) is not None
        self._hot_stack = None if own_limit or not lean_routes_on() else self._short_stack()
        return stack

    def _short_stack(self) -> ASGIApp:
        """What `build_middleware_stack` builds around the router, less FastAPI's own layers (see above)."""
        error_handler = None
        handlers: dict[Any, Any] = {}
        for key, value in self.exception_handlers.items():
            if key in (500, Exception):
                error_handler = value
            else:
                handlers[key] = value
        app: ASGIApp = ExceptionMiddleware(self._hot_endpoint, handlers=handlers, debug=self.debug)
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return ServerErrorMiddleware(app, handler=error_handler, debug=self.debug)

    async def _hot_endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.hot_routes.endpoint(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD" and self._get_only(scope):
            # RFC 9110 section 9.3.2: HEAD wherever GET is served, as Starlette's own routes do (FastAPI's
            # declare the methods they name): the GET route answers and uvicorn, whose copy of the
            # scope still says HEAD, sends its head without the body.
            scope = {**scope, "method": "GET"}
        stack = self._hot_stack
        if stack is not None and not self.root_path and (found := self.hot_routes.match(scope)) is not None:
            scope["app"] = self  # as Starlette's __call__ and router set them
            scope.setdefault("router", self.router)
            scope[HotRoutes.MATCH_KEY] = found
            await stack(scope, receive, send)
            body = scope.pop(HotRoutes.DECLINED_KEY, None)
            if body is None:
                return
            receive = replayed(body, receive)  # the plan declined: the full app answers
        scope[HotRoutes.SCOPE_KEY] = self.hot_routes  # a lean handler the router reaches registers here
        await super().__call__(scope, receive, send)


BEGIN_LINKS = {
    "chat": ("post", "/v1/chat/completions", {"header.x-api-key": "$response.body#/api_key"}),
    "messages": ("post", "/v1/messages", {"header.x-api-key": "$response.body#/api_key"}),
    "finish": (
        "post",
        "/api/v1/episodes/{episode_id}/finish",
        {"path.episode_id": "$response.body#/episode_id"},
    ),
}
"""OpenAPI links of begin's answer (what an episode goes on to do): its key samples completions, its id
finishes it. Tools that follow links (schemathesis's stateful phase) chain begin → chat → finish."""


def _link_begin(document: dict[str, Any]) -> None:
    """Add `BEGIN_LINKS` to begin's 201 answer in ``document`` (in place)."""
    links = {}
    for name, (method, path, parameters) in BEGIN_LINKS.items():
        target = document["paths"].get(path, {}).get(method)
        if target is not None and "operationId" in target:
            links[name] = {"operationId": target["operationId"], "parameters": parameters}
            declared = {(p.get("in"), p.get("name")) for p in target.get("parameters", [])}
            for key in parameters:  # a link sets declared parameters only: the key's header is one
                where, _, header = key.partition(".")
                if where == "header" and ("header", header) not in declared:
                    target.setdefault("parameters", []).append(
                        {
                            "name": header,
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string"},
                            "description": "The episode key (Anthropic SDKs send it here; or Authorization: Bearer).",
                        }
                    )
    begin = document["paths"].get("/api/v1/episodes", {}).get("post")
    if begin is not None and "201" in begin["responses"]:
        begin["responses"]["201"]["links"] = links


def create_app(config: ServerConfig, engine: Engine | None = None, *, owns_engine: bool = False) -> SwarmApp:
    """Build the swarm server app; the model loads in the lifespan (``engine`` injects a shared one,
    which the app's shutdown closes only with ``owns_engine``)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await asyncio.to_thread(
            SwarmRuntime, config, engine, owns_engine=owns_engine or engine is None
        )
        app.state.runtime = runtime
        tasks = [asyncio.create_task(runtime.reclaim_loop())]
        if runtime.training is not None:
            tasks.append(asyncio.create_task(runtime.training.run()))
        if runtime.tenants is not None:
            runtime.tenants.start()
        try:
            yield
        finally:
            app.state.stopping.set()  # the streams of a server stopped without `SwarmApp.begin_stop`
            runtime.interrupt_training()  # and its step under way (idempotent)
            if runtime.tenants is not None:
                tasks += runtime.tenants.tasks  # those created while serving too
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
        score_routes.router,
        tenant_routes.router,
    ):
        app.include_router(router, responses=ERROR_RESPONSES)
    app.include_router(anthropic_routes.router)  # declares its own errors, in Anthropic's shape
    return app
