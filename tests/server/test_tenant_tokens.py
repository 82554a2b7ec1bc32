"""Client tokens limited to LoRA tenants, made through `SwarmClient.add_client_token(tenants=)` on a real
tenants server on loopback (fresh-s5 #8, #9): the limit round-trips, a repeated id is a 422 naming it, and
an id of a tenant not created yet is allowed (the token may come first)."""

from __future__ import annotations

import httpx
import pydantic
import pytest

from swarm.client import AsyncSwarmClient, SwarmClient
from swarm.errors import ClientError
from tests.conftest import LiveServer
from tests.server.test_tenants import ADMIN, admin, tenant_server

__all__ = ["tenant_server"]  # the fixture, used by name


def test_a_client_token_limited_to_tenants_is_made_by_the_client_and_repeats_are_refused(
    tenant_server: LiveServer,
) -> None:
    with SwarmClient(tenant_server.url, admin_token=ADMIN) as ops:
        made = ops.add_client_token("lab-a", tenants=("alpha", "later"))  # "later" does not exist yet
        assert made.name == "lab-a" and made.token
        with pytest.raises(pydantic.ValidationError, match="'alpha' named more than once"):
            ops.add_client_token("lab-b", tenants=["alpha", "alpha"])
    with admin(tenant_server) as http:
        listed = {t["name"]: t["tenants"] for t in http.get("/api/v1/client-tokens").json()}
        assert listed == {"lab-a": ["alpha", "later"]}
        twice = http.post("/api/v1/client-tokens", json={"name": "lab-c", "tenants": ["ta", "tb", "ta"]})
        assert twice.status_code == 422 and twice.json()["error"]["param"] == "tenants"
        assert "'ta' named more than once" in twice.json()["error"]["message"]
    begin = httpx.post(
        f"{tenant_server.url}/api/v1/episodes",
        json={"task_id": "t", "tenant": "later"},
        headers={"Authorization": f"Bearer {made.token}"},
    )
    assert begin.status_code == 404 and "later" in begin.json()["error"]["message"]  # allowed, not there


async def test_the_async_client_takes_tenants_too(tenant_server: LiveServer) -> None:
    async with AsyncSwarmClient(tenant_server.url, admin_token=ADMIN) as ops:
        made = await ops.add_client_token("lab-async", tenants=["beta"])
        assert made.token
        with pytest.raises(ClientError) as taken:
            await ops.add_client_token("lab-async", tenants=["beta"])
        assert taken.value.status_code == 409
