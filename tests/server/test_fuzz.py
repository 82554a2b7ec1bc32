"""Schemathesis against the served OpenAPI document of live servers (tiny model), as users meet them: once
with client tokens and once with only an admin token. Every operation, the chat completion and Anthropic
routes included, gets every check schemathesis has over its examples, coverage and fuzzing phases, and a
stateful run follows the document's links (begin → chat → finish). No answer may be a server error or fail
a check: the document states every bound the server enforces, every status it sends, and which credential
each route needs on this server; 405 answers carry ``Allow``."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import schemathesis
from pydantic import SecretStr
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events

from swarm.config import TrainingConfig
from swarm.protocol import Limits
from tests.conftest import LiveServer, make_server

ADMIN = secrets.token_urlsafe(16)
CLIENT = secrets.token_urlsafe(16)
EXAMPLES = int(os.environ.get("SWARM_FUZZ_EXAMPLES", "8"))
"""Generated requests per operation in the fuzzing phase (the coverage phase adds its own); 8 keep both
servers' runs near a minute on 2 cores; set ``SWARM_FUZZ_EXAMPLES`` for a longer hunt."""
SEMANTIC = ["2xx", "400", "401", "403", "404", "409", "422", "429"]
"""What a schema-valid completion request may get: these routes also check rules JSON Schema cannot state
(a tool message answers an earlier call of the conversation, the chat template renders the messages,
sampling options the engine cannot honour are refused rather than ignored), answered 400 or 422."""


EPISODE_LIFE = r"^/(api/v1/episodes(/\{episode_id\}/finish)?|v1/chat/completions|v1/messages)$"
"""The operations of the stateful run: begin and where its links lead (the completion routes, finish)."""


@dataclass
class Target:
    live: LiveServer
    key: str
    """An open episode's key, for the completion routes."""
    tokens: bool
    """Whether the server has client tokens."""


@pytest.fixture(params=["client-tokens", "admin-only"])
def fuzzed(request: pytest.FixtureRequest, tmp_path: Path, tiny_engine: Any) -> Iterator[Target]:
    """A server in inference mode (completions capped at 4 tokens) with the admin token, and client tokens
    or none, with one open episode. One per test: a run changes its server (the whole-API run adds client
    tokens to the admin-only one, patches limits, pauses), and the next run must meet the server it names."""
    tokens = request.param == "client-tokens"
    live = make_server(
        tmp_path,
        tiny_engine,
        training=TrainingConfig(enabled=False),
        admin_token=SecretStr(ADMIN),
        client_tokens={"fuzz": SecretStr(CLIENT)} if tokens else {},
        limits=Limits(max_tokens=4, max_n=2, max_messages=8),
        episode_timeout_s=3600,
    )
    begun = httpx.post(
        f"{live.url}/api/v1/episodes", json={"task_id": "fuzz"}, headers=_bearer(CLIENT if tokens else ADMIN)
    )
    yield Target(live, begun.json()["api_key"], tokens)
    live.stop()


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _config(*, stateful: bool) -> SchemathesisConfig:
    """Every check and phase, per operation the statuses it may send for rules JSON Schema cannot state.
    No credential here: schemathesis (4.32) builds one HTTP session per thread from the configuration of
    the first operation it calls and sends that operation's headers with every later request, so one
    operation's ``headers`` reach every operation (the admin token reached the completion routes: 403 for
    every stateful call). `_credential` sets each request's own, as an auth provider."""
    return SchemathesisConfig.from_dict(
        {
            "generation": {"max-examples": EXAMPLES, "deterministic": True, "database": "none"},
            "phases": {
                "examples": {"enabled": not stateful},
                "coverage": {"enabled": not stateful},
                "fuzzing": {"enabled": not stateful},
                "stateful": {"enabled": stateful, "max-steps": 6},
            },
            "operations": [
                # the stateful run follows the episode's life (with every operation, sequences dwell on
                # the client-token links); schema.include() is not honoured there next to these entries
                *([{"exclude-path-regex": EPISODE_LIFE, "enabled": False}] if stateful else []),
                {
                    # begin: a tenant must be one the server hosts, which JSON Schema cannot state (400, 404)
                    "include-name": "POST /api/v1/episodes",
                    "checks": {"positive_data_acceptance": {"expected-statuses": SEMANTIC}},
                },
                {
                    "include-path-regex": "^/v1/(chat|messages)",
                    "checks": {"positive_data_acceptance": {"expected-statuses": SEMANTIC}},
                },
                {
                    # a teacher's routes: start must not pass the ids (422) and each id must be in the
                    # vocabulary (400), which JSON Schema cannot state
                    "include-path-regex": "^/(v1/score|tokenize)",
                    "checks": {"positive_data_acceptance": {"expected-statuses": SEMANTIC}},
                },
                {"include-path": "/api/v1/events", "parameters": {"follow": False}},  # following never ends
            ],
        }
    )


