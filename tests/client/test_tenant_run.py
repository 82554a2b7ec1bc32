"""``swarm run --tenant ID`` against a real ``swarm serve --tenants 2 --lora-rank 8`` child process: every
episode the runner begins (train and eval) is recorded under the tenant, that tenant steps and the other
one does not; the client's tenant routes create, read and retire tenants."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

from swarm.client import SwarmClient
from swarm.pool import Pool
from swarm.protocol import EpisodeKind, TenantState
from tests.client.conftest import CHAT_WORKFLOW, swarm_run, write_jsonl, write_workflow
from tests.conftest import free_port, serve_process, wait_for

pytestmark = pytest.mark.slow

ADMIN = secrets.token_urlsafe(16)


def test_swarm_run_under_a_tenant_trains_only_that_tenant(tmp_path: Path, tiny_model_dir: Path) -> None:
    run_dir, port = tmp_path / "run", free_port()
    url = f"http://127.0.0.1:{port}"
    flags = ["--tenants", "2", "--lora-rank", "8", "--batch-policy", "tasks", "--batch-size", "1"]
    flags += ["--group-size", "2", "--lr", "1e-3", "--admin-token", ADMIN]
    proc = serve_process(tiny_model_dir, run_dir, port, *flags)
    try:
        with SwarmClient(url, admin_token=ADMIN) as admin:
            alpha = admin.create_tenant("alpha", seed=0, max_steps=2)
            admin.create_tenant("beta", seed=1)
            assert alpha.state is TenantState.ACTIVE and alpha.settings["max_steps"] == 2
            workflow = write_workflow(tmp_path, CHAT_WORKFLOW)
            rows = [{"id": f"t{i}", "question": "2+2?", "value": float(i % 2)} for i in range(2)]
            data = write_jsonl(tmp_path / "data.jsonl", rows)
            evals = write_jsonl(tmp_path / "eval.jsonl", [{"id": "e0", "question": "1+1?", "value": 1.0}])
            args = [str(workflow), "--server", url, "--dataset", str(data), "--group-size", "2"]
            args += ["--eval-dataset", str(evals), "--eval-every", "2", "--state-dir", str(tmp_path / "st")]
            args += ["--tenant", "alpha", "--client-token", ADMIN, "--no-progress"]
            out, _ = swarm_run(args).communicate(timeout=300)
            assert "finished" in out, out
            wait_for(lambda: admin.tenant("alpha").step >= 2, 120, "alpha's steps")
            assert admin.tenant("beta").step == 0 and admin.tenant("beta").trained == 0
            assert [row.step for row in admin.tenant_metrics("alpha")] == [1, 2]
            assert admin.tenant_metrics("beta") == []
            retired = admin.retire_tenant("alpha")
            assert retired.state is TenantState.RETIRED and retired.checkpoint
            assert [t.id for t in admin.tenants()] == ["beta", "alpha"]
            assert admin.create_tenant(id="gamma", seed=2).id == "gamma"  # fresh36: id= as in the JSON
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    pool = Pool(run_dir / "pool.db")
    try:
        episodes = [e for e in pool.recent(1000) if e.client_id.startswith("runner-")]
    finally:
        pool.close()
    kinds = sorted(e.kind.value for e in episodes)
    assert kinds == sorted([EpisodeKind.TRAIN.value] * 4 + [EpisodeKind.EVAL.value]), kinds
    assert {e.tenant for e in episodes} == {"alpha"}


def test_run_options_pass_the_tenant_to_the_runner() -> None:
    from swarm.run_options import RunOptions

    options = RunOptions(workflow="w.py", server=["http://x"], dataset="d.jsonl", tenant="alpha")
    assert options.runner_config().tenant == "alpha"
    with pytest.raises(Exception, match="--tenant"):
        RunOptions(workflow="w.py", server=["http://x"], dataset="d.jsonl", tenant="Bad Id").runner_config()
