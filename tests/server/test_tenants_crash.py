"""kill -9 of a server with LoRA tenants: every tenant resumes from its own checkpoints (and journal), no
tenant's step counter goes back, and every episode of every tenant is trained exactly once.

A real ``swarm serve --tenants 2`` child process over a tiny model, killed with SIGKILL after steps of
both tenants, and again right after one tenant's step while the other may be rolling.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from swarm.client import SwarmClient
from tests.conftest import build_tiny_model, free_port, serve_process, wait_for

pytestmark = pytest.mark.slow

ADMIN = secrets.token_urlsafe(16)
TENANTS = ("alpha", "beta")


def _serve(model_dir: Path, run_dir: Path, port: int) -> subprocess.Popen[bytes]:
    flags = ["--tenants", "2", "--lora-rank", "4", "--batch-policy", "episodes", "--batch-size", "1"]
    flags += ["--group-size", "2", "--lr", "1e-3", "--admin-token", ADMIN]
    return serve_process(model_dir, run_dir, port, *flags)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _http(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)


def _steps(url: str) -> dict[str, int]:
    with _http(url) as http:
        return {t["id"]: t["step"] for t in http.get("/api/v1/tenants").json()}


def _rows(url: str, tenant: str) -> list[int]:
    with _http(url) as http:
        return [row["step"] for row in http.get(f"/api/v1/tenants/{tenant}/metrics").json()]


def _group(url: str, tenant: str, task_id: str) -> list[str]:
    out = []
    with SwarmClient(url, admin_token=ADMIN, client_token=ADMIN) as client:
        for reward in (1.0, 0.0):
            with client.episode(task_id, tenant=tenant) as ep:
                OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
                    model=ep.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
                )
                ep.finish(reward)
            out.append(ep.id)
    return out


def test_kill_9_resumes_every_tenant_once(tmp_path: Path, embedded_source: Any, tokenizer: Any) -> None:
    model_dir = tmp_path / "tiny"
    build_tiny_model(embedded_source, seed=3).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    run_dir, port = tmp_path / "run", free_port()
    url = f"http://127.0.0.1:{port}"
    groups: dict[str, dict[str, list[str]]] = {t: {} for t in TENANTS}
    proc = _serve(model_dir, run_dir, port)
    try:
        with _http(url) as http:
            for seed, tenant in enumerate(TENANTS):
                assert http.post("/api/v1/tenants", json={"id": tenant, "seed": seed}).status_code == 201
        # 1. both tenants take step 1, then the server is killed
        for tenant in TENANTS:
            groups[tenant]["g1"] = _group(url, tenant, f"{tenant}-1")
        wait_for(lambda: _steps(url) == {"alpha": 1, "beta": 1}, 120, "step 1 of both tenants")
        _kill(proc)
        proc = _serve(model_dir, run_dir, port)
        assert _steps(url) == {"alpha": 1, "beta": 1}
        assert all(_rows(url, t) == [1] for t in TENANTS)

        # 2. killed right after alpha's step 2 is published (beta's step 2 may be anywhere)
        for tenant in TENANTS:
            groups[tenant]["g2"] = _group(url, tenant, f"{tenant}-2")
        wait_for(lambda: _rows(url, "alpha") == [1, 2], 120, "alpha's step 2")
        _kill(proc)
        proc = _serve(model_dir, run_dir, port)
        steps = _steps(url)
        assert steps["alpha"] == 2 and steps["beta"] in (1, 2)
        wait_for(lambda: _steps(url)["beta"] == 2, 120, "beta's step 2 (trained again if it was lost)")

        # 3. one more step each: the resumed tenants train on
        for tenant in TENANTS:
            groups[tenant]["g3"] = _group(url, tenant, f"{tenant}-3")
        wait_for(lambda: _steps(url) == {"alpha": 3, "beta": 3}, 120, "step 3 of both tenants")
        with SwarmClient(url, admin_token=ADMIN) as client:
            for tenant in TENANTS:
                trained = {
                    name: {client.get_episode(e).trained_step for e in ids}
                    for name, ids in groups[tenant].items()
                }
                assert trained == {"g1": {1}, "g2": {2}, "g3": {3}}, (tenant, trained)
                assert _rows(url, tenant) == [1, 2, 3]
        with _http(url) as http:
            views = {t["id"]: t for t in http.get("/api/v1/tenants").json()}
        assert all(views[t]["pending"] == 0 and views[t]["trained"] == 6 for t in TENANTS)
    finally:
        proc.kill()
        proc.wait()
