"""The framework fence (`swarm.server.framework`): pinned ranges, and the standard path outside them."""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.config import TrainingConfig
from swarm.server import framework
from swarm.server.http_protocol import http_protocol
from tests.conftest import make_server

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_pins_the_tested_ranges() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for package, (low, high) in framework.TESTED.items():
        pin = next(d for d in deps if re.match(rf"{package}(\[.*\])?[><=]", d))
        assert pin.split("]")[-1].removeprefix(package) == f">={low},<{high}", pin


def test_the_installed_frameworks_are_the_tested_ones() -> None:
    assert framework.untested(framework.TESTED) == []
    assert framework.version_tuple("0.165.0rc1") == (0, 165, 0) and framework.version_tuple("dev") == ()


@pytest.fixture
def untested_frameworks(monkeypatch: pytest.MonkeyPatch) -> None:
    """FastAPI and uvicorn report versions past their tested ranges (Starlette stays as installed)."""
    real = framework.installed_version
    fake = {"fastapi": "0.999.0", "uvicorn": "1.0.0"}
    monkeypatch.setattr(framework, "installed_version", lambda package: fake.get(package) or real(package))
    monkeypatch.setattr(framework, "_reported", set())


def test_untested_versions_serve_through_the_standard_path(
    untested_frameworks: None, tmp_path: Path, tiny_engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A real server with an untested FastAPI and uvicorn: FastAPI's own route handlers and router serve
    begin, chat completion and finish (no hot route joins), uvicorn's own protocol carries them, and
    each fallback is logged in one line."""
    caplog.set_level(logging.WARNING, logger=framework.__name__)
    assert http_protocol() == "auto"
    live = make_server(tmp_path, tiny_engine, training=TrainingConfig(enabled=False))
    try:
        app = live._server.config.app  # type: ignore[union-attr]
        with httpx.Client(base_url=live.url, timeout=60) as http:
            for _ in range(2):
                begun = http.post("/api/v1/episodes", json={"task_id": "fenced", "kind": "eval"})
                assert begun.status_code == 201, begun.text
                episode = begun.json()
                answer = http.post(
                    "/v1/chat/completions",
                    json={
                        "model": episode["model"],
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 2,
                    },
                    headers={"Authorization": f"Bearer {episode['api_key']}"},
                )
                assert answer.status_code == 200, answer.text
                finished = http.post(
                    f"/api/v1/episodes/{episode['episode_id']}/finish",
                    json={"reward": 1.0},
                    headers={
                        "Authorization": f"Bearer {episode['api_key']}"
                    },  # issue 35: no credential is a 401
                )
                assert finished.status_code == 200 and finished.json()["status"] == "finished"
        assert app.hot_routes.routes == [] and app._hot_stack is None
        assert live._server.config.http == "auto"  # type: ignore[union-attr]
    finally:
        live.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == framework.__name__]
    assert len(lines) == 2, lines
    assert any(line.startswith("lean routes off: fastapi 0.999.0 (tested: >=0.115,<0.166)") for line in lines)
    assert any(line.startswith("coalescing HTTP protocol off: uvicorn 1.0.0") for line in lines)
