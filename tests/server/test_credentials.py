"""Credentials by role on a real server: client tokens guard begin, an episode's key (or the client token
that began it, or the admin token) guards its routes, 401 missing vs 403 wrong, live add/revoke, and no
secret in logs, events, the pool or error answers."""

from __future__ import annotations

import logging
import secrets
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from swarm.client import SwarmClient
from swarm.config import ServerConfig, TrainingConfig
from swarm.errors import ClientError
from swarm.pool import Pool
from swarm.server.runtime import SwarmRuntime
from tests.conftest import LiveServer, make_server

ADMIN = secrets.token_urlsafe(16)
ALICE = secrets.token_urlsafe(16)
BOB = secrets.token_urlsafe(16)
QUESTION = [{"role": "user", "content": "hi"}]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def error(r: httpx.Response, status: int, *words: str) -> str:
    assert r.status_code == status, r.text
    message = str(r.json()["error"]["message"])
    for word in words:
        assert word in message, message
    return message


def serving(tmp: Path, engine: Any, client_tokens: dict[str, str]) -> Iterator[LiveServer]:
    """A server in inference mode with the admin token and ``client_tokens`` (name → token)."""
    tokens = {name: SecretStr(token) for name, token in client_tokens.items()}
    live = make_server(
        tmp,
        engine,
        training=TrainingConfig(enabled=False),
        admin_token=SecretStr(ADMIN),
        client_tokens=tokens,
    )
    yield live
    live.stop()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, tiny_engine: Any) -> Iterator[LiveServer]:
    yield from serving(tmp_path_factory.mktemp("guarded"), tiny_engine, {"alice": ALICE, "bob": BOB})


def begin(url: str, headers: dict[str, str], task: str = "t") -> httpx.Response:
    return httpx.post(f"{url}/api/v1/episodes", json={"task_id": task}, headers=headers)


def test_begin_needs_a_client_token(guarded: LiveServer) -> None:
    url = guarded.url
    error(begin(url, {}), 401, "missing client token")
    error(begin(url, bearer("not-a-token-at-all")), 403, "wrong client token")
    created = begin(url, bearer(ALICE))
    assert created.status_code == 201
    key = created.json()["api_key"]
    error(begin(url, bearer(key)), 403, "episode API key cannot be used for beginning")
    assert begin(url, bearer(ADMIN)).status_code == 201  # the admin may act as a client


def test_an_episode_answers_only_its_key_its_owner_or_the_admin(guarded: LiveServer) -> None:
    url = guarded.url
    mine = begin(url, bearer(ALICE)).json()
    other = begin(url, bearer(BOB)).json()
    eid = mine["episode_id"]
    base = f"{url}/api/v1/episodes/{eid}"
    error(httpx.get(base), 401, "missing credential", eid)
    error(httpx.get(base, headers=bearer(BOB)), 403, "'bob' did not begin", eid)
    error(httpx.get(base, headers=bearer(other["api_key"])), 403, "does not belong")
    error(httpx.get(base, headers=bearer("guess-" + secrets.token_hex(8))), 403, "wrong credential")
    error(httpx.post(f"{base}/finish", json={"reward": 1.0}, headers=bearer(BOB)), 403, "did not begin")
    error(httpx.post(f"{base}/abort", headers=bearer(other["api_key"])), 403)
    error(httpx.post(f"{base}/heartbeat"), 401)
    assert httpx.post(f"{base}/heartbeat", headers=bearer(ALICE)).status_code == 200
    assert httpx.get(base, headers=bearer(mine["api_key"])).json()["status"] == "open"
    chat = httpx.post(
        f"{mine['base_url']}/chat/completions",
        json={"model": mine["model"], "messages": QUESTION, "max_tokens": 2},
        headers=bearer(mine["api_key"]),
    )
    assert chat.status_code == 200, chat.text
    assert (
        httpx.post(f"{base}/finish", json={"reward": 0.5}, headers=bearer(mine["api_key"])).status_code == 200
    )
    # ended: the owner, the key and the admin still read it; a retried finish is a conflict, not a 401
    for secret in (ALICE, mine["api_key"], ADMIN):
        assert httpx.get(base, headers=bearer(secret)).json()["status"] == "finished"
    error(httpx.get(base, headers=bearer(BOB)), 403)
    error(httpx.post(f"{base}/finish", json={"reward": 0.5}, headers=bearer(mine["api_key"])), 409)
    error(httpx.get(f"{url}/api/v1/episodes/ep-nope", headers=bearer(ALICE)), 404)
    error(httpx.get(f"{url}/api/v1/episodes/ep-nope"), 401)  # no credential learns nothing about ids
    assert (
        httpx.post(f"{url}/api/v1/episodes/{other['episode_id']}/abort", headers=bearer(ADMIN)).status_code
        == 200
    )


