"""`LeanRoute`: a FastAPI route class whose request handler does the hot path's work with less per-request
machinery, falling back to FastAPI's own handler for everything else.

Why: on a GPU host the server's event-loop thread is shared with the engine's front end, and FastAPI's
generic dependency solving (``solve_dependencies``: cache keys, scope and generator checks, telemetry
hooks, per-parameter multidict lookups) was the largest share of its CPU per episode
(``bench/server_cpu.py``). The hot routes (begin, chat completion, finish) use a handful of simple
dependency shapes, so a plan for them is built once per route and run per request.

What is the same as FastAPI's handler, by construction:

- the route itself (path, OpenAPI document, status code, response model and its JSON serialisation:
  FastAPI's ``serialize_response`` with the route's settings, and the route's ``Response`` parameter's
  headers);
- every path and header parameter is validated by the same FastAPI field (``ModelField.validate``); the
  body by its own pydantic model, parsed and validated in one pass from the raw bytes
  (``model_validate_json``; FastAPI parses with ``json.loads`` first and validates the result, which
  gives the same model for every body both accept, and a body only one of them accepts is refused here
  and handed to FastAPI, see below);
- dependencies run in declaration order, sub-dependencies first, once per request each (FastAPI's cache).

Where FastAPI or Starlette is outside the versions this module was tested on, or an internal it uses
cannot be imported, every route is FastAPI's own (`lean_routes_on`, `swarm.server.framework`).

What falls back to FastAPI's handler, on the same request (its body is cached by Starlette): a route with
any other shape (query or cookie parameters, generator or sync dependencies, security scopes, background
tasks, an optional or embedded body, a non-JSON body) is served by FastAPI alone; per request, a body that
is not JSON, any validation error and any exception raised while the parameters are solved make FastAPI
handle the request from the start, so every error answer is FastAPI's own. Dependencies here only read
(credentials, the runtime), so running them again has no effect. Exceptions raised by the endpoint itself
propagate as with FastAPI (the app's exception handlers answer them).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from swarm.server.framework import ROUTES, fast_path

try:  # FastAPI internals (tested range: `swarm.server.framework.TESTED`); never an import failure
    from fastapi import params
    from fastapi.datastructures import DefaultPlaceholder
    from fastapi.dependencies.models import Dependant
    from fastapi.routing import serialize_response
    from fastapi.utils import is_body_allowed_for_status_code
except ImportError:  # pragma: no cover - an untested FastAPI moved them: every route is FastAPI's own
    INTERNALS = False
else:
    INTERNALS = True

WHAT = "lean routes"
"""The name `fast_path` logs when the lean and hot routes are off."""


def lean_routes_on() -> bool:
    """Whether `LeanRoute` and `HotRoutes` may run: FastAPI's internals imported here and FastAPI and
    Starlette in their tested ranges (`swarm.server.framework`); else FastAPI's own path serves."""
    return INTERNALS and fast_path(ROUTES, WHAT)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class _Fallback(Exception):
    """This request leaves the lean path: FastAPI's handler serves it."""


def _is_async(call: Any) -> bool:
    """Whether ``call`` is an ``async def`` function or an object with an ``async def __call__``
    (not a generator: those need FastAPI's exit stacks)."""
    if inspect.isroutine(call):
        return inspect.iscoroutinefunction(call)
    if inspect.isclass(call):
        return False
    return inspect.iscoroutinefunction(getattr(call, "__call__", None))  # noqa: B004


def _header_key(param: Any) -> str | None:
    """The request header a FastAPI header parameter reads (``x_api_key`` → ``x-api-key``), or ``None``
    for a parameter with alias choices or paths (unsupported)."""
    info = param.field_info
    if info.validation_alias is not None:
        return None
    alias: str = param.alias
    if getattr(info, "convert_underscores", True) and alias == param.name:
        return alias.replace("_", "-")
    return alias


