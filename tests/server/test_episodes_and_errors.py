"""Episode lifecycle, keys, control auth, durability and bad input: clear 4xx JSON, server keeps serving."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI, PermissionDeniedError
from pydantic import SecretStr

from swarm.client import SwarmClient
from swarm.config import TrainingConfig
from swarm.errors import ClientError
from tests.conftest import make_server

QUESTION = [{"role": "user", "content": "hi"}]
ADMIN_TOKEN = secrets.token_urlsafe(16)  # a fresh admin token per test run, never a literal


def chat(base_url: str, key: str, body: Any) -> httpx.Response:
    return httpx.post(f"{base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def assert_error(r: httpx.Response, status: int, kind: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"]
    if kind:
        assert error["type"] == kind
    return error


@pytest.fixture()
def ep(server: Any) -> Any:
    with SwarmClient(server.url) as client:
        episode = client.begin("errors")
        yield episode
        if not episode.ended:
            episode.abort("test teardown")


def test_bad_requests_get_json_errors_and_server_keeps_serving(server: Any, ep: Any) -> None:
    url, key, model = ep.base_url, ep.api_key, ep.model
    r = httpx.post(
        f"{url}/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert_error(r, 400, "invalid_request_error")  # not JSON: 400 on every route, as OpenAI answers
    assert_error(chat(url, key, {"model": model, "messages": []}), 422)
    err = assert_error(chat(url, key, {"model": "gpt-4", "messages": QUESTION}), 404, "invalid_request_error")
    assert err["param"] == "model"
    huge = "m" * 5000  # an oversized name is not echoed back whole
    err = assert_error(chat(url, key, {"model": huge, "messages": QUESTION}), 404, "invalid_request_error")
    assert "(5000 characters)" in err["message"] and len(err["message"]) < 300, err["message"]
    assert_error(chat(url, key, {"model": model, "messages": QUESTION, "max_tokens": 0}), 422)
    assert_error(chat(url, key, {"model": model, "messages": [{"role": "wizard", "content": "x"}]}), 422)
    empty = chat(url, key, {"model": model, "messages": [*QUESTION, {"role": "assistant"}]})
    assert "an assistant message needs content" in assert_error(empty, 422)["message"]  # not "a assistant"
    long_prompt = [{"role": "user", "content": "hello " * 9000}]
    err = assert_error(
        chat(url, key, {"model": model, "messages": long_prompt, "max_tokens": 4}),
        400,
        "context_length_exceeded",
    )
    assert "context window" in err["message"] and err["param"] == "messages"  # as OpenAI names it
    assert_error(
        chat(url, "sk-swarm-not-a-key", {"model": model, "messages": QUESTION}), 403, "authentication_error"
    )  # a wrong credential is a 403, a missing one a 401 (README §Security)
    assert_error(httpx.post(f"{url}/chat/completions", json={"model": model, "messages": QUESTION}), 401)
    # none of the bad requests was recorded, and the episode still works
    ok = chat(url, key, {"model": model, "messages": QUESTION, "max_tokens": 4})
    assert ok.status_code == 200
    with SwarmClient(server.url) as client:
        assert len(client.get_episode(ep.id, api_key=key).calls) == 1


def test_finished_episode_key_is_refused_and_episode_is_durable(tmp_path: Path, tiny_engine: Any) -> None:
    live = make_server(tmp_path, tiny_engine)
    try:
        with SwarmClient(live.url) as client:
            with client.episode("durable", metadata={"note": "kept"}) as ep:
                oa = OpenAI(base_url=ep.base_url, api_key=ep.api_key)
                oa.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=5)
                ep.finish(0.75)
            with pytest.raises(PermissionDeniedError):  # an ended episode's key: a wrong credential
                oa.chat.completions.create(model=ep.model, messages=QUESTION, max_tokens=5)
            before = client.get_episode(ep.id)
            with pytest.raises(ClientError) as info:
                client.finish(ep.id, 1.0)
            assert info.value.status_code == 409
        live.restart()  # a new process state over the same run dir
        with SwarmClient(live.url) as client:
            after = client.get_episode(ep.id, api_key=ep.api_key)
            assert client.status().episodes.finished == 1
        assert after.calls == before.calls and after.reward == 0.75
    finally:
        live.stop()


def test_abort_kinds_heartbeat_and_unknown_episode(server: Any) -> None:
    with SwarmClient(server.url) as client:
        a = client.begin("abort")
        a.heartbeat()
        a.abort("tool crashed", infra_failure=True)
        assert client.get_episode(a.id).status == "infra_failure"
        with pytest.raises(ValueError, match="boom"), client.episode("abort2") as b:
            raise ValueError("boom")
        view = client.get_episode(b.id)
        assert view.status == "aborted" and "boom" in (view.reason or "")
        with pytest.raises(ClientError) as info:  # with a credential: without one, any id is a 401
            client.get_episode("ep-nope", api_key=a.api_key)
        assert info.value.status_code == 404
        key = {"Authorization": f"Bearer {a.api_key}"}
        unknown = httpx.get(f"{server.url}/api/v1/episodes/{'e' * 4000}", headers=key)
        assert unknown.status_code == 404 and len(unknown.json()["error"]["message"]) < 300, unknown.text
        assert_error(httpx.post(f"{server.url}/api/v1/episodes", json={"task_id": ""}), 422)
        assert_error(httpx.post(f"{server.url}/api/v1/episodes", json={"task_id": "x", "typo_field": 1}), 422)


def test_nonfinite_reward_is_rejected_and_episode_stays_open(server: Any) -> None:
    with SwarmClient(server.url) as client:
        ep = client.begin("nan")
        for body in (b'{"reward": NaN}', b'{"reward": Infinity}', b'{"reward": 1e400}'):
            r = httpx.post(
                f"{server.url}/api/v1/episodes/{ep.id}/finish",
                content=body,
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {ep.api_key}"},
            )
            assert r.status_code == 422
            # says what is wrong (it said "less than or equal to 1000000000" for NaN)
            assert r.json()["error"]["message"] == "reward: Input should be a finite number"
        ep.finish(1.0)  # nothing was lost: the episode is still open and finishes normally
        assert client.get_episode(ep.id).status == "finished"


def test_control_routes_need_admin_token_and_refuse_episode_keys(tmp_path: Path, tiny_engine: Any) -> None:
    from pydantic import SecretStr

    live = make_server(tmp_path, tiny_engine, admin_token=SecretStr(ADMIN_TOKEN))
    try:
        with SwarmClient(live.url) as client:
            ep = client.begin("auth")
            assert_error(httpx.get(f"{live.url}/api/v1/status"), 401)
            assert_error(
                httpx.get(f"{live.url}/api/v1/status", headers={"Authorization": f"Bearer {ep.api_key}"}), 403
            )
            assert_error(
                httpx.get(f"{live.url}/api/v1/status", headers={"Authorization": "Bearer wrong"}), 403
            )
            with SwarmClient(live.url, admin_token=ADMIN_TOKEN) as admin:
                assert admin.status().episodes.open == 1
            ep.finish(0.0)
        events = httpx.get(
            f"{live.url}/api/v1/events?follow=false",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert events.status_code == 200 and "episode.finished" in events.text
        assert (
            "sk-swarm-" not in events.text
            and ADMIN_TOKEN not in (tmp_path / "run" / "events.jsonl").read_text()
        )
    finally:
        live.stop()


def test_openapi_document_lists_routes(server: Any) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    for path in (
        "/v1/chat/completions",
        "/v1/models",
        "/api/v1/episodes",
        "/api/v1/episodes/{episode_id}/finish",
        "/api/v1/status",
    ):
        assert path in doc["paths"]


def test_lone_surrogates_are_refused_and_the_episode_still_ends(server: Any) -> None:
    """JSON's ``\\ud800`` decodes to a lone surrogate: the tokenizer failed on it (500) and, in ``user``,
    the episode could then be neither stored nor ended (500 on finish). Refused at the edge now."""
    with SwarmClient(server.url) as client:
        ep = client.begin("surrogate")
        headers = {"Authorization": f"Bearer {ep.api_key}", "Content-Type": "application/json"}
        hi = '{"role": "user", "content": "hi"}'
        for path, body, field in (
            (
                "/v1/chat/completions",
                '{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}]}',
                "messages.0.content",
            ),
            ("/v1/chat/completions", '{"model": "%s", "user": "\\udfff", "messages": [' + hi + "]}", "user"),
            (
                "/v1/messages",
                '{"model": "%s", "max_tokens": 4, "metadata": {"user_id": "\\ud800"}, "messages": ['
                + hi
                + "]}",
                "metadata.user_id",
            ),
        ):
            r = httpx.post(server.url + path, content=body % ep.model, headers=headers)
            assert r.status_code in (400, 422), r.text  # 400 on the Anthropic route, as Anthropic answers
            assert field in r.text and "surrogate" in r.text
        ep.finish(0.5)  # nothing was recorded, and the episode ends normally
        assert client.get_episode(ep.id).status == "finished"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/api/v1/status", "GET, HEAD"),  # HEAD is served wherever GET is
        ("HEAD", "/v1/chat/completions", "POST"),  # ... and nowhere else
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/api/v1/episodes", "POST"),
    ],
)
def test_a_405_names_every_method_of_the_resource(server: Any, method: str, path: str, allowed: str) -> None:
    """RFC 9110 §15.5.6: a 405 carries ``Allow`` with the resource's methods (found by a fresh user: the
    header was empty, since FastAPI wraps included routers in objects the lookup did not read)."""
    r = httpx.request(method, f"{server.url}{path}")
    assert r.status_code == 405 and r.headers["allow"] == allowed
    if method != "HEAD":  # a HEAD answer has no body
        message = assert_error(r, 405, "method_not_allowed")["message"]
        assert message == f"method {method} not allowed on {path}; it takes {allowed}"


def test_body_errors_are_the_same_on_every_route(server: Any) -> None:
    """A body that is not JSON is a 400 on every route (OpenAI and Anthropic answer 400 too), each API in
    its own shape; a JSON body sent as another content type, or with none, is a 415 that says so."""
    with SwarmClient(server.url) as client, client.episode("bodies") as ep:
        key = {"Authorization": f"Bearer {ep.api_key}"}
        routes = (
            ("/v1/chat/completions", key),
            ("/v1/messages", key),
            (f"/api/v1/episodes/{ep.id}/finish", key),
            ("/api/v1/episodes", {}),  # begin: no credential on this server
        )
        for path, headers in routes:
            for body in (b"{not json", b'{"a": 1', b"\xff\xfe"):
                sent = {**headers, "content-type": "application/json"}
                r = httpx.post(server.url + path, content=body, headers=sent)
                assert r.status_code == 400, (path, body, r.text)
                assert "the body is not valid JSON" in r.json()["error"]["message"], r.text
            r = httpx.post(
                server.url + path, content=b"{}", headers={**headers, "content-type": "text/plain"}
            )
            assert r.status_code == 415, (path, r.text)
            message = r.json()["error"]["message"]
            assert "must be JSON" in message and "Content-Type: application/json" in message
            assert "'text/plain'" in message and "dictionary" not in message
            # the same body with no Content-Type at all (a 422 "Input should be a valid dictionary" before)
            r = httpx.post(server.url + path, content=b'{"reward": 1}', headers=headers)
            assert "content-type" not in r.request.headers and r.status_code == 415, (path, r.text)
            message = r.json()["error"]["message"]
            assert "Content-Type: application/json" in message and "Content-Type is missing" in message
        assert httpx.post(f"{server.url}/v1/messages", content=b"{x", headers=key).json()["type"] == "error"
        ep.finish(0.0)
        assert client.get_episode(ep.id).calls == []


def test_a_missing_body_is_named_where_a_route_needs_one(server: Any) -> None:
    """A route that needs a JSON body, sent none: with no Content-Type either, a 415 (as for any body
    without one); with a JSON Content-Type, a 422 (400 on /v1/messages) saying the body is empty. Both
    said ``body: Field required`` before. A route whose body is optional (a vote) takes none."""
    with SwarmClient(server.url) as client, client.episode("no-body") as ep:
        key = {"Authorization": f"Bearer {ep.api_key}"}
        routes = (
            ("/v1/chat/completions", key, 422),
            ("/v1/messages", key, 400),
            (f"/api/v1/episodes/{ep.id}/finish", key, 422),
            ("/api/v1/episodes", {}, 422),
        )
        for path, headers, empty_status in routes:
            r = httpx.post(server.url + path, headers=headers)
            assert "content-type" not in r.request.headers and r.status_code == 415, (path, r.text)
            message = r.text  # either API's shape
            assert "this route needs a JSON body sent with 'Content-Type: application/json'" in message
            assert "no body and no Content-Type" in message and "Field required" not in message
            r = httpx.post(server.url + path, headers={**headers, "content-type": "application/json"})
            assert r.status_code == empty_status, (path, r.text)
            assert "needs a JSON body" in r.text and "body is empty" in r.text, (path, r.text)
        ep.finish(0.0)
    # the vote's body is optional: none is a vote for ready (this server does not train: 409 says so)
    r = httpx.post(f"{server.url}/api/v1/clients/x/ready")
    assert r.status_code == 409 and "training is disabled" in r.json()["error"]["message"], r.text


def test_routes_that_take_no_options_refuse_a_body_they_would_ignore(server: Any) -> None:
    """fresh35 F1: pause, resume, checkpoint and the two heartbeats took any body (``{bad``, bytes that are
    not UTF-8, text/plain) with a 200, and pause and checkpoint ran. They take none or ``{}``: a body that
    is not JSON is a 400, one sent as another type a 415, a field a 422 naming it, as on every route."""
    with SwarmClient(server.url) as client, client.episode("no-options") as ep:
        key = {"Authorization": f"Bearer {ep.api_key}"}
        routes = (
            (f"/api/v1/episodes/{ep.id}/heartbeat", key),
            ("/api/v1/clients/c1/heartbeat", {}),
            ("/api/v1/pause", {}),
            ("/api/v1/resume", {}),
            ("/api/v1/checkpoint", {}),
        )
        for path, headers in routes:
            answers = []
            for body, kind in ((b"{bad", "application/json"), (b"\xff\xfe", "application/json")):
                r = httpx.post(server.url + path, content=body, headers={**headers, "content-type": kind})
                assert r.status_code == 400 and "the body is not valid JSON" in r.text, (path, r.text)
            r = httpx.post(
                server.url + path, content=b"{}", headers={**headers, "content-type": "text/plain"}
            )
            assert r.status_code == 415 and "must be JSON" in r.text, (path, r.text)
            r = httpx.post(server.url + path, json={"force": True}, headers=headers)
            assert r.status_code == 422 and "force" in r.text, (path, r.text)
            for sent in ({}, {"json": {}}):  # none, or {}: the route's own answer (200, or 409 here)
                answers.append(httpx.post(server.url + path, headers=headers, **sent).status_code)  # type: ignore[arg-type]
            assert answers[0] == answers[1] and answers[0] in (200, 409), (path, answers)
        ep.finish(0.0)


def test_a_request_head_over_the_bound_is_431_json_and_declared(server: Any) -> None:
    """A 200 KB header (accepted before) is refused before the app: 431 in the server's JSON error shape,
    the connection closed; each API's document declares it; the server keeps serving."""
    with SwarmClient(server.url) as client, client.episode("heads") as ep:
        for path in ("/v1/chat/completions", "/v1/messages", "/api/v1/episodes"):
            body = {"model": ep.model, "messages": QUESTION, "max_tokens": 2}
            big = {"Authorization": f"Bearer {ep.api_key}", "X-Big": "a" * 200_000}
            r = httpx.post(server.url + path, json=body, headers=big)
            error = assert_error(r, 431, "request_header_fields_too_large")
            assert "limit of 65536 bytes" in error["message"] and r.headers["connection"] == "close"
        assert chat(
            ep.base_url, ep.api_key, {"model": ep.model, "messages": QUESTION, "max_tokens": 2}
        ).is_success
        ep.finish(0.0)
        assert len(client.get_episode(ep.id).calls) == 1  # only the call after the refused ones
    document = httpx.get(f"{server.url}/openapi.json").json()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert "431" in operation["responses"], (method, path)


@pytest.mark.parametrize("path", ["/v1/models", "/api/v1/status", "/api/v1/config", "/openapi.json"])
def test_head_is_served_wherever_get_is(server: Any, path: str) -> None:
    """RFC 9110 section 9.3.2: HEAD answers GET's status and headers without the body (Starlette's own routes,
    /openapi.json among them, did; FastAPI's answered 405)."""
    get, head = httpx.get(server.url + path), httpx.head(server.url + path)
    assert get.status_code == head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


def test_the_document_declares_what_every_operation_may_answer(server: Any) -> None:
    """405 (with Allow), 408 and 413 on every operation; 503 only where the server sends it (begin, the
    event follower), not on the completion routes (nothing there answers 503)."""
    document = httpx.get(f"{server.url}/openapi.json").json()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert {"405", "408", "413"} <= set(responses), (method, path, sorted(responses))
            assert "Allow" in responses["405"]["headers"], (method, path)
    paths = document["paths"]
    assert "503" in paths["/api/v1/episodes"]["post"]["responses"]
    assert "503" not in paths["/v1/chat/completions"]["post"]["responses"]
    assert "503" not in paths["/v1/messages"]["post"]["responses"]


def test_both_completion_routes_declare_their_event_stream(server: Any) -> None:
    """``stream: true`` answers ``text/event-stream`` on both completion routes, so both declare it next to
    their JSON answer (``/v1/messages`` did not: schemathesis's content-type check failed there)."""
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    for path in ("/v1/chat/completions", "/v1/messages"):
        content = paths[path]["post"]["responses"]["200"]["content"]
        assert {"application/json", "text/event-stream"} <= set(content), path
        assert content["text/event-stream"]["itemSchema"]["properties"]["data"] == {"type": "string"}


def test_the_document_lists_no_credential_where_the_server_asks_for_none(
    tmp_path: Path, tiny_engine: Any
) -> None:
    """On a server without client tokens, begin, the client routes and a teacher's routes list the empty
    security requirement (no credential), and on one without an admin token the control routes too; the
    episode and completion routes never do. FastAPI 0.16x keeps an included router as one wrapper route,
    and the walk over the app's routes found no route: every operation said it needed a bearer."""
    no_tokens = make_server(tmp_path / "open", tiny_engine, training=TrainingConfig(enabled=False))
    admin_only = make_server(
        tmp_path / "admin",
        tiny_engine,
        training=TrainingConfig(enabled=False),
        admin_token=SecretStr("a" * 24),
    )
    try:
        for live, control_open in ((no_tokens, True), (admin_only, False)):
            paths = httpx.get(f"{live.url}/openapi.json").json()["paths"]

            def open_(path: str, method: str = "post", paths: Any = paths) -> bool:
                return {} in paths[path][method].get("security", [])

            assert open_("/api/v1/episodes") and open_("/api/v1/clients/{client_id}/ready")
            assert open_("/v1/score") and open_("/tokenize")
            assert open_("/api/v1/status", "get") is control_open
            assert not open_("/api/v1/episodes/{episode_id}/finish") and not open_("/v1/chat/completions")
            assert not open_("/v1/messages") and not open_("/api/v1/episodes/{episode_id}", "get")
    finally:
        admin_only.stop()
        no_tokens.stop()


def test_a_completion_without_a_key_is_refused_before_its_body_is_read(server: Any) -> None:
    """fresh-s5 #12: without a key, a malformed body was a 400 but an empty or missing one a 401. The
    credential is checked first on every route, so a caller without one learns nothing about its body."""
    json_type = {"content-type": "application/json"}
    bodies: list[tuple[bytes | None, dict[str, str]]] = [
        (b"{not json", json_type),
        (b"\xff\xfe", json_type),
        (b"", json_type),
        (None, {}),
    ]
    with SwarmClient(server.url) as client, client.episode("auth-first") as ep:
        for path in ("/v1/chat/completions", "/v1/messages", f"/api/v1/episodes/{ep.id}/finish"):
            for body, headers in bodies:
                r = httpx.post(server.url + path, content=body, headers=headers)
                assert r.status_code == 401, (path, body, r.text)
            wrong = {**json_type, "Authorization": "Bearer swe-not-a-key-of-any-episode"}
            r = httpx.post(server.url + path, content=b"{not json", headers=wrong)
            assert r.status_code in (401, 403), (path, r.text)  # refused for the credential, not the body
            assert "not valid JSON" not in r.text
            r = httpx.post(
                server.url + path, content=b"{not json", headers={**json_type, "x-api-key": ep.api_key}
            )
            if path != f"/api/v1/episodes/{ep.id}/finish":  # with its key: the body's 400, as before
                assert r.status_code == 400 and "not valid JSON" in r.text, (path, r.text)
        assert (
            httpx.post(f"{server.url}/v1/messages", content=b"{x", headers=json_type).json()["type"]
            == "error"
        )