def _credential(target: Target, path: str, *, stateful: bool) -> str | None:
    """The secret a request to ``path`` carries as its bearer: the admin token on the control plane,
    begin and a teacher's routes (it may also begin and end any episode), the open episode's key on the
    completion routes; in the stateful run none there: the key each begin answers arrives through the
    document's links (``x-api-key``)."""
    if re.match(r"/v1/(chat|messages)", path):
        return None if stateful else target.key
    return ADMIN if re.match(r"/(api/|v1/score|tokenize)", path) else None


@contextmanager
def _local_constants_off() -> Iterator[None]:
    """Hypothesis (6.13x on) mixes into what it draws the literals of every project module loaded in
    the process (``providers._get_local_constants``: every module in ``sys.modules`` outside
    site-packages and test folders). So the cases of a "deterministic" run depended on which modules the
    tests before this one had imported (collecting ``tests/server/test_disconnect.py`` loads
    ``swarm.client``, and the stateful walk then took another path). Off for these runs, they are the
    same in every process (its cache of permitted constants is emptied on the way in and out)."""
    import hypothesis.internal.conjecture.providers as providers

    original = getattr(providers, "_get_local_constants", None)
    if original is None:  # a Hypothesis without the pool
        yield
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()  # the permitted constants it derived from the pool so far
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()


def _findings(target: Target, *, stateful: bool) -> tuple[list[str], set[tuple[str, str, int]]]:
    """Run schemathesis's engine (what ``schemathesis run`` runs) over every operation: one entry per
    failed check or error, and the (method, path, status) of every answer."""
    schema = schemathesis.openapi.from_url(
        f"{target.live.url}/openapi.json", config=_config(stateful=stateful)
    )

    @schema.auth(refresh_interval=None)
    class Credentials:  # schemathesis's auth provider: `_credential`, as a bearer
        def get(self, case: Any, context: Any) -> str | None:
            return _credential(target, case.path, stateful=stateful)

        def set(self, case: Any, data: str, context: Any) -> None:
            case.headers = {**(case.headers or {}), **_bearer(data)}

    @schema.hook
    def after_call(context: Any, case: Any, response: Any) -> None:
        if case.path == "/api/v1/pause":  # a paused server refuses begins: resume it for the next cases
            httpx.post(f"{target.live.url}/api/v1/resume", headers=_bearer(ADMIN))

    found, answers = [], set()
    with _local_constants_off():
        run = list(schemathesis.engine.from_schema(schema).execute())
    for event in run:
        if isinstance(event, events.ScenarioFinished):
            for interaction in event.recorder.interactions.values():
                if interaction.response is not None:
                    path = urlsplit(interaction.request.uri).path
                    answers.add((interaction.request.method, path, interaction.response.status_code))
            for checks in event.recorder.checks.values():
                found += [
                    f"{event.label}: {check.name}: {check.failure_info.failure.title}\n"
                    f"{check.failure_info.failure.message}\n{check.failure_info.code_sample}"
                    for check in checks
                    if check.failure_info is not None
                ]
        elif isinstance(event, events.NonFatalError | events.FatalError):
            found.append(f"{getattr(event, 'label', '')}: {event.info.format()}")
    return sorted(set(found)), answers


def test_every_operation_answers_as_declared(fuzzed: Target) -> None:
    found, answers = _findings(fuzzed, stateful=False)
    assert not found, "\n\n".join(found)
    past_the_key = {(method, path) for method, path, status in answers if status not in (401, 403)}
    assert {("POST", "/v1/chat/completions"), ("POST", "/v1/messages")} <= past_the_key  # fuzzed, not refused


def test_begin_chat_finish_statefully(fuzzed: Target) -> None:
    """Sequences along the document's links: begin, then the begun episode's key on the completion routes
    (``x-api-key``) and its id on finish."""
    found, answers = _findings(fuzzed, stateful=True)
    assert not found, "\n\n".join(found)
    called = {(method, path.split("/ep-")[0], status < 300) for method, path, status in answers}
    assert ("POST", "/api/v1/episodes", True) in called  # begun
    completions = {("POST", "/v1/chat/completions"), ("POST", "/v1/messages")}
    assert completions <= {(m, p) for m, p, _ in called}
    # a begun episode's key, through a link, past the routes' credential check (the body is fuzzed)
    assert any((m, p) in completions and s not in (401, 403) for m, p, s in answers)
    linked = [path for _, path, status in answers if path.startswith("/api/v1/episodes/ep-") and status < 300]
    assert linked  # a begun episode's id, through a link