@dataclass
class _Plan:
    """How to solve one dependant (the endpoint or a dependency) without FastAPI's generic solver."""

    call: Any
    subs: list[tuple[str | None, _Plan]] = field(default_factory=list)
    path: list[tuple[str, Any]] = field(default_factory=list)
    headers: list[tuple[str, str, Any]] = field(default_factory=list)
    body: Any = None
    body_model: type[BaseModel] = BaseModel
    """The body's model class (when :attr:`body` is set)."""
    request_name: str | None = None
    connection_name: str | None = None
    response_name: str | None = None

    @classmethod
    def of(cls, dependant: Dependant, *, top: bool) -> _Plan | None:
        """The plan of ``dependant``, or ``None`` when it has a shape this module does not solve."""
        if (
            dependant.query_params
            or dependant.cookie_params
            or dependant.background_tasks_param_name
            or dependant.security_scopes_param_name
            or dependant.websocket_param_name
            or getattr(dependant, "concurrency", None) is not None
            or not _is_async(dependant.call)
            or (dependant.body_params and not top)
            or len(dependant.body_params) > 1
        ):
            return None
        plan = cls(
            dependant.call,
            request_name=dependant.request_param_name,
            connection_name=dependant.http_connection_param_name,
            response_name=dependant.response_param_name,
        )
        for param in dependant.path_params:
            plan.path.append((param.name, param))
        for param in dependant.header_params:
            key = _header_key(param)
            if key is None or param.field_info.is_required() or param.field_info.default is not None:
                return None
            plan.headers.append((param.name, key, param))
        if dependant.body_params:
            body = dependant.body_params[0]
            info = body.field_info
            annotation = info.annotation
            if (
                not isinstance(info, params.Body)
                or isinstance(info, params.Form)
                or info.embed
                or not info.is_required()
                or not (isinstance(annotation, type) and issubclass(annotation, BaseModel))
            ):
                return None
            plan.body = body
            plan.body_model = annotation
        for sub in dependant.dependencies:
            sub_plan = cls.of(sub, top=False)
            if sub_plan is None or not sub.use_cache:
                return None
            plan.subs.append((sub.name, sub_plan))
        return plan

    async def values(
        self, request: Request, body: Any, response: Response, cache: dict[int, Any]
    ) -> dict[str, Any]:
        """The keyword arguments of :attr:`call` for ``request``.

        Raises:
            _Fallback: a value did not validate (FastAPI answers it).
        """
        values: dict[str, Any] = {}
        for name, sub in self.subs:
            identity = id(sub.call)
            if identity in cache:
                solved = cache[identity]
            else:
                solved = await sub.call(**await sub.values(request, body, response, cache))
                cache[identity] = solved
            if name is not None:
                values[name] = solved
        path_params = request.path_params
        for name, param in self.path:
            if name not in path_params:
                raise _Fallback
            values[name] = _validated(param, path_params[name], ("path", name))
        for name, key, param in self.headers:
            raw = request.headers.get(key)
            values[name] = None if raw is None else _validated(param, raw, ("header", key))
        if self.body is not None:
            values[self.body.name] = body
        if self.request_name is not None:
            values[self.request_name] = request
        if self.connection_name is not None:
            values[self.connection_name] = request
        if self.response_name is not None:
            values[self.response_name] = response
        return values


_SERIALIZE_SETTINGS = ("include", "exclude", "by_alias", "exclude_unset", "exclude_defaults", "exclude_none")
"""The route's ``response_model_<name>`` settings, passed to FastAPI's ``serialize_response`` as ``<name>``."""


def _validated(param: Any, value: Any, loc: tuple[str, ...]) -> Any:
    checked, errors = param.validate(value, {}, loc=loc)
    if errors:
        raise _Fallback
    return checked


