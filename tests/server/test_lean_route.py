"""`LeanRoute` answers exactly as FastAPI's own handler does, and serves the hot routes without it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

import fastapi.routing
import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Request, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from openai import OpenAI
from pydantic import BaseModel, ConfigDict, Field, field_validator

from swarm.client import SwarmClient
from swarm.server.app import HOT_PATHS, create_app
from swarm.server.lean_route import HotRoutes, LeanRoute

_bearer = HTTPBearer(auto_error=False)


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    score: float = Field(ge=0, le=1)
    tags: list[str] = Field(default_factory=list)

    @field_validator("tags")
    @classmethod
    def _few(cls, v: list[str]) -> list[str]:
        if len(v) > 2:
            raise ValueError("at most 2 tags")
        return v


class Stored(BaseModel):
    item_id: str
    name: str
    score: float
    key: str | None
    via: str | None


async def get_state(request: Request) -> dict[str, Any]:
    state: dict[str, Any] = request.app.state.store
    return state


async def get_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    x_api_key: Annotated[str | None, Header()] = None,
) -> str:
    key = credentials.credentials if credentials is not None else x_api_key
    if key is None:
        raise HTTPException(401, "no key")
    if key == "wrong":
        raise HTTPException(403, "wrong key")
    return key


def make_app(route_class: type[APIRoute]) -> FastAPI:
    """The same routes with FastAPI's route class or with `LeanRoute`."""
    router = APIRouter(prefix="/items", route_class=route_class)

    @router.post("/{item_id}", status_code=201)
    async def put_item(
        item_id: str,
        body: Item,
        key: Annotated[str, Depends(get_key)],
        state: Annotated[dict[str, Any], Depends(get_state)],
        response: Response,
        x_via: Annotated[str | None, Header()] = None,
    ) -> Stored:
        if body.name == "boom":
            raise HTTPException(409, "the endpoint refused it")
        state[item_id] = body
        response.headers["X-Stored"] = str(len(state))
        return Stored(item_id=item_id, name=body.name, score=body.score, key=key, via=x_via)

    @router.get("/{item_id}")
    async def get_item(item_id: str, state: Annotated[dict[str, Any], Depends(get_state)]) -> Item:
        if item_id not in state:
            raise HTTPException(404, "no such item")
        item: Item = state[item_id]
        return item

    app = FastAPI()
    app.state.store = {}
    app.include_router(router)
    return app


OTHER_ENCODINGS = (b'\xef\xbb\xbf{"name": "x", "score": 0.5}', '{"name": "x", "score": 0.5}'.encode("utf-16"))
"""Valid JSON bodies that ``json.loads`` reads and pydantic's JSON mode does not (a UTF-8 BOM, UTF-16)."""

REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "POST",
        "/items/a",
        {"json": {"name": "x", "score": 0.25, "tags": ["t"]}, "headers": {"Authorization": "Bearer k1"}},
    ),
    (
        "POST",
        "/items/b",
        {"json": {"name": "é", "score": 1e-05}, "headers": {"x-api-key": "k2", "x-via": "sdk"}},
    ),
    ("GET", "/items/a", {}),
    ("GET", "/items/zz", {}),
    ("POST", "/items/c", {"json": {"name": "x", "score": 2}, "headers": {"Authorization": "Bearer k"}}),
    (
        "POST",
        "/items/c",
        {"json": {"name": "x", "score": 0.5, "extra": 1}, "headers": {"Authorization": "Bearer k"}},
    ),
    (
        "POST",
        "/items/c",
        {
            "json": {"name": "x", "score": 0.5, "tags": ["a", "b", "c"]},
            "headers": {"Authorization": "Bearer k"},
        },
    ),
    ("POST", "/items/c", {"json": [1, 2], "headers": {"Authorization": "Bearer k"}}),
    (
        "POST",
        "/items/c",
        {
            "content": b"{not json",
            "headers": {"Authorization": "Bearer k", "content-type": "application/json"},
        },
    ),
    (
        "POST",
        "/items/c",
        {
            "content": b"\xff\xfe",
            "headers": {"Authorization": "Bearer k", "content-type": "application/json"},
        },
    ),
    (
        "POST",
        "/items/c",
        {
            "content": b'{"name": "x", "score": 0.5}',
            "headers": {"Authorization": "Bearer k", "content-type": "text/plain"},
        },
    ),
    (
        "POST",
        "/items/c",
        {"content": b'{"name": "x", "score": 0.5}', "headers": {"Authorization": "Bearer k"}},
    ),
    (
        "POST",
        "/items/c",
        {"content": b"", "headers": {"Authorization": "Bearer k", "content-type": "application/json"}},
    ),
    ("POST", "/items/c", {"json": {"name": "x", "score": 0.5}}),
    ("POST", "/items/c", {"json": {"name": "x", "score": 0.5}, "headers": {"Authorization": "Bearer wrong"}}),
    ("POST", "/items/c", {"json": {"name": "", "score": 0.5}, "headers": {"Authorization": "Bearer wrong"}}),
    ("POST", "/items/c", {"json": {"name": "boom", "score": 0.5}, "headers": {"Authorization": "Bearer k"}}),
    ("POST", "/items/c", {"json": {"name": "x", "score": 0.5}, "headers": {"Authorization": "Basic abc"}}),
    (
        "POST",
        "/items/c",
        {
            "json": {"name": "x", "score": 0.5},
            "headers": {"Authorization": "Bearer k", "content-type": "application/vnd.x+json; charset=utf-8"},
        },
    ),
    # bodies where parsing with json.loads and pydantic's JSON mode could part ways
    *(
        (
            "POST",
            "/items/c",
            {"content": raw, "headers": {"Authorization": "Bearer k", "content-type": "application/json"}},
        )
        for raw in (
            b'{"name": "x", "name": "y", "score": 0.5}',
            b'{"name": "x\\u00e9\\ud83d\\ude00", "score": 0.5}',
            *OTHER_ENCODINGS,
            b'{"name": "x", "score": 5e-1, "tags": []}  ',
        )
    ),
]


def _path(i: int, path: str) -> str:
    return path.replace("/c", f"/c{i}")  # one item id per request


async def _answers(app: FastAPI) -> list[tuple[int, bytes, dict[str, str]]]:
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        for i, (method, path, kwargs) in enumerate(REQUESTS):
            r = await client.request(method, _path(i, path), **kwargs)
            kept = {k: v for k, v in r.headers.items() if k in ("content-type", "content-length", "x-stored")}
            out.append((r.status_code, r.content, kept))
    return out


