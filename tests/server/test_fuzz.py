"""Schemathesis against the served OpenAPI document of a live server (tiny model): every operation gets
generated requests (valid and invalid, a bounded number each); no answer may be a server error, and every
answer must be declared (status, content type) and match its declared schema."""

from __future__ import annotations

import copy
import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from swarm.client import SwarmClient
from swarm.config import ServerConfig, TrainingConfig
from swarm.engine import HFEngine
from swarm.protocol import Limits
from swarm.server.app import create_app
from tests.conftest import LiveServer, make_server

ADMIN = secrets.token_urlsafe(16)
CLIENT = secrets.token_urlsafe(16)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = int(os.environ.get("SWARM_FUZZ_EXAMPLES", "25"))
"""Generated requests per operation and mode (25 keep the run near 30 s on 2 cores; set
``SWARM_FUZZ_EXAMPLES`` for a longer hunt)."""


@pytest.fixture(scope="module")
def fuzzed(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Any, tokenizer: Any
) -> Iterator[tuple[LiveServer, str]]:
    """A server in inference mode (own model copy, admin and client token, completions capped at 4
    tokens), and the key of one open episode for the completion route."""
    engine = HFEngine(copy.deepcopy(tiny_model), tokenizer, "tiny-fuzz")
    live = make_server(
        tmp_path_factory.mktemp("fuzz"),
        engine,
        training=TrainingConfig(enabled=False),
        admin_token=SecretStr(ADMIN),
        client_tokens={"fuzz": SecretStr(CLIENT)},
        limits=Limits(max_tokens=4, max_n=2, max_messages=8),
        episode_timeout_s=3600,
    )
    with SwarmClient(live.url, client_token=CLIENT) as client:
        episode = client.begin("fuzz")
        yield live, episode.api_key
    live.stop()


def _operations() -> list[tuple[str, str, GenerationMode]]:
    """(METHOD, path, mode) of every operation the app declares (its OpenAPI document needs no model):
    valid requests for each, invalid ones for those whose input can be invalid."""
    doc = create_app(ServerConfig()).openapi()
    out = []
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            out.append((method.upper(), path, GenerationMode.POSITIVE))
            constrained = [p for p in operation.get("parameters", []) if p["schema"].get("type") != "string"]
            if constrained or operation.get("requestBody"):  # a bare string path id has no invalid value
                out.append((method.upper(), path, GenerationMode.NEGATIVE))
    return out


@pytest.fixture(scope="module")
def api_schema(fuzzed: tuple[LiveServer, str]) -> Any:
    url = fuzzed[0].url
    return schemathesis.openapi.from_url(f"{url}/openapi.json")


@pytest.mark.parametrize(("method", "path", "mode"), _operations())
def test_every_answer_is_declared_and_no_server_error(
    method: str, path: str, mode: GenerationMode, api_schema: Any, fuzzed: tuple[LiveServer, str]
) -> None:
    live, key = fuzzed
    operation = api_schema[path][method]
    secret = key if path.startswith("/v1/") else ADMIN
    fixed: dict[str, Any] = {"follow": "false"} if path == "/api/v1/events" else {}  # following never ends

    @given(case=operation.as_strategy(generation_mode=mode, query=fixed or None))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        case.call_and_validate(
            base_url=live.url, headers={"Authorization": f"Bearer {secret}"}, checks=CHECKS, timeout=60
        )
        if path == "/api/v1/pause":  # a paused server refuses begins: resume it for the next operations
            with SwarmClient(live.url, admin_token=ADMIN) as admin:
                admin._request("POST", "/api/v1/resume", admin=True)

    run()