@pytest.fixture(scope="module")
def admin_only(tmp_path_factory: pytest.TempPathFactory, tiny_engine: Any) -> Iterator[LiveServer]:
    """A server with an admin token and no client token (how a3r and most users start one)."""
    yield from serving(tmp_path_factory.mktemp("admin-only"), tiny_engine, {})


@pytest.mark.parametrize("began_with", ["admin", "nothing"])
def test_without_client_tokens_an_episode_still_answers_only_its_key_or_the_admin(
    admin_only: LiveServer, began_with: str
) -> None:
    """No credential is never an owner: read, finish, abort and heartbeat are 401 without one (the
    episode's prompts, completions and reward stay private, nobody sets its reward), 403 with another
    episode's key or any other secret, and work with the episode's key or the admin token."""
    url = admin_only.url
    mine = begin(url, bearer(ADMIN) if began_with == "admin" else {}).json()
    other = begin(url, {}).json()
    eid, key = mine["episode_id"], mine["api_key"]
    base = f"{url}/api/v1/episodes/{eid}"
    calls = {
        "read": lambda h: httpx.get(base, headers=h),
        "heartbeat": lambda h: httpx.post(f"{base}/heartbeat", headers=h),
        "finish": lambda h: httpx.post(f"{base}/finish", json={"reward": 1.0}, headers=h),
        "abort": lambda h: httpx.post(f"{base}/abort", headers=h),
    }
    for call in calls.values():
        error(call({}), 401, "missing credential", eid)
        error(call(bearer(other["api_key"])), 403, "does not belong")
        error(call(bearer("guess-" + secrets.token_hex(8))), 403, "wrong credential")
    error(httpx.get(f"{url}/api/v1/episodes/ep-nope"), 401)  # no credential learns nothing about ids
    assert calls["heartbeat"](bearer(key)).status_code == 200
    assert calls["read"](bearer(key)).json()["status"] == "open"
    assert calls["heartbeat"](bearer(ADMIN)).status_code == 200
    assert calls["finish"](bearer(key)).json()["status"] == "finished"
    assert calls["read"](bearer(ADMIN)).json()["reward"] == 1.0
    assert calls["abort"](bearer(ADMIN)).status_code == 409  # ended: past the credential check
    aborted = httpx.post(
        f"{url}/api/v1/episodes/{other['episode_id']}/abort", headers=bearer(other["api_key"])
    )
    assert aborted.json()["status"] == "aborted"


def test_control_routes_refuse_client_tokens_and_tell_missing_from_wrong(guarded: LiveServer) -> None:
    status = f"{guarded.url}/api/v1/status"
    error(httpx.get(status), 401, "missing admin token")
    error(httpx.get(status, headers=bearer("wrong")), 403, "wrong admin token")
    error(httpx.get(status, headers=bearer(ALICE)), 403, "client tokens cannot")
    assert httpx.get(status, headers=bearer(ADMIN)).status_code == 200


def test_the_client_library_passes_the_tokens(guarded: LiveServer) -> None:
    with SwarmClient(guarded.url, client_token=ALICE, client_id="lib") as client:
        with client.episode("lib") as ep:
            ep.heartbeat()
            assert client.get_episode(ep.id).status == "open"
            ep.finish(1.0)
        assert client.get_episode(ep.id).reward == 1.0  # read with the key, kept after the finish
    with SwarmClient(guarded.url) as anonymous, pytest.raises(ClientError) as info:
        anonymous.begin("nope")
    assert info.value.status_code == 401 and "client token" in str(info.value)


