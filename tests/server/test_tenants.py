"""LoRA tenants (issue 36): isolation, failure, auth, the cap, retirement, mixed-adapter batches and the
equality of a tenant's update with a one-policy trainer's.

Real servers on loopback over the tiny random model (each test its own copy: tenants inject adapters into
it), real SQLite pool, real peft adapters and the real tokenizer.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI
from typer.testing import CliRunner

from swarm.batch import BatchConfig, BatchPolicy
from swarm.cli import app
from swarm.client import SwarmClient
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.engine.base import SamplingParams
from swarm.train import TorchTrainer, TrainerError
from swarm.train.adapters import add_adapter
from swarm.train.config import LoraSettings, TrainerConfig
from tests.conftest import LiveServer, build_tiny_model, make_server, wait_for
from tests.train.factories import make_sample

ADMIN = secrets.token_urlsafe(16)
QUESTION = [{"role": "user", "content": "Say something."}]
LORA = LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])


def tenant_training(**kw: Any) -> TrainingConfig:
    return TrainingConfig(
        batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=1, group_size=2),
        trainer=TrainerConfig(lr=1e-2, lora=LORA),
        **kw,
    )


@pytest.fixture()
def tenant_server(
    request: pytest.FixtureRequest, tmp_path: Path, embedded_source: Any, tokenizer: Any
) -> Iterator[LiveServer]:
    """A server of 2 tenants; parametrised indirectly with ``True``, the engine samples on a twin of the
    adapters during a tenant's step (``--tenant-overlap``)."""
    overlap = bool(getattr(request, "param", False))
    engine = HFEngine(
        build_tiny_model(embedded_source, seed=1), tokenizer, "tiny-tenants", sample_while_training=overlap
    )
    live = make_server(
        tmp_path, engine, tenants=2, training=tenant_training(), admin_token=ADMIN, tenant_overlap=overlap
    )
    yield live
    live.stop()
    engine.close()


def admin(live: LiveServer) -> httpx.Client:
    return httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)


def rollout(live: LiveServer, tenant: str | None, task_id: str, reward: float, token: str = ADMIN) -> str:
    with SwarmClient(live.url, client_token=token) as client, client.episode(task_id, tenant=tenant) as ep:
        OpenAI(base_url=ep.base_url, api_key=ep.api_key).chat.completions.create(
            model=ep.model, messages=QUESTION, max_tokens=4, temperature=1.0
        )
        ep.finish(reward)
    return ep.id


def group(live: LiveServer, tenant: str, task_id: str) -> list[str]:
    """One GRPO group (G = 2, rewards 1 and 0): with B = 1 it makes the tenant's next step."""
    return [rollout(live, tenant, task_id, 1.0), rollout(live, tenant, task_id, 0.0)]


def adapter_weights(live: LiveServer, tenant: str) -> dict[str, torch.Tensor]:
    model = live.runtime.tenants.get(tenant).loop.trainer.model
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def tenant(live: LiveServer, tenant_id: str) -> dict[str, Any]:
    with admin(live) as http:
        answer: dict[str, Any] = http.get(f"/api/v1/tenants/{tenant_id}").json()
        return answer


def create(live: LiveServer, tenant_id: str, **settings: Any) -> httpx.Response:
    with admin(live) as http:
        return http.post("/api/v1/tenants", json={"id": tenant_id, **settings})