@pytest.fixture
def solved(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """A function that starts recording the paths of requests reaching FastAPI's own
    ``solve_dependencies`` and returns the list it fills."""
    paths: list[str] = []
    original = fastapi.routing.solve_dependencies

    async def counting(**kwargs: Any) -> Any:
        paths.append(kwargs["request"].url.path)
        return await original(**kwargs)

    def start() -> list[str]:
        monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
        return paths

    return start


def test_lean_route_answers_exactly_as_fastapi(solved: Callable[[], list[str]]) -> None:
    """Every answer (status, body bytes, headers), valid or not, equals FastAPI's own route's."""
    expected = asyncio.run(_answers(make_app(APIRoute)))
    paths = solved()
    got = asyncio.run(_answers(make_app(LeanRoute)))
    for (method, path, kwargs), want, have in zip(REQUESTS, expected, got, strict=True):
        assert have == want, (method, path, kwargs)
    assert [s for s, _, _ in got[:4]] == [201, 201, 200, 404]
    # the valid requests and the endpoint's own errors (404, 409) never reached FastAPI's solver; the
    # requests with a validation or credential error were handed to it (a body that is not JSON fails in
    # FastAPI's handler before its solver runs)
    bad = {_path(i, REQUESTS[i][1]) for i, (status, _, _) in enumerate(got) if status in (400, 401, 403, 422)}
    # the valid bodies in other encodings were handed to FastAPI too, and it accepted them
    other = [i for i, (_, _, kw) in enumerate(REQUESTS) if kw.get("content") in OTHER_ENCODINGS]
    other_encodings = {_path(i, REQUESTS[i][1]) for i in other}
    assert len(other) == 2 and all(got[i][0] == 201 for i in other)
    assert set(paths) <= bad | other_encodings and len(paths) == len(bad) - 2 + len(other)


def test_hot_routes_skip_fastapis_solver(server: Any, solved: Callable[[], list[str]]) -> None:
    """Begin, a chat completion and finish on the real server are solved by `LeanRoute`; the episode is
    recorded and stored as before."""
    paths = solved()
    with SwarmClient(server.url) as swarm:
        episode = swarm.begin("lean-task", kind="eval")
        answer = OpenAI(base_url=episode.base_url, api_key=episode.api_key).chat.completions.create(
            model=episode.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, seed=1
        )
        episode.finish(0.5)
        view = swarm.get_episode(episode.id)
    assert answer.usage is not None and answer.usage.completion_tokens >= 1
    assert view.status.value == "finished" and view.reward == 0.5 and len(view.calls) == 1
    assert view.calls[0].completion_ids and len(view.calls[0].logprobs) == len(view.calls[0].completion_ids)
    assert paths == [], paths


def test_hot_routes_bypass_the_router(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once routed, begin, chat completion and finish are served by `HotRoutes` ahead of the router and
    FastAPI's middleware: a second episode's three requests take the shortcut; a wrong credential on a hot
    route still gets FastAPI's answer."""
    app = server._server.config.app
    hot = app.hot_routes
    served: list[str] = []
    original = hot.endpoint

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        served.append(scope[HotRoutes.MATCH_KEY][0].path_format)
        await original(scope, receive, send)

    with SwarmClient(server.url) as swarm:
        for _ in range(2):
            episode = swarm.begin("hot-task", kind="eval")
            OpenAI(base_url=episode.base_url, api_key=episode.api_key).chat.completions.create(
                model=episode.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            episode.finish(1.0)
            monkeypatch.setattr(hot, "endpoint", counting)
        stored = swarm.get_episode(episode.id)
    assert {(m, r.path_format) for m, r in hot.routes} == HOT_PATHS
    assert sorted(served) == sorted(path for _, path in HOT_PATHS)
    assert stored.status.value == "finished" and stored.reward == 1.0 and len(stored.calls) == 1
    wrong = httpx.post(
        f"{server.url}/api/v1/episodes/{episode.id}/finish",
        json={"reward": 1.0},
        headers={"Authorization": "Bearer sk-swarm-nope"},
    )
    assert wrong.status_code == 403 and wrong.json()["error"]["type"] == "authentication_error"
    assert served[-1] == "/api/v1/episodes/{episode_id}/finish"


def test_routes_with_other_shapes_keep_fastapis_handler(server: Any, solved: Callable[[], list[str]]) -> None:
    """The abort route's optional body is not a shape `LeanRoute` solves: FastAPI's handler serves it."""
    with SwarmClient(server.url) as swarm:
        episode = swarm.begin("lean-task", kind="eval")
        paths = solved()
        episode.abort("stopped")
    assert paths and all(path.endswith("/abort") for path in paths)


def test_the_served_app_is_unchanged_in_its_openapi_document() -> None:
    """The route class changes how requests are solved, not the routes: the document lists the hot routes
    with their bodies, security and answers."""
    from swarm.config import ServerConfig

    doc = create_app(ServerConfig()).openapi()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "ChatCompletionRequest"
    )
    assert {"401", "409", "422"} <= set(chat["responses"])
    finish = doc["paths"]["/api/v1/episodes/{episode_id}/finish"]["post"]
    assert finish["security"] and finish["requestBody"]["content"]["application/json"]["schema"][
        "$ref"
    ].endswith("EpisodeFinish")
