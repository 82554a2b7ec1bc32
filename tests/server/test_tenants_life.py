"""LoRA tenants' lifecycle (fresh-s5): a retire answers at once in every state, concurrent retires,
voting policies refused, the LoRA rank of a run dir, the base of a tenant checkpoint, paused-tenant begins.

Real servers on loopback over the tiny random model (`tests.server.test_tenants`'s fixture), real SQLite
pool and real peft adapters.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from swarm.cli import app
from swarm.client import ClientError, RetryPolicy, SwarmClient
from swarm.config import ServerConfig, TrainingConfig
from swarm.server.runtime import SwarmRuntime
from swarm.server.tenants import TenantsOnDisk
from swarm.train.config import LoraSettings, TrainerConfig
from tests.conftest import LiveServer, free_port, serve_process, wait_for
from tests.server.test_tenants import ADMIN, admin, create, hold_creates, rollout, tenant, tenant_server

__all__ = ["tenant_server"]  # the fixture, imported for these tests


def begin(live: LiveServer, tenant_id: str, client_id: str = "runner-x") -> httpx.Response:
    return httpx.post(
        f"{live.url}/api/v1/episodes",
        json={"task_id": "x", "tenant": tenant_id, "client_id": client_id},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )


@pytest.mark.parametrize("state", ["timed-wait", "open-episode", "paused", "idle"])
def test_a_retire_answers_at_once_in_every_state(
    tenant_server: LiveServer, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fresh-s5 #1: the tenant's loop waited for a wake-up with a timeout (the voting policies' liveness
    recheck) when the retire aborted its open episode, which wakes the loop, and then cancelled it; Python
    3.11's ``asyncio.wait_for`` swallowed that cancel and the retire waited for the loop for good. Now the
    retire answers at once, the tenant's adapter is saved, and the server stops without a forced cancel."""
    live = tenant_server
    assert create(live, "b1", seed=1).status_code == 201
    loop = live.runtime.tenants.get("b1").loop
    if state == "timed-wait":  # as a voting policy with an active client does: a batch check every 0.25 s
        monkeypatch.setattr(loop, "_recheck_s", lambda: 0.25)
        loop.wake()
    if state in ("timed-wait", "open-episode"):
        assert begin(live, "b1").status_code == 201
    if state == "paused":
        with admin(live) as http:
            assert http.post("/api/v1/tenants/b1/pause").status_code == 200
    started = time.monotonic()
    with admin(live) as http:
        http.timeout = httpx.Timeout(20)
        retired = http.post("/api/v1/tenants/b1/retire")
    assert retired.status_code == 200, retired.text
    assert time.monotonic() - started < 5
    assert retired.json()["state"] == "retired" and retired.json()["checkpoint"]
    assert tenant(live, "b1")["open_episodes"] == 0
    started = time.monotonic()
    live.stop()
    assert time.monotonic() - started < 10 and not live._thread.is_alive()  # type: ignore[union-attr]


def test_concurrent_retires_of_one_tenant_all_get_its_retired_view(tenant_server: LiveServer) -> None:
    """fresh-s5 #2: three retires at once gave one 200 and two 500s (peft: "Adapter r1 does not exist").
    Now a retire under way is joined: each gets the same 200 view; meanwhile pause, resume and begins
    answer 409 "being retired"; a later retire is the 404 of a retired tenant (a3r's retry reads it so)."""
    live = tenant_server
    assert create(live, "r1", seed=1).status_code == 201
    release, answers = hold_creates(live), []  # the retire waits on the lock, as behind a long step
    retires = [
        threading.Thread(target=lambda: answers.append(admin(live).post("/api/v1/tenants/r1/retire")))
        for _ in range(3)
    ]
    try:
        for thread in retires:
            thread.start()
        wait_for(lambda: "r1" in live.runtime.tenants._retiring, 30, "the retire under way")
        with admin(live) as http:
            for action in ("pause", "resume"):
                refused = http.post(f"/api/v1/tenants/r1/{action}")
                assert refused.status_code == 409 and "being retired" in refused.json()["error"]["message"]
        refused = begin(live, "r1")
        assert refused.status_code == 409 and "being retired" in refused.json()["error"]["message"]
    finally:
        release()
        for thread in retires:
            thread.join(60)
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
    assert len({a.json()["checkpoint"] for a in answers}) == 1
    assert answers[0].json()["state"] == "retired"
    with admin(live) as http:
        again = http.post("/api/v1/tenants/r1/retire")
    assert again.status_code == 404 and "(retired)" in again.json()["error"]["message"]