@pytest.mark.parametrize("tenant_server", [False, True], ids=["paused", "overlap"], indirect=True)
def test_a_step_of_one_tenant_leaves_the_others_adapter_bit_equal(tenant_server: LiveServer) -> None:
    live = tenant_server
    assert create(live, "alpha", seed=1).status_code == 201
    assert create(live, "beta", seed=2, lr=5e-3).status_code == 201
    base = {
        k: v.clone() for k, v in live.engine.model.get_base_model().state_dict().items() if "lora_" not in k
    }
    a0, b0 = adapter_weights(live, "alpha"), adapter_weights(live, "beta")
    ids = group(live, "alpha", "t1")
    wait_for(lambda: tenant(live, "alpha")["step"] == 1, 60, "tenant a's step 1")
    a1, b1 = adapter_weights(live, "alpha"), adapter_weights(live, "beta")
    assert all(torch.equal(b0[k], b1[k]) for k in b0), "tenant a's step changed tenant b's adapter"
    assert any(not torch.equal(a0[k], a1[k]) for k in a0), "tenant a's step did not change its adapter"
    after = live.engine.model.get_base_model().state_dict()
    assert all(torch.equal(base[k], after[k]) for k in base), "a tenant's step changed the frozen base"
    with SwarmClient(live.url, admin_token=ADMIN) as client:
        view = client.get_episode(ids[0])
    assert view.trained_step == 1
    assert [(c.tenant, c.policy_version) for c in view.calls] == [("alpha", 0)]
    with admin(live) as http:  # the wire names the tenant
        assert http.get(f"/api/v1/episodes/{ids[0]}").json()["calls"][0]["tenant"] == "alpha"
    # a's next call samples its new adapter (policy version 1); b's still its version 0
    nxt = rollout(live, "alpha", "t2", 1.0)
    other = rollout(live, "beta", "t3", 1.0)
    with SwarmClient(live.url, admin_token=ADMIN) as client:
        assert [c.policy_version for c in client.get_episode(nxt).calls] == [1]
        assert [(c.tenant, c.policy_version) for c in client.get_episode(other).calls] == [("beta", 0)]
    views = {v["id"]: v for v in admin(live).get("/api/v1/tenants").json()}
    assert views["alpha"]["step"] == 1 and views["beta"]["step"] == 0
    assert views["alpha"]["settings"]["lr"] == 1e-2 and views["beta"]["settings"]["lr"] == 5e-3
    with admin(live) as http:
        rows = http.get("/api/v1/tenants/alpha/metrics").json()
    assert [row["step"] for row in rows] == [1]


@pytest.mark.parametrize("tenant_server", [True], ids=["overlap"], indirect=True)
def test_with_overlap_the_engine_samples_during_a_tenants_step_with_the_old_adapter(
    tenant_server: LiveServer,
) -> None:
    """``--tenant-overlap``: while alpha's step trains (held open here), beta's episodes and alpha's own
    calls are sampled, alpha's with its old adapter and recorded as its old version; afterwards the twin
    holds alpha's new adapter, beta's bit-equal, and the base is shared with the trainer's model."""
    live = tenant_server
    assert create(live, "alpha", seed=1).status_code == 201
    assert create(live, "beta", seed=2).status_code == 201
    engine, loop = live.engine, live.runtime.tenants.get("alpha").loop
    assert engine is not None and engine.samples_while_training
    trainer_model = live.runtime.tenants._model
    assert engine.model is not trainer_model
    shared = dict(trainer_model.named_parameters())
    for name, param in engine.model.named_parameters():  # the base is shared, the adapters are copies
        assert (param is shared[name]) == ("lora_" not in name), name
    greedy = SamplingParams(temperature=0.0, max_tokens=4, adapter="alpha")
    before = engine.generate_sync([1, 2, 3, 4], greedy)[0]
    training, release = threading.Event(), threading.Event()
    real_step = loop.trainer.step

    def held_step(*args: Any, **kwargs: Any) -> Any:
        out = real_step(*args, **kwargs)  # the adapter is updated in the trainer's tree …
        training.set()
        assert release.wait(60)  # … and the step is not over until the test says so
        return out

    loop.trainer.step = held_step  # type: ignore[method-assign]
    group(live, "alpha", "t1")
    assert training.wait(60), "alpha's step did not start"
    try:
        during = engine.generate_sync([1, 2, 3, 4], greedy)[0]  # would wait for the step without overlap
        assert during.policy_version == 0 and during.ids == before.ids
        assert torch.allclose(torch.tensor(during.logprobs), torch.tensor(before.logprobs), atol=1e-6)
        other = rollout(live, "beta", "t2", 1.0)
        assert tenant(live, "alpha")["step"] == 0
    finally:
        release.set()
    wait_for(lambda: tenant(live, "alpha")["step"] == 1, 60, "alpha's step 1")
    after = engine.generate_sync([1, 2, 3, 4], greedy)[0]
    assert after.policy_version == 1
    assert not torch.allclose(torch.tensor(after.logprobs), torch.tensor(before.logprobs), atol=1e-6)
    twin = dict(engine.model.named_parameters())
    for name, param in shared.items():
        if "lora_" in name:  # the twin holds both trained adapters as the trainer's tree does
            assert torch.equal(param, twin[name]), name
    with SwarmClient(live.url, admin_token=ADMIN) as client:
        assert [(c.tenant, c.policy_version) for c in client.get_episode(other).calls] == [("beta", 0)]
    with admin(live) as http:  # retiring drops the twin's copy too
        assert http.post("/api/v1/tenants/alpha/retire").status_code == 200
    assert not any(".alpha." in name for name, _ in engine.model.named_parameters())


