"""A run's tenant on a stage's shared server when the create is slow (fresh36 #1, #2): a real
``--tenants`` server on loopback whose creates wait on its registry lock (the test holds it, as a long
tenant step does). A create the client stops waiting for is read back and used, a failure says "timed out
after N s" (never an empty reason), and a retire of a tenant still being created retires it once created:
no tenant is left active."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from a3r.swarmops.processes import ServerHandle
from a3r.swarmops.tenant_calls import (
    TenantStartError,
    create_tenant,
    retire_and_read,
    retire_tenant,
    transport_failure,
)
from swarm.batch import BatchConfig, BatchPolicy
from swarm.config import TrainingConfig
from swarm.engine import HFEngine
from swarm.train.config import LoraSettings, TrainerConfig
from tests.conftest import LiveServer, build_tiny_model, make_server, wait_for
from tests.server.test_tenants import hold_creates

ADMIN = secrets.token_urlsafe(16)


@pytest.fixture()
def live(tmp_path: Path, embedded_source: Any, tokenizer: Any) -> Iterator[LiveServer]:
    engine = HFEngine(build_tiny_model(embedded_source, seed=1), tokenizer, "tiny-tenant-calls")
    training = TrainingConfig(
        batch=BatchConfig(policy=BatchPolicy.EPISODES, batch_size=1, group_size=2),
        trainer=TrainerConfig(lr=1e-2, lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])),
    )
    server = make_server(tmp_path, engine, tenants=2, training=training, admin_token=ADMIN)
    yield server
    server.stop()
    engine.close()


def _states(live: LiveServer) -> dict[str, str]:
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        return {t["id"]: t["state"] for t in http.get("/api/v1/tenants").json()}


def test_a_create_the_client_gave_up_on_is_read_back_and_used(live: LiveServer) -> None:
    handle = ServerHandle(url=live.url, admin_token=ADMIN)
    release = hold_creates(live)
    threading.Timer(3.0, release).start()  # the create ends after the client's 1 s timeout
    notes: list[str] = []
    view = create_tenant(handle, "ta", {"seed": 1}, note=notes.append, timeout_s=1.0)
    assert view.state.value == "active"
    assert notes == ["creating tenant ta timed out after 1 s, but the server created it: using it"]
    assert retire_tenant(handle, "ta") is not None
    assert _states(live) == {"ta": "retired"}


def test_a_create_still_running_fails_with_the_timeout_and_its_retire_waits_for_it(live: LiveServer) -> None:
    handle = ServerHandle(url=live.url, admin_token=ADMIN)
    release = hold_creates(live)
    try:
        with pytest.raises(
            TenantStartError,
            match=r"^creating tenant tb timed out after 1 s; tenant tb was still being created 1 s later",
        ):
            create_tenant(handle, "tb", {"seed": 2}, note=lambda _: None, timeout_s=1.0, wait_s=1.0)
        assert _states(live) == {"tb": "creating"}
        threading.Timer(2.0, release).start()
        retired = retire_tenant(handle, "tb", timeout_s=60.0)  # 409 "being created" until the lock frees
    finally:
        release()
    assert retired is not None and retired.state.value == "retired"
    assert _states(live) == {"tb": "retired"}  # not left active under the cap
    assert retire_tenant(handle, "never") is None  # 404: nothing to retire


def test_a_failed_call_never_has_an_empty_reason() -> None:
    assert transport_failure(httpx.ReadTimeout(""), "creating tenant x", 180.0) == (
        "creating tenant x timed out after 180 s"
    )
    assert transport_failure(httpx.ConnectError(""), "creating tenant x", 180.0) == (
        "creating tenant x failed: ConnectError"
    )


def test_a_step_that_ended_after_the_budget_stop_is_read_from_the_retire(live: LiveServer) -> None:
    """fresh-s6 #2: the watch last saw step 0 when the budget stopped the run, and the step under way then
    ended afterwards: the retire's answer and the tenant's metrics say the run trained step 1."""
    from tests.server.test_tenants import rollout

    handle = ServerHandle(url=live.url, admin_token=ADMIN)
    with handle.client() as client:
        client.create_tenant("tc", seed=3)
        seen = client.tenant("tc").step  # the watch's last poll before the budget stop: step 0
        for reward in (1.0, 0.0):  # one group (B = 1, G = 2): its step ends after the stop
            rollout(live, "tc", "t1", reward, token=ADMIN)
        wait_for(lambda: client.tenant("tc").step == 1, 60, "tenant tc's step 1")
        client.pause_tenant("tc")  # the budget stop (`_freeze_training`)
    final, rows = retire_and_read(handle, "tc")
    assert (seen, final) == (0, 1)
    assert [row.step for row in rows] == [1]
    assert _states(live) == {"tc": "retired"}
    assert retire_and_read(handle, "tc") == (1, rows)  # retired already: read from its metrics
