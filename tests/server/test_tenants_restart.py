"""Restarting a run dir that holds LoRA tenants (issue 36, a fresh user's findings 3, 4 and 7).

- ``swarm serve`` without ``--tenants``, or with fewer than the run dir's resident tenants, is refused in
  one line (``--check`` too) and changes nothing; a one-policy runtime refuses it as well, and the pool's
  one-policy queries never see a tenant's episodes;
- a tenant's settings are fixed at its creation (the server's flags filled in) and survive a restart with
  other flags; a record written without them takes the flags once;
- across the restarts no episode is trained twice.

Real servers on loopback over the tiny model (a fresh copy per server: tenants inject adapters), the real
CLI (Typer's runner), real SQLite.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from typer.testing import CliRunner

from swarm.batch import BatchConfig, BatchPolicy
from swarm.cli import app
from swarm.client import SwarmClient
from swarm.config import ServerConfig, TrainingConfig
from swarm.engine import HFEngine
from swarm.pool import Pool
from swarm.server.runtime import SwarmRuntime
from swarm.server.tenants import TenantsOnDisk
from swarm.train.config import LoraSettings, TrainerConfig
from tests.conftest import LiveServer, build_tiny_model, make_server, wait_for

ADMIN = secrets.token_urlsafe(16)
LORA = LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
runner = CliRunner()


def _training(batch_size: int, group_size: int, lr: float) -> TrainingConfig:
    return TrainingConfig(
        batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=batch_size, group_size=group_size),
        trainer=TrainerConfig(lr=lr, lora=LORA),
    )


def _serve(tmp_path: Path, source: Any, tokenizer: Any, training: TrainingConfig) -> LiveServer:
    engine = HFEngine(build_tiny_model(source, seed=1), tokenizer, "tiny-tenants")
    return make_server(tmp_path, engine, tenants=2, training=training, admin_token=ADMIN)


def _stop(live: LiveServer) -> None:
    live.stop()
    assert live.engine is not None
    live.engine.close()


def _http(live: LiveServer) -> httpx.Client:
    return httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)


def _view(live: LiveServer, tenant: str) -> dict[str, Any]:
    with _http(live) as http:
        answer: dict[str, Any] = http.get(f"/api/v1/tenants/{tenant}").json()
    return answer


def _settings(live: LiveServer, tenant: str) -> tuple[float, int, int]:
    s = _view(live, tenant)["settings"]
    return s["lr"], s["batch_size"], s["group_size"]


def _rollout(live: LiveServer, tenant: str, task_id: str, reward: float) -> str:
    with SwarmClient(live.url, client_token=ADMIN) as client, client.episode(task_id, tenant=tenant) as ep:
        OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
            model=ep.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
        )
        ep.finish(reward)
    return ep.id


def _trained(live: LiveServer, ids: list[str]) -> list[int | None]:
    with SwarmClient(live.url, admin_token=ADMIN) as client:
        return [client.get_episode(e).trained_step for e in ids]


def _refused(args: list[str]) -> str:
    result = runner.invoke(app, ["serve", "--port", "0", *args])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
    return lines[0]


def _snapshot(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_tenants_run_dir_restarts_only_as_tenants_and_keeps_settings_and_trains_each_episode_once(
    tmp_path: Path, embedded_source: Any, tokenizer: Any
) -> None:
    run_dir = tmp_path / "run"
    # 1. B=1 G=2: ta (its lr given) and tb (nothing given); tb trains sub1 (step 1) and pools half of sub2
    live = _serve(tmp_path, embedded_source, tokenizer, _training(1, 2, 1e-2))
    try:
        with _http(live) as http:
            assert http.post("/api/v1/tenants", json={"id": "ta", "lr": 1e-3, "seed": 1}).status_code == 201
            assert http.post("/api/v1/tenants", json={"id": "tb", "seed": 2}).status_code == 201
        sub1 = [_rollout(live, "tb", "sub1", 1.0), _rollout(live, "tb", "sub1", 0.0)]
        wait_for(lambda: _view(live, "tb")["step"] == 1, 120, "tb's step 1")
        sub2 = [_rollout(live, "tb", "sub2", 1.0)]
        assert _settings(live, "ta") == (1e-3, 1, 2) and _settings(live, "tb") == (1e-2, 1, 2)
    finally:
        _stop(live)
    record = json.loads((run_dir / "tenants" / "tb" / "tenant.json").read_text())
    assert record["resolved"]["batch_size"] == 1 and record["resolved"]["lr"] == 1e-2
    # ta as an older server wrote it: no resolved settings
    ta_file = run_dir / "tenants" / "ta" / "tenant.json"
    legacy = json.loads(ta_file.read_text())
    del legacy["resolved"]
    ta_file.write_text(json.dumps(legacy))

    # 2. refused in one line, nothing changed: no --tenants (with and without --check), too few, a runtime
    before = _snapshot(run_dir)
    line = _refused(["--run-dir", str(run_dir), "--check"])
    assert line == (
        f"error: --run-dir {run_dir} holds 2 tenants (ta, tb) and no --tenants was given: "
        "start it with --tenants 2 or more, or use another --run-dir"
    )
    assert _refused(["--run-dir", str(run_dir)]) == line
    fewer = _refused(["--run-dir", str(run_dir), "--tenants", "1", "--lora-rank", "4", "--check"])
    assert "holds 2 tenants (ta, tb) and --tenants 1 was given: start it with --tenants 2 or more" in fewer
    assert _refused(["--run-dir", str(run_dir), "--tenants", "1", "--lora-rank", "4"]) == fewer
    with pytest.raises(TenantsOnDisk, match="no --tenants was given"):
        SwarmRuntime(ServerConfig(run_dir=run_dir, training=_training(1, 2, 1e-2)))
    assert _snapshot(run_dir) == before and not (run_dir / "server.lock").exists()
    # the one-policy queries of the pool leave a tenant's episodes alone (defence in depth)
    pool = Pool(run_dir / "pool.db")
    try:
        assert pool.pending() == [] and pool.trained_steps_after(0) == []
        pool.mark_trained(sub2, 9)
        assert pool.rewind(0) == 0
        assert pool.partition("tb").trained_steps_after(0) == [1]
        assert [e.id for e in pool.partition("tb").pending()] == sub2
    finally:
        pool.close()

    # 3. other flags (B=4 G=4, lr 5e-2): tb keeps its settings, the legacy ta takes these flags once
    live = _serve(tmp_path, embedded_source, tokenizer, _training(4, 4, 5e-2))
    try:
        assert _settings(live, "tb") == (1e-2, 1, 2)
        assert _settings(live, "ta") == (1e-3, 4, 4)
        tb = _view(live, "tb")
        assert (tb["step"], tb["pending"], tb["trained"]) == (1, 1, 2)
    finally:
        _stop(live)
    assert json.loads(ta_file.read_text())["resolved"]["batch_size"] == 4

    # 4. other flags again (B=2 G=2): nothing moves; tb's sub2 completes and is its step 2, sub1 stays step 1
    live = _serve(tmp_path, embedded_source, tokenizer, _training(2, 2, 1e-1))
    try:
        assert _settings(live, "tb") == (1e-2, 1, 2) and _settings(live, "ta") == (1e-3, 4, 4)
        sub2.append(_rollout(live, "tb", "sub2", 0.0))
        wait_for(lambda: _view(live, "tb")["step"] == 2, 120, "tb's step 2")
        assert _trained(live, sub1) == [1, 1] and _trained(live, sub2) == [2, 2]
        tb = _view(live, "tb")
        assert (tb["pending"], tb["trained"]) == (0, 4)
        assert _view(live, "ta")["step"] == 0
    finally:
        _stop(live)