@pytest.mark.parametrize(
    "failure",
    [RuntimeError("the trainer crashed"), TrainerError("non-finite gradient norm (nan) at update 0.0")],
    ids=["crash", "nan"],
)
def test_a_failed_step_stops_only_its_tenant(tenant_server: LiveServer, failure: Exception) -> None:
    live = tenant_server
    create(live, "alpha")
    create(live, "beta")

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise failure

    live.runtime.tenants.get("alpha").loop.trainer.step = fail
    group(live, "alpha", "t1")
    wait_for(lambda: tenant(live, "alpha")["state"] == "failed", 60, "tenant a failed")
    assert str(failure) in tenant(live, "alpha")["reason"]
    group(live, "beta", "t2")
    wait_for(lambda: tenant(live, "beta")["step"] == 1, 60, "tenant b's step 1 after a failed")
    with admin(live) as http:  # a failed tenant admits no episode
        refused = http.post("/api/v1/episodes", json={"task_id": "t9", "tenant": "alpha"})
        assert refused.status_code == 503 and "failed" in refused.json()["error"]["message"]
    with admin(live) as http:
        assert http.post("/api/v1/tenants/alpha/resume").json()["state"] == "active"


def test_tenant_routes_need_the_admin_token_and_a_client_token_can_be_limited(
    tenant_server: LiveServer,
) -> None:
    live = tenant_server
    assert httpx.post(f"{live.url}/api/v1/tenants", json={"id": "alpha"}).status_code == 401
    create(live, "alpha")
    create(live, "beta")
    token = secrets.token_urlsafe(16)
    with admin(live) as http:
        made = http.post(
            "/api/v1/client-tokens", json={"name": "alice", "token": token, "tenants": ["alpha"]}
        )
        assert made.status_code == 201
        empty = http.post("/api/v1/client-tokens", json={"name": "nobody", "tenants": []})  # fresh36 #9
        assert empty.status_code == 422 and empty.json()["error"]["param"] == "tenants"
        assert "could begin nothing" in empty.json()["error"]["message"]
        listed = {t["name"]: t for t in http.get("/api/v1/client-tokens").json()}
        assert listed == {"alice": {"name": "alice", "open_episodes": 0, "tenants": ["alpha"]}}
        assert (
            http.post(
                "/api/v1/tenants", json={"id": "gamma"}, headers={"Authorization": f"Bearer {token}"}
            ).status_code
            == 403
        )
    begin = httpx.post(
        f"{live.url}/api/v1/episodes",
        json={"task_id": "t", "tenant": "beta"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert begin.status_code == 403 and "tenant" in begin.json()["error"]["message"]
    base = httpx.post(
        f"{live.url}/api/v1/episodes", json={"task_id": "t"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert base.status_code == 403
    assert rollout(live, "alpha", "t", 1.0, token=token)


def test_the_cap_on_resident_tenants_is_a_clear_409(tenant_server: LiveServer) -> None:
    live = tenant_server
    assert create(live, "alpha").status_code == 201
    assert create(live, "alpha").status_code == 409
    assert create(live, "beta").status_code == 201
    third = create(live, "gamma")
    assert third.status_code == 409
    assert "--tenants 2" in third.json()["error"]["message"]
    assert create(live, "Bad_Id").status_code == 422
    for lr in (0, 0.0, -1e-3):  # fresh36 #8: a tenant at lr 0 would never change
        refused = create(live, "delta", lr=lr)
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "lr", refused.text
        assert "greater than 0" in refused.json()["error"]["message"]
    with admin(live) as http:
        lr = http.get("/openapi.json").json()["components"]["schemas"]["TenantCreate"]["properties"]["lr"]
        assert {"exclusiveMinimum": 0.0, "maximum": 1.0, "type": "number"} in lr["anyOf"]
    with admin(live) as http:
        assert http.get("/api/v1/tenants/nope").status_code == 404
        for action in ("pause", "resume", "retire"):  # fresh36: a field is refused, not ignored
            refused = http.post(f"/api/v1/tenants/alpha/{action}", json={"x": 1})
            assert refused.status_code == 422 and refused.json()["error"]["param"] == "x", refused.text
        assert http.get("/api/v1/tenants/alpha").json()["state"] == "active"  # nothing happened
        assert http.post("/api/v1/tenants/alpha/pause", json={}).json()["state"] == "paused"  # {} is fine
        assert http.post("/api/v1/tenants/alpha/resume").json()["state"] == "active"  # as is no body


def test_retire_saves_a_lora_checkpoint_and_frees_a_place(
    tenant_server: LiveServer, embedded_source: Any
) -> None:
    from peft import PeftModel

    live = tenant_server
    create(live, "alpha", seed=3)
    create(live, "beta")
    group(live, "alpha", "t1")
    wait_for(lambda: tenant(live, "alpha")["step"] == 1, 60, "tenant a's step 1")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    model = live.engine.model
    with torch.no_grad():
        served = model(input_ids=ids, adapter_names=["alpha"]).logits
    with admin(live) as http:  # fresh36: status shows the tenants in brief
        brief = http.get("/api/v1/status").json()["tenants"]
    assert brief == {
        "cap": 2,
        "resident": 2,
        "retired": 0,
        "tenants": [
            {"id": "alpha", "state": "active", "step": 1},
            {"id": "beta", "state": "active", "step": 0},
        ],
    }
    shown = CliRunner().invoke(app, ["status", live.url, "--admin-token", ADMIN], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "2 of 2 resident, 0 retired: alpha active step 1, beta active step 0" in shown.output
    # fresh-s6 #5: swarm top shows the tenants too, not the frozen base's "policy step 0"
    top = CliRunner().invoke(app, ["top", live.url, "--admin-token", ADMIN, "--once"], env={"COLUMNS": "200"})
    assert top.exit_code == 0, top.output
    assert "tenants: 2 of 2 resident, 0 retired" in top.output and "per tenant (below)" in top.output
    rows = [[cell for cell in line.split() if cell not in "│┃"] for line in top.output.splitlines()]
    assert ["alpha", "active", "1"] in rows and ["beta", "active", "0"] in rows, top.output
    with admin(live) as http:
        retired = http.post("/api/v1/tenants/alpha/retire").json()
        after = http.get("/api/v1/status").json()["tenants"]
    assert retired["state"] == "retired" and retired["step"] == 1
    assert (after["resident"], after["retired"], [t["id"] for t in after["tenants"]]) == (1, 1, ["beta"])
    loaded = PeftModel.from_pretrained(
        build_tiny_model(embedded_source, seed=1), retired["checkpoint"]
    ).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, served, atol=1e-5)
    assert create(live, "gamma").status_code == 201  # its place under the cap is free
    assert create(live, "alpha").status_code == 409  # a retired id stays taken
    rollout(live, "beta", "t2", 1.0)  # the others still sample
    # fresh36 #10: swarm serve --model on the adapter says what it is, its base and how to use it
    base = json.loads((Path(retired["checkpoint"]) / "adapter_config.json").read_text())
    base = base.get("base_model_name_or_path")
    args = ["serve", "--model", retired["checkpoint"], "--no-train", "--check"]
    refused = CliRunner().invoke(app, [*args, "--run-dir", str(live.config.run_dir.parent / "r2")])
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert f"{retired['checkpoint']} is a LoRA adapter checkpoint" in refused.output
    assert (f"over the base model {base}" if base else "its base model is not recorded") in refused.output
    assert "PeftModel.from_pretrained(" in refused.output and "merge_and_unload()" in refused.output


def hold_creates(live: LiveServer) -> Callable[[], None]:
    """Hold the server's tenant registry lock from a thread, as a long tenant step does: creates and
    retires wait on it. Returns the release (idempotent)."""
    registry = live.runtime.tenants
    assert registry is not None
    release = threading.Event()

    def hold() -> None:
        with registry._lock.first():
            release.wait(120)

    holder = threading.Thread(target=hold)
    holder.start()
    wait_for(lambda: registry._lock._owner is not None, 10, "the registry lock held")

    def done() -> None:
        release.set()
        holder.join()

    return done


def test_a_tenant_being_created_is_visible_and_its_routes_answer_409(tenant_server: LiveServer) -> None:
    """fresh36 #2: while a create waits (here: the test holds the registry's lock, as a long step would),
    GET shows the tenant ``creating``, retire and a second create answer 409 "being created", and the create
    finishes into an active tenant that retires normally (no orphan)."""
    live = tenant_server
    release, answer = hold_creates(live), []
    creator = threading.Thread(target=lambda: answer.append(create(live, "alpha", seed=1)))
    creator.start()
    try:
        wait_for(lambda: tenant(live, "alpha").get("state") == "creating", 30, "alpha creating")
        with admin(live) as http:
            assert [t["id"] for t in http.get("/api/v1/tenants").json()] == ["alpha"]
            retire = http.post("/api/v1/tenants/alpha/retire")
            assert retire.status_code == 409 and "being created" in retire.json()["error"]["message"]
            assert http.post("/api/v1/tenants/alpha/pause").status_code == 409
        again = create(live, "alpha")
        assert again.status_code == 409 and "being created" in again.json()["error"]["message"]
    finally:
        release()
        creator.join(60)
    assert answer[0].status_code == 201 and answer[0].json()["state"] == "active"
    with admin(live) as http:
        assert http.post("/api/v1/tenants/alpha/retire").json()["state"] == "retired"


def test_a_pause_waits_for_one_batch_at_most_under_load(embedded_source: Any, tokenizer: Any) -> None:
    """fresh36 #1: a tenant's create pauses the engine; with the queue never empty the worker used to take
    the lock back batch after batch (a create waited 54 s). Now a waiting pause goes before the next batch."""
    engine = HFEngine(build_tiny_model(embedded_source, seed=1), tokenizer, "tiny-load", max_batch_size=2)
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            engine.submit([1, 2, 3], SamplingParams(max_tokens=4, temperature=1.0)).result()

    floods = [threading.Thread(target=flood) for _ in range(8)]
    for thread in floods:
        thread.start()
    try:
        wait_for(lambda: engine.batches >= 2, 60, "batches under load")
        for _ in range(5):
            before = engine.batches
            with engine.pause():
                assert engine.batches - before <= 1
            time.sleep(0.02)
    finally:
        stop.set()
        for thread in floods:
            thread.join(60)
        engine.close()


def test_a_server_without_tenants_refuses_them(tmp_path: Path, tiny_engine: HFEngine) -> None:
    live = make_server(tmp_path, tiny_engine, training=TrainingConfig(enabled=False), admin_token=ADMIN)
    try:
        begin = httpx.post(f"{live.url}/api/v1/episodes", json={"task_id": "t", "tenant": "alpha"})
        listed = admin(live).get("/api/v1/tenants")  # fresh-s5 #11: the begin answers as the tenant routes
        assert begin.status_code == listed.status_code == 409
        assert begin.json()["error"]["message"] == listed.json()["error"]["message"]
        assert "hosts no tenants" in begin.json()["error"]["message"]
        assert "tenants" not in admin(live).get("/api/v1/status").json()  # additive: absent without them
        with admin(live) as http:  # fresh36 #9: a token limited to tenants could begin nothing here
            limited = http.post("/api/v1/client-tokens", json={"name": "onlya", "tenants": ["alpha"]})
            assert limited.status_code == 409 and limited.json()["error"]["param"] == "tenants"
            assert "hosts no tenants" in limited.json()["error"]["message"]
            assert http.post("/api/v1/client-tokens", json={"name": "none", "tenants": []}).status_code == 422
            assert http.get("/api/v1/client-tokens").json() == []  # nothing was added
        episode_id = rollout(live, None, "t", 1.0)  # records without a tenant read as before
        with admin(live) as http:
            call = http.get(f"/api/v1/episodes/{episode_id}").json()["calls"][0]
        assert "tenant" not in call and call["policy_version"] == 0
    finally:
        live.stop()


def _perturbed(model: Any, seed: int) -> None:
    """Non-zero B matrices (peft starts them at zero: every adapter would be the base)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)


def test_a_mixed_adapter_batch_equals_each_adapter_alone(embedded_source: Any, tokenizer: Any) -> None:
    model = build_tiny_model(embedded_source, seed=1)
    model = add_adapter(model, "alpha", LORA, seed=1)
    model = add_adapter(model, "beta", LORA, seed=2)
    _perturbed(model, 0)
    engine = HFEngine(model, tokenizer, "tiny", batch_window_s=0.3)
    try:
        engine.serve_adapter("alpha", model, 3)
        engine.serve_adapter("beta", model, 5)
        prompts = [[1, 2, 3, 4], [7, 8, 9], [4, 5, 6, 7, 8]]
        adapters = ["alpha", "beta", None]
        params = [SamplingParams(temperature=0.0, max_tokens=6, adapter=a) for a in adapters]
        futures = [engine.submit(p, q) for p, q in zip(prompts, params, strict=True)]
        mixed = [f.result()[0] for f in futures]
        assert [c.batch_size for c in mixed] == [3, 3, 3]
        assert [c.policy_version for c in mixed] == [3, 5, 0]
        for prompt, param, together in zip(prompts, params, mixed, strict=True):
            alone = engine.generate_sync(prompt, param)[0]
            assert alone.batch_size == 1
            assert alone.ids == together.ids
            assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(together.logprobs), atol=1e-5)
        # and the adapters differ from each other and from the base
        outs = {
            a: engine.generate_sync(prompts[0], SamplingParams(temperature=0.0, max_tokens=6, adapter=a))[0]
            for a in adapters
        }
        assert len({tuple(round(x, 4) for x in c.logprobs) for c in outs.values()}) == 3
    finally:
        engine.close()


def test_a_tenants_update_equals_a_one_policy_trainers(embedded_source: Any, tokenizer: Any) -> None:
    """With a fixed batch, a tenant's step (its adapter among others) updates its adapter as a one-policy
    LoRA trainer's step updates its only adapter, to float rounding."""
    from peft import get_peft_model_state_dict

    config = TrainerConfig(lr=1e-2, lora=LORA)
    samples = [make_sample(f"e{i}", 8 + 2 * i, 3 + i, seed=i) for i in range(4)]
    advantages = [1.0, -1.0, 0.5, -0.5]
    base = build_tiny_model(embedded_source, seed=1)  # (it seeds torch itself)
    torch.manual_seed(7)
    single = TorchTrainer(base, config, pad_token_id=0)
    shared = add_adapter(build_tiny_model(embedded_source, seed=1), "other", LORA, seed=3)
    shared = add_adapter(shared, "mine", LORA, seed=7)
    tenant_trainer = TorchTrainer(shared, config, pad_token_id=0, adapter="mine")
    other_before = {k: v.clone() for k, v in shared.named_parameters() if ".other." in k}
    before_single, before_tenant = get_peft_model_state_dict(single.model), tenant_trainer.model.state_dict()
    before_single = {k: v.clone() for k, v in before_single.items()}
    before_tenant = {k: v.clone() for k, v in before_tenant.items()}
    names = sorted(k for k in before_single if "lora_" in k)
    assert names == sorted(before_tenant)
    assert all(torch.equal(before_single[k], before_tenant[k]) for k in names)
    single.step(samples, advantages)
    tenant_trainer.step(samples, advantages)
    after_single, after_tenant = get_peft_model_state_dict(single.model), tenant_trainer.model.state_dict()
    assert any(not torch.equal(before_single[k], after_single[k]) for k in names)
    for k in names:
        assert torch.allclose(after_single[k], after_tenant[k], rtol=1e-5, atol=1e-7), k
    assert all(torch.equal(v, dict(shared.named_parameters())[k]) for k, v in other_before.items())


def test_tenants_need_lora_one_line_naming_the_flag() -> None:
    from swarm.serve_options import ServeOptions, ServeOptionsError

    with pytest.raises(ServeOptionsError, match="--lora-rank"):
        ServeOptions(tenants=2).to_server_config()
    config = ServeOptions(tenants=2, lora_rank=4).to_server_config()
    assert config.tenants == 2 and "--tenants" in ServeOptions(tenants=2, lora_rank=4).argv()
    # fresh36 #8: --lr is the tenants' default; at 0 a tenant never changes. A one-policy server keeps
    # lr 0 (bench/gpu_engine.py measures logprob drift with frozen weights)
    with pytest.raises(ServeOptionsError, match=r"^--lr 0 with --tenants: .*give --lr above 0$"):
        ServeOptions(tenants=2, lora_rank=4, lr=0.0).to_server_config()
    assert ServeOptions(lr=0.0).to_server_config().training.trainer.lr == 0.0
    # fresh36: tenants always train, so --no-train would only make the banner say "training off"
    with pytest.raises(ServeOptionsError, match=r"^--no-train with --tenants: every tenant trains"):
        ServeOptions(tenants=2, lora_rank=4, train=False).to_server_config()


def test_vllm_tenants_need_bf16_or_fp16_weights() -> None:
    """vLLM's LoRA kernels take bfloat16 or float16 weights only: a vLLM tenant server of float32 weights
    (the ``--dtype`` default) is refused in one line naming the fix; ``auto`` is bfloat16 where bf16 is
    fast (an Ampere or later GPU) and is refused, naming float16, where it would give float32."""
    from swarm.precision import fast_bf16
    from swarm.serve_options import ServeOptions, ServeOptionsError

    vllm = {"tenants": 2, "lora_rank": 8, "engine": "vllm", "device": "cuda"}
    with pytest.raises(
        ServeOptionsError, match=r"^--tenants on --engine vllm: .* add --dtype bfloat16, float16"
    ):
        ServeOptions(**vllm).to_server_config()
    for dtype in ("bfloat16", "float16"):
        assert ServeOptions(**vllm, dtype=dtype).to_server_config().weights_dtype == dtype
    assert ServeOptions(**vllm | {"tenants": 0}).to_server_config().weights_dtype == "float32"  # merged push
    assert ServeOptions(tenants=2, lora_rank=8).to_server_config().weights_dtype == "float32"  # hf takes it
    if fast_bf16("cuda"):
        assert ServeOptions(**vllm, dtype="auto").to_server_config().weights_dtype == "bfloat16"
    else:
        with pytest.raises(
            ServeOptionsError, match=r"--dtype auto gives float32 on cuda .*: give --dtype float16"
        ):
            ServeOptions(**vllm, dtype="auto").to_server_config()


def test_a_tenants_events_reach_the_servers_stream_and_its_metrics_outlive_retirement(
    tenant_server: LiveServer,
) -> None:
    live = tenant_server
    create(live, "alpha", seed=1, lr=5e-3)
    create(live, "beta")
    ids = group(live, "alpha", "t1")
    rollout(live, "beta", "t2", 1.0)
    wait_for(lambda: tenant(live, "alpha")["step"] == 1, 60, "tenant a's step 1")
    with SwarmClient(live.url, admin_token=ADMIN) as client:
        wait_for(lambda: any(e.kind == "train.step" for e in client.events()), 30, "a's train.step")
        every = client.events()
        mine = client.events(tenant="alpha")
    steps = [e for e in every if e.kind == "train.step"]
    assert [(e.tenant, e.data["tenant"]) for e in steps] == [("alpha", "alpha")]  # b has not stepped
    kinds = {e.kind for e in mine}
    assert {"tenant.created", "train.started", "train.step", "episode.finished"} <= kinds
    assert all(e.tenant == "alpha" for e in mine)
    assert {e.data["episode_id"] for e in mine if e.kind == "episode.finished"} == set(ids)
    beta_ended = [e for e in every if e.kind == "episode.finished" and e.tenant == "beta"]
    assert len(beta_ended) == 1 and beta_ended[0] not in mine
    assert all(e.tenant is None for e in every if e.kind == "server.started")
    with admin(live) as http:  # the wire names the tenant, and the filter is a query parameter
        text = http.get("/api/v1/events", params={"follow": "false", "tenant": "beta"}).text
        assert '"tenant":"beta"' in text.replace(" ", "") and '"tenant":"alpha"' not in text.replace(" ", "")
    own = (live.config.run_dir / "tenants" / "alpha" / "events.jsonl").read_text()  # its file stays
    assert '"kind": "train.step"' in own and '"tenant": "alpha"' in own
    with admin(live) as http:
        before = http.get("/api/v1/tenants/alpha").json()
        assert http.post("/api/v1/tenants/alpha/retire").status_code == 200
        rows = http.get("/api/v1/tenants/alpha/metrics").json()
        after = http.get("/api/v1/tenants/alpha").json()
        listed = {v["id"]: v for v in http.get("/api/v1/tenants").json()}["alpha"]
        assert http.get("/api/v1/tenants/nope/metrics").status_code == 404
        patched = http.patch("/api/v1/config", json={"lr": 1e-3})  # settings are per tenant
        assert patched.status_code == 409 and "per tenant" in patched.json()["error"]["message"]
    assert [row["step"] for row in rows] == [1]
    assert before["trained"] == 2
    for view in (after, listed):
        assert view["state"] == "retired" and view["step"] == 1 and view["trained"] == 2
        assert view["settings"] == before["settings"] and view["settings"]["lr"] == 5e-3
        assert view["settings"]["batch_size"] == 1 and view["checkpoint"]
    record = json.loads((live.config.run_dir / "tenants" / "alpha" / "tenant.json").read_text())
    assert record["final"]["trained"] == 2  # a restarted server reads the final view from here


def test_tenants_on_verl_name_the_trainer_not_the_rank() -> None:
    from swarm.serve_options import ServeOptions, ServeOptionsError

    with pytest.raises(ServeOptionsError, match="leave --trainer torch") as refused:
        ServeOptions(tenants=2, lora_rank=8, trainer="verl").to_server_config()
    assert "--lora-rank" not in str(refused.value)


def test_a_create_that_fails_part_way_leaves_nothing_behind(
    tenant_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create whose trainer cannot be built (out of memory, say) after the adapter was injected answers
    an error, and leaves neither the adapter nor a folder behind: the same id can be created again."""
    live = tenant_server
    built = TorchTrainer

    def fails_once(*args: Any, **kwargs: Any) -> TorchTrainer:
        monkeypatch.setattr("swarm.server.tenants.TorchTrainer", built)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr("swarm.server.tenants.TorchTrainer", fails_once)
    failed = create(live, "alpha", seed=1)
    assert failed.status_code == 507, failed.text
    assert failed.json()["error"]["type"] == "insufficient_memory"
    assert "did not fit in memory (CUDA out of memory." in failed.json()["error"]["message"]
    assert not (live.config.run_dir / "tenants" / "alpha").exists()
    with admin(live) as http:
        assert http.get("/api/v1/tenants").json() == []
    again = create(live, "alpha", seed=1)
    assert again.status_code == 201 and again.json()["state"] == "active", again.text
    group(live, "alpha", "t0")
    wait_for(lambda: tenant(live, "alpha")["step"] == 1, 120, "alpha's first step")