def test_tenants_refuse_voting_policies_and_take_heartbeats_and_leaves(tenant_server: LiveServer) -> None:
    """fresh-s5 #3: a tenant of a voting policy was created (201) and never trained: a vote names no tenant
    and the vote route answered a 409 about training settings, as heartbeat and leave did. Now the create is
    a 422 naming batch_policy and the policies tenants take, ``swarm serve --tenants --batch-policy
    all_clients_ready --check`` is refused in one line, a vote is a 409 that says why, and heartbeat and
    leave work (liveness for every tenant)."""
    live = tenant_server
    for policy in ("all_clients_ready", "any_client_ready"):
        refused = create(live, "v1", batch_policy=policy)
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "batch_policy", refused.text
        assert f"batch policy {policy} needs readiness votes" in refused.json()["error"]["message"]
        assert "tenants take episodes, tasks, informative_tasks" in refused.json()["error"]["message"]
    unknown = create(live, "v1", batch_policy="quorum")  # fresh-s6 #6: lists only the tenant policies
    assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "batch_policy", unknown.text
    assert "tenants take the batch policies episodes, tasks, informative_tasks, not 'quorum'" in unknown.text
    assert "all_clients_ready" not in unknown.text and "any_client_ready" not in unknown.text
    assert create(live, "t1", batch_policy="tasks").status_code == 201
    assert begin(live, "t1", client_id="runner-a").status_code == 201
    clients = "/api/v1/clients/runner-a"
    with admin(live) as http:
        vote = http.post(f"{clients}/ready")
        assert vote.status_code == 409 and "votes are not taken on a tenants server" in vote.text
        beat = http.post(f"{clients}/heartbeat")
        assert beat.status_code == 200 and beat.json() == {
            "client_id": "runner-a",
            "active": True,
            "ready": False,
        }
        left = http.delete(clients)
        assert left.status_code == 200 and left.json()["active"] is False
    argv = ["serve", "--tenants", "2", "--lora-rank", "4", "--batch-policy", "all_clients_ready", "--check"]
    shown = CliRunner().invoke(app, [*argv, "--run-dir", str(live.config.run_dir.parent / "r2")])
    assert shown.exit_code != 0 and len(shown.output.strip().splitlines()) == 1, shown.output
    assert "batch policy all_clients_ready needs readiness votes" in shown.output


def test_a_tenants_run_dir_restarts_only_at_its_lora_rank(tenant_server: LiveServer) -> None:
    """fresh-s5 #4: a tenants run dir restarted with another --lora-rank dumped a 506-line traceback
    (size mismatch loading the adapters), and a tenant with no checkpoint yet was rebuilt at the new rank.
    Now the rank is kept in tenant.json and the start (``--check`` too, and the runtime) is refused in one
    line naming the run dir's rank; the same rank starts."""
    live = tenant_server
    assert create(live, "ta", seed=1).status_code == 201  # no step, no checkpoint: only the record
    live.stop()
    run_dir = live.config.run_dir
    assert json.loads((run_dir / "tenants" / "ta" / "tenant.json").read_text())["lora_rank"] == 4
    for check in (["--check"], []):
        argv = ["serve", "--port", "0", "--run-dir", str(run_dir), "--tenants", "2", "--lora-rank", "8"]
        refused = CliRunner().invoke(app, [*argv, *check])
        assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1, refused.output
        assert refused.output.strip() == (
            f"error: --run-dir {run_dir} holds tenants created at --lora-rank 4 (ta) and --lora-rank 8 was "
            "given: start it with --lora-rank 4, or use another --run-dir"
        )
    other = LoraSettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
    config = ServerConfig(
        run_dir=run_dir, tenants=2, training=TrainingConfig(trainer=TrainerConfig(lora=other))
    )
    with pytest.raises(TenantsOnDisk, match="created at --lora-rank 4"):
        SwarmRuntime(config, live.engine)
    same = CliRunner().invoke(
        app, ["serve", "--run-dir", str(run_dir), "--tenants", "2", "--lora-rank", "4", "--check"]
    )
    assert same.exit_code == 0, same.output


