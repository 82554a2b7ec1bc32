"""LoRA tenants' lifecycle (fresh-s5): a retire answers at once in every state, concurrent retires,
voting policies refused, the LoRA rank of a run dir, the base of a tenant checkpoint, paused-tenant begins.

Real servers on loopback over the tiny random model (`tests.server.test_tenants`'s fixture), real SQLite
pool and real peft adapters.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import LiveServer
from tests.server.test_tenants import ADMIN, admin, create, tenant, tenant_server

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