def is_json_type(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` value names JSON (``application/json`` or ``application/*+json``), as
    FastAPI decides whether to parse a body as JSON."""
    if not content_type:
        return False
    kind = content_type.split(";", 1)[0].strip().lower()
    maintype, _, subtype = kind.partition("/")
    return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))


class LeanRoute(APIRoute):
    """An ``APIRoute`` (use as a router's ``route_class``) that solves simple dependency shapes itself;
    see the module docstring for what stays FastAPI's."""

    def get_route_handler(self) -> Handler:
        fastapi_handler = super().get_route_handler()
        if not lean_routes_on():
            return fastapi_handler
        effective = self._effective()
        plan = _Plan.of(getattr(effective, "dependant", self.dependant), top=True)
        default_class = isinstance(self.response_class, DefaultPlaceholder)
        embedded = getattr(self, "_embed_body_fields", True)
        if plan is None or embedded or not default_class or self.response_field is None:
            return fastapi_handler
        serve = self._lean_server(plan)
        hot = _HotRoute(
            methods=frozenset(getattr(effective, "methods", self.methods) or ()),
            path_format=getattr(effective, "path_format", self.path_format),
            regex=getattr(effective, "path_regex", self.path_regex),
            convertors=getattr(effective, "param_convertors", self.param_convertors),
            serve=serve,
        )

        async def handler(request: Request) -> Response:
            response = await serve(request)
            if response is None:
                return await fastapi_handler(request)
            shortcut = request.scope.get(HotRoutes.SCOPE_KEY)
            if isinstance(shortcut, HotRoutes):
                shortcut.register(hot)
            return response

        return handler

    def _effective(self) -> Any:
        """What FastAPI builds this route's handler from: the route itself, or the context of the router
        that included it (which may add a prefix and dependencies: FastAPI >= 0.16x)."""
        import fastapi.routing as fastapi_routing

        context_var = getattr(fastapi_routing, "_effective_route_context_var", None)
        context = context_var.get() if context_var is not None else None
        if context is not None and getattr(context, "original_route", None) is self:
            return context
        return self

    def _lean_server(self, plan: _Plan) -> Callable[[Request], Coroutine[Any, Any, Response | None]]:
        """``serve(request)``: the route's response, or ``None`` when FastAPI's handler must answer (before
        the endpoint has run)."""
        status_code = self.status_code
        response_field = self.response_field
        settings = {name: getattr(self, f"response_model_{name}") for name in _SERIALIZE_SETTINGS}

        async def serve(request: Request) -> Response | None:
            if request.app.dependency_overrides:
                return None
            body: Any = None
            if plan.body is not None:
                try:
                    raw = await request.body()
                except HTTPException:
                    raise
                except Exception as exc:  # as FastAPI's handler answers a body it cannot read
                    raise HTTPException(
                        status_code=400, detail="There was an error parsing the body"
                    ) from exc
                if not raw or not is_json_type(request.headers.get("content-type")):
                    return None
                try:  # parsed and validated in one pass (pydantic's JSON mode)
                    body = plan.body_model.model_validate_json(raw)
                except ValueError:  # not JSON, not UTF-8 or not valid: FastAPI answers
                    return None
            sub_response = Response()
            del sub_response.headers["content-length"]
            sub_response.status_code = None  # type: ignore[assignment]
            try:
                values = await plan.values(request, body, sub_response, {})
            except Exception:
                return None  # FastAPI's error answer (dependencies only read)
            raw_response = await plan.call(**values)
            if isinstance(raw_response, Response):
                return raw_response
            content = await serialize_response(
                field=response_field, response_content=raw_response, dump_json=True, **settings
            )
            code = sub_response.status_code or status_code
            response = Response(content=content, media_type="application/json", status_code=code or 200)
            if not is_body_allowed_for_status_code(response.status_code):
                response.body = b""
            response.headers.raw.extend(sub_response.headers.raw)
            return response

        return serve


@dataclass(frozen=True)
class _HotRoute:
    """A `LeanRoute` as `HotRoutes` matches and serves it."""

    methods: frozenset[str]
    path_format: str
    regex: re.Pattern[str]
    convertors: dict[str, Any]
    serve: Callable[[Request], Coroutine[Any, Any, Response | None]]


class HotRoutes:
    """The hot `LeanRoute` routes of an app, matched and served ahead of its router and its middleware
    (`swarm.server.app.SwarmApp` calls it from the outside; docs/ARCHITECTURE.md §One request's path).

    A route joins once the router has routed a request to it (its lean handler registers it), and only
    when its ``(method, path format)`` is in ``paths``: those must be routes no earlier route of the app
    shadows (the router would pick the earlier one). :meth:`match` finds the joined route of a request;
    :meth:`endpoint` is the ASGI app that serves it with the route's plan and answers ``None`` when the
    plan leaves the request to FastAPI (invalid, unusual, a wrong credential): the caller then hands the
    request, its body replayed (:func:`replayed`), to the whole app, so it is answered exactly as before.

    Args:
        paths: ``("POST", "/v1/chat/completions")``-style pairs that may take the shortcut.
    """

    SCOPE_KEY = "swarm.hot_routes"
    """Where a request routed by the router carries this object (a lean handler registers its route)."""
    MATCH_KEY = "swarm.hot_route"
    """Where :meth:`endpoint` finds the matched route and the path's values."""
    DECLINED_KEY = "swarm.hot_route_declined"
    """Where :meth:`endpoint` leaves the request's body when the plan declined the request."""

    def __init__(self, paths: frozenset[tuple[str, str]]) -> None:
        self.paths = paths
        self.routes: list[tuple[str, _HotRoute]] = []

    def register(self, route: _HotRoute) -> None:
        """Let ``route`` take the shortcut (for its methods named in ``paths``; once)."""
        for method in sorted(route.methods):
            key = (method, route.path_format)
            if key in self.paths and all((m, r.path_format) != key for m, r in self.routes):
                self.routes.append((method, route))

    def match(self, scope: Scope) -> tuple[_HotRoute, re.Match[str]] | None:
        """The joined route an HTTP request goes to, with its path match (``None``: none, or the request
        has a root path, which the router would strip first)."""
        if scope["type"] != "http" or scope.get("root_path"):
            return None
        method, path = scope["method"], scope["path"]
        for route_method, route in self.routes:
            if method == route_method and (found := route.regex.match(path)) is not None:
                return route, found
        return None

    async def endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI app: serve the route in ``scope[MATCH_KEY]``; when its plan declines, send nothing and put
        the body read so far in ``scope[DECLINED_KEY]``."""
        route, found = scope.pop(self.MATCH_KEY)
        params = {key: route.convertors[key].convert(value) for key, value in found.groupdict().items()}
        scope["path_params"] = {**scope.get("path_params", {}), **params}
        request = Request(scope, receive, send)
        response = await route.serve(request)
        if response is not None:
            await response(scope, receive, send)
            return
        scope[self.DECLINED_KEY] = await request.body()  # read already, or empty


def replayed(body: bytes, receive: Receive) -> Receive:
    """``receive`` that first answers ``body`` as the whole request body (already read from ``receive``)."""
    done = False

    async def replay() -> Message:
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