def test_no_client_token_may_be_named_like_the_admin(tmp_path: Path, tiny_engine: Any) -> None:
    """Episodes begun with the admin token are owned by "admin", which skips the client-token limits: a
    client token of that name would skip them too, so the name is refused at start and live."""
    with pytest.raises(ValueError, match="reserved for the admin token"):
        ServerConfig(admin_token=SecretStr(ADMIN), client_tokens={"admin": SecretStr(ALICE)})
    live = make_server(
        tmp_path, tiny_engine, training=TrainingConfig(enabled=False), admin_token=SecretStr(ADMIN)
    )
    try:
        with SwarmClient(live.url, admin_token=ADMIN) as admin:
            with pytest.raises(ClientError) as reserved:
                admin.add_client_token("admin", ALICE)
            assert reserved.value.status_code == 422 and "reserved" in str(reserved.value)
            assert admin.client_tokens() == []
        assert begin(live.url, {}).status_code == 201  # nothing was added: begins still need no token
    finally:
        live.stop()


def test_tokens_are_added_and_revoked_live(tmp_path: Path, tiny_engine: Any) -> None:
    live = make_server(
        tmp_path, tiny_engine, training=TrainingConfig(enabled=False), admin_token=SecretStr(ADMIN)
    )
    try:
        assert begin(live.url, {}).status_code == 201  # no client token configured: a trusted network
        with SwarmClient(live.url, admin_token=ADMIN) as admin:
            minted = admin.add_client_token("carol")
            assert minted.token.startswith("swc-") and len(minted.token) > 30
            with pytest.raises(ClientError) as taken:
                admin.add_client_token("carol")
            assert taken.value.status_code == 409
            error(begin(live.url, {}), 401)  # from now on begins need a client token
            held = begin(live.url, bearer(minted.token)).json()
            assert [(t.name, t.open_episodes) for t in admin.client_tokens()] == [("carol", 1)]
            assert admin.revoke_client_token("carol").open_episodes == 1
            error(begin(live.url, bearer(minted.token)), 403, "unknown or revoked")
            error(begin(live.url, {}), 401)  # revoking every token does not reopen the server
            finish = f"{live.url}/api/v1/episodes/{held['episode_id']}/finish"
            error(httpx.post(finish, json={"reward": 1.0}, headers=bearer(minted.token)), 403)
            assert (
                httpx.post(finish, json={"reward": 1.0}, headers=bearer(held["api_key"])).status_code == 200
            )
            with pytest.raises(ClientError) as unknown:
                admin.revoke_client_token("carol")
            assert unknown.value.status_code == 404
    finally:
        live.stop()