def test_a_retired_tenants_checkpoint_names_its_base_and_the_hint_runs_as_written(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """fresh-s5 #5: a tenant checkpoint's adapter_config.json had ``base_model_name_or_path: null``, so
    ``swarm serve --model <checkpoint>`` said "its base model is not recorded" and its peft line read
    ``from_pretrained('BASE')``. Now it records the served model's folder; the line names it, and its code,
    run as written, loads the adapter over that base."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swarm.engine.model_loading import resolve_model

    run_dir, port = tmp_path / "run", free_port()
    flags = ["--tenants", "2", "--lora-rank", "4", "--batch-size", "1", "--group-size", "2"]
    log = tmp_path / "serve.log"
    proc = serve_process(tiny_model_dir, run_dir, port, *flags, "--admin-token", ADMIN, output=log)
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {ADMIN}"}
        ) as http:
            for name in ("ta", "tc"):  # a second adapter (peft's add_adapter) recorded no base
                assert http.post("/api/v1/tenants", json={"id": name}, timeout=60).status_code == 201
            body = {"task_id": "x", "tenant": "ta", "client_id": "runner-x"}
            assert http.post("/api/v1/episodes", json=body, timeout=30).status_code == 201
            checkpoint = http.post("/api/v1/tenants/tc/retire", timeout=60).json()["checkpoint"]
    finally:
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    # fresh-s5 #1: a SIGTERM with a tenant's episode open stops without the graceful-timeout cancel
    assert time.monotonic() - stopped < 10 and "graceful shutdown exceeded" not in log.read_text()
    base = json.loads((Path(checkpoint) / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert Path(base) == tiny_model_dir
    refused = CliRunner().invoke(
        app, ["serve", "--model", checkpoint, "--no-train", "--check", "--run-dir", str(tmp_path / "r2")]
    )
    assert refused.exit_code == 1 and f"over the base model {base}" in refused.output, refused.output
    code = re.search(r"load it with peft \((PeftModel\.from_pretrained\(.*?\))\),", refused.output)
    assert code is not None, refused.output
    loaded = eval(code.group(1), {"PeftModel": PeftModel, "AutoModelForCausalLM": AutoModelForCausalLM})
    assert isinstance(loaded, PeftModel) and "default" in loaded.peft_config
    # fresh-s6 #4: the merged folder needs the base's tokenizer too, and the line says how
    merged = tmp_path / "merged"
    loaded.merge_and_unload().save_pretrained(merged)
    tokenizer_code = re.search(
        r"(AutoTokenizer\.from_pretrained\(.*?\))\.save_pretrained\(OUT\)", refused.output
    )
    assert tokenizer_code is not None, refused.output
    eval(tokenizer_code.group(1), {"AutoTokenizer": AutoTokenizer}).save_pretrained(merged)
    assert resolve_model(merged).directory == merged and AutoTokenizer.from_pretrained(merged).encode("hi")


def test_a_begin_under_a_paused_tenant_says_why_it_waits(
    tenant_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    """fresh-s5 #6: a begin under a paused tenant was retried silently for up to 300 s (``swarm run --tenant``
    printed nothing). A paused tenant, like a paused server (POST /api/v1/pause), is still a 503 with
    Retry-After that the client retries (the admin's resume lets it in), now typed ``paused``, and the
    client logs the reason once per request while it waits."""
    live = tenant_server
    assert create(live, "tc", seed=1).status_code == 201
    with admin(live) as http:
        assert http.post("/api/v1/tenants/tc/pause").status_code == 200
    refused = begin(live, "tc")
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    assert refused.json()["error"]["type"] == "paused"
    assert refused.json()["error"]["message"] == "tenant tc is paused: paused by the admin"
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="swarm.client"),
        SwarmClient(live.url, client_token=ADMIN, retry=RetryPolicy(deadline_s=6)) as client,
        pytest.raises(ClientError) as raised,
        client.episode("x", tenant="tc"),
    ):
        pass
    assert raised.value.status_code == 503 and raised.value.error_type == "paused"
    assert 5 <= time.monotonic() - started < 30
    told = [r.getMessage() for r in caplog.records if r.name == "swarm.client._client"]
    assert (
        len(told) == 1 and "tenant tc is paused: paused by the admin; retrying until it is resumed" in told[0]
    )
    with admin(live) as http:  # a paused server answers alike
        assert http.post("/api/v1/tenants/tc/resume").status_code == 200
        assert http.post("/api/v1/pause").status_code == 200
        paused = begin(live, "tc")
        assert paused.status_code == 503 and paused.json()["error"]["type"] == "paused"
        assert http.post("/api/v1/resume").status_code == 200
    assert begin(live, "tc").status_code == 201


def test_tenant_events_status_and_a_retired_id(tenant_server: LiveServer) -> None:
    """fresh-s5 #10, #14: ``GET /api/v1/events?tenant=nope`` answered 200 with an empty stream (the
    metrics route: 404); status said ``training_enabled: false`` and ``swarm status`` "policy step 0" while
    tenants trained; re-creating a retired id said it "exists already"."""
    live = tenant_server
    assert create(live, "r1", seed=1).status_code == 201
    with admin(live) as http:
        unknown = http.get("/api/v1/events", params={"tenant": "nope", "follow": False})
        assert unknown.status_code == 404 and unknown.json()["error"]["message"] == "no tenant 'nope'"
        assert http.get("/api/v1/tenants/nope/metrics").status_code == 404
        assert http.post("/api/v1/tenants/r1/retire").status_code == 200
        retired = http.get("/api/v1/events", params={"tenant": "r1", "follow": False})  # stays valid
        assert retired.status_code == 200 and "tenant.retired" in retired.text
        status = http.get("/api/v1/status").json()
    assert status["training_per_tenant"] is True and status["training_enabled"] is False
    again = create(live, "r1")
    assert again.status_code == 409 and again.json()["error"]["message"].startswith("tenant 'r1' was retired")
    shown = CliRunner().invoke(app, ["status", live.url, "--admin-token", ADMIN], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "base frozen; training is per tenant" in shown.output, shown.output


def test_a_tenant_is_created_after_every_earlier_one_was_retired(tenant_server: LiveServer) -> None:
    """fresh-s6 #1: once the last resident tenant was retired, every create answered 500 (KeyError: peft's
    delete_adapter leaves the deleted adapter named active). A study that reuses its server for a later
    stage retires every tenant of the earlier one first."""
    live = tenant_server
    for round_ in range(2):
        first, second = f"a{round_}", f"b{round_}"
        assert create(live, first, seed=1).status_code == 201
        with admin(live) as http:
            assert http.post(f"/api/v1/tenants/{first}/retire").status_code == 200
        made = create(live, second, seed=2)
        assert made.status_code == 201, made.text
        rollout(live, second, "t", 1.0)  # it samples with its own adapter
        assert live.engine.model.get_base_model() is not None
        with admin(live) as http:
            retired = http.post(f"/api/v1/tenants/{second}/retire")
        assert retired.status_code == 200, retired.text
        config = json.loads((Path(retired.json()["checkpoint"]) / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"]


def test_status_says_which_pending_episodes_belong_to_retired_tenants(tenant_server: LiveServer) -> None:
    """fresh-s6 #6: a retired tenant's untrained episodes stayed in ``episodes.pending`` with nothing saying
    that no step will ever train them; status now counts them apart (they stay pending: they finished)."""
    live = tenant_server
    assert create(live, "u1", seed=1, batch_size=4).status_code == 201  # one episode never makes a step
    rollout(live, "u1", "t1", 1.0)
    with admin(live) as http:
        before = http.get("/api/v1/status").json()
        assert http.post("/api/v1/tenants/u1/retire").status_code == 200
        after = http.get("/api/v1/status").json()
    assert (before["episodes"]["pending"], before["episodes"]["pending_retired"]) == (1, 0)
    assert (after["episodes"]["pending"], after["episodes"]["pending_retired"]) == (1, 1)
    shown = CliRunner().invoke(app, ["status", live.url, "--admin-token", ADMIN], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert re.search(r"episodes pending_retired\s*│\s*1\s", shown.output), shown.output