def test_no_secret_reaches_logs_events_the_pool_or_errors(
    tmp_path: Path, tiny_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    admin, client = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    live = make_server(
        tmp_path,
        tiny_engine,
        training=TrainingConfig(enabled=False),
        admin_token=SecretStr(admin),
        client_tokens={"c": SecretStr(client)},
    )
    answers: list[str] = []
    keys: list[str] = []
    try:
        with (
            SwarmClient(live.url, client_token=client) as swarm,
            SwarmClient(live.url, admin_token=admin) as ops,
        ):
            for reward in (1.0, 0.0):
                with swarm.episode("secret") as ep:
                    keys.append(ep.api_key)
                    answers.append(
                        httpx.post(
                            f"{ep.base_url}/chat/completions",
                            json={"model": ep.model, "messages": QUESTION, "max_tokens": 2},
                            headers=bearer(ep.api_key),
                        ).text
                    )
                    ep.finish(reward)
            with swarm.episode("aborted"):
                pass
            added = ops.add_client_token("late", "late-token-" + secrets.token_hex(8))
            ops.revoke_client_token("late")
            answers.append(ops.client_tokens().__repr__())
            answers.append(str(ops.status()))
            answers.append(str(ops.events()))
        for wrong in (client + "x", keys[0], added.token, admin[:-1]):
            for url in ("/api/v1/status", "/api/v1/episodes", f"/api/v1/episodes/{ep.id}"):
                answers.append(httpx.get(live.url + url, headers=bearer(wrong)).text)
                answers.append(httpx.post(live.url + url, json={}, headers=bearer(wrong)).text)
    finally:
        live.stop()
    run = tmp_path / "run"
    stored = "".join(
        str(row) for row in sqlite3.connect(run / "pool.db").execute("SELECT * FROM episodes").fetchall()
    )
    places = {
        "logs": caplog.text,
        "events.jsonl": (run / "events.jsonl").read_text(),
        "pool": stored + (run / "pool.db").read_bytes().decode("latin-1"),
        "answers": "\n".join(answers),
    }
    owners = sqlite3.connect(run / "pool.db").execute("SELECT DISTINCT owner FROM episodes").fetchall()
    assert owners == [("c",)]  # episodes' owners are named by the token's name, never the token
    for where, text in places.items():
        for secret in (admin, client, added.token, *keys):
            assert secret not in text, f"a secret reached {where}"


def test_a_server_beyond_loopback_without_tokens_warns(
    tmp_path: Path, tiny_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="swarm.server.runtime")
    exposed = SwarmRuntime(
        ServerConfig(run_dir=tmp_path / "a", host="0.0.0.0", training=TrainingConfig(enabled=False)),
        tiny_engine,
    )
    try:
        warnings = exposed.exposure_warnings()
        assert (
            len(warnings) == 2
            and "without client tokens" in warnings[0]
            and "without an admin token" in warnings[1]
        )
        assert "0.0.0.0 without client tokens" in caplog.text
        assert any(e.kind == "server.exposed" for e in exposed.events.recent())
    finally:
        exposed.close()
    guarded = SwarmRuntime(
        ServerConfig(
            run_dir=tmp_path / "b",
            host="0.0.0.0",
            admin_token=SecretStr(ADMIN),
            client_tokens={"a": SecretStr(ALICE)},
            training=TrainingConfig(enabled=False),
        ),
        tiny_engine,
    )
    loopback = SwarmRuntime(
        ServerConfig(run_dir=tmp_path / "c", training=TrainingConfig(enabled=False)), tiny_engine
    )
    try:
        assert guarded.exposure_warnings() == [] and loopback.exposure_warnings() == []
    finally:
        guarded.close()
        loopback.close()


def test_a_pool_from_before_credentials_gains_the_owner_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE episodes (id TEXT PRIMARY KEY, task_id TEXT NOT NULL, client_id TEXT NOT NULL, "
            "family TEXT, kind TEXT NOT NULL, status TEXT NOT NULL, reward REAL, agent_rewards TEXT NOT NULL "
            "DEFAULT '{}', metrics TEXT NOT NULL DEFAULT '{}', metadata TEXT NOT NULL DEFAULT '{}', "
            "trainable_agents TEXT, reason TEXT, created_at REAL NOT NULL, finished_at REAL NOT NULL, "
            "seq INTEGER NOT NULL, trained_step INTEGER)"
        )
        db.execute(
            "INSERT INTO episodes (id, task_id, client_id, kind, status, reward, created_at, finished_at, seq) "
            "VALUES ('ep-old', 't', 'c', 'train', 'finished', 1.0, 0, 1, 1)"
        )
    pool = Pool(path)
    try:
        found = pool.get("ep-old")
        assert found is not None and found[0].owner is None and found[0].key_digest is None
    finally:
        pool.close()


def test_client_routes_need_a_client_token_too(guarded: LiveServer) -> None:
    """Votes, client heartbeats and leaving: a stranger could fake a ready vote (training under
    any_client_ready), a phantom client (blocking all_clients_ready) or delete a real client's vote."""
    url = guarded.url
    for method, path in (("POST", "ready"), ("POST", "heartbeat"), ("DELETE", "")):
        target = f"{url}/api/v1/clients/victim/{path}".rstrip("/")
        body = {"json": {"ready": True}} if path == "ready" else {}
        error(httpx.request(method, target, **body), 401, "missing client token", "vote, heartbeat or leave")
        error(httpx.request(method, target, headers=bearer("guess-" + secrets.token_hex(8)), **body), 403)
        key = begin(url, bearer(ALICE)).json()["api_key"]
        error(httpx.request(method, target, headers=bearer(key), **body), 403, "episode API key")
        # past the credential check; this server does not train, hence 409
        error(httpx.request(method, target, headers=bearer(ALICE), **body), 409)
    with SwarmClient(url, client_token=ALICE) as client, pytest.raises(ClientError) as info:
        client.vote_ready()  # the client library sends its token
    assert info.value.status_code == 409


def test_tokens_are_not_episode_keys_on_the_completion_routes(guarded: LiveServer) -> None:
    """A known client or admin token on a completion route is a wrong credential (403) with a hint, not
    a plain "invalid episode key" (403 too)."""
    body = {"model": "tiny-smollm2", "messages": QUESTION, "max_tokens": 1}
    for secret in (ALICE, ADMIN):
        r = httpx.post(f"{guarded.url}/v1/chat/completions", json=body, headers=bearer(secret))
        error(r, 403, "cannot sample completions", "api_key")
    r = httpx.post(
        f"{guarded.url}/v1/chat/completions", json=body, headers=bearer("sk-swarm-" + secrets.token_hex(8))
    )
    assert r.status_code == 403  # an unknown key is a wrong credential too (README §Security)


@pytest.mark.parametrize(
    "token",
    [
        "ünïcödé-secret-secret",
        "tab\tsecretsecretsecret ",
        " leading-secret-secret",
        "line1secretsecret\r\nX-Injected: 1",
    ],
    ids=["non-ascii", "trailing-space", "leading-space", "crlf"],
)
def test_a_token_no_header_can_carry_is_422(guarded: LiveServer, token: str) -> None:
    """A client token outside visible ASCII could never authenticate (httpx refuses to send it, HTTP strips
    surrounding whitespace, a line break ends the header): adding one is a 422 naming the rule, not the
    token, and nothing is added."""
    added = httpx.post(
        f"{guarded.url}/api/v1/client-tokens", json={"name": "uni", "token": token}, headers=bearer(ADMIN)
    )
    message = error(added, 422, "only visible ASCII characters")
    assert "secret" not in message
    names = httpx.get(f"{guarded.url}/api/v1/client-tokens", headers=bearer(ADMIN)).json()
    assert "uni" not in [t["name"] for t in names]


def test_a_credential_sent_the_wrong_way_is_named(guarded: LiveServer) -> None:
    """A 401 says what the request sent instead of a bearer credential, never echoing it: ``x-api-key`` on
    an episode route (the completion routes take it), another ``Authorization`` scheme, a bare Bearer."""
    url = guarded.url
    began = begin(url, bearer(ALICE)).json()
    episode = f"{url}/api/v1/episodes/{began['episode_id']}"
    message = error(httpx.get(episode, headers={"x-api-key": began["api_key"]}), 401, "missing credential")
    assert "x-api-key is taken only by the completion routes" in message and began["api_key"] not in message
    basic = {"Authorization": "Basic " + ADMIN}
    message = error(httpx.get(f"{url}/api/v1/status", headers=basic), 401, "missing admin token")
    assert "uses 'Basic'; send 'Authorization: Bearer <token>'" in message and ADMIN not in message
    error(begin(url, basic), 401, "missing client token", "uses 'Basic'")
    error(httpx.get(episode, headers={"Authorization": "Bearer"}), 401, "carries no token after 'Bearer'")
    chat = {"model": began["model"], "messages": QUESTION, "max_tokens": 1}
    error(httpx.post(f"{url}/v1/chat/completions", json=chat, headers=basic), 401, "uses 'Basic'")
    # the completion routes take x-api-key: no hint against it there
    assert httpx.get(episode, headers=bearer(began["api_key"])).status_code == 200


def test_a_server_without_an_admin_token_does_not_ask_for_one(tmp_path: Path, tiny_engine: Any) -> None:
    live = make_server(tmp_path, tiny_engine, training=TrainingConfig(enabled=False))
    try:
        began = begin(live.url, {}).json()
        episode = f"{live.url}/api/v1/episodes/{began['episode_id']}"
        message = error(httpx.get(episode), 401, "missing credential", "episode's api_key")
        assert "admin" not in message and "client token" not in message, message
        message = error(httpx.get(episode, headers=bearer("guess-" + secrets.token_hex(8))), 403)
        assert "admin" not in message, message
    finally:
        live.stop()
    # client tokens and no admin token: the 401 names the key and the token that began it, not an admin
    live = make_server(
        tmp_path / "clients",
        tiny_engine,
        training=TrainingConfig(enabled=False),
        client_tokens={"alice": SecretStr(ALICE)},
    )
    try:
        began = begin(live.url, bearer(ALICE)).json()
        message = error(httpx.get(f"{live.url}/api/v1/episodes/{began['episode_id']}"), 401)
        assert "the episode's api_key or the client token that began it" in message, message
        assert "admin" not in message, message
    finally:
        live.stop()
