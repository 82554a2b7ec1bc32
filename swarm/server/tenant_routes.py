"""Tenant routes (admin token): create, list, read, pause, resume and retire LoRA tenants, and read a
tenant's metrics (`swarm.server.tenants`). Every answer is a :mod:`swarm.protocol` model; on a server
started without ``--tenants`` every route answers 409.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from swarm.protocol import NoOptions, ServerStepMetrics, TenantCreate, TenantView
from swarm.server.auth import require_admin
from swarm.server.deps import TenantsDep, error_models

router = APIRouter(
    prefix="/api/v1/tenants",
    tags=["tenants"],
    dependencies=[Depends(require_admin)],
    responses=error_models(
        (401, "Missing or wrong admin token."),
        (
            403,
            "A wrong admin token, an episode key or a client token, or no admin token configured and a "
            "caller from another host.",
        ),
        (409, "The server hosts no tenants (started without --tenants)."),
    ),
)
_UNKNOWN = error_models(
    (404, "No resident tenant has this id."), (422, "A body with a field (none is taken).")
)
_LIFECYCLE = error_models(
    (404, "No resident tenant has this id (a retired one says so)."),
    (409, "The tenant is being created or being retired, or the server hosts no tenants."),
    (422, "A body with a field (none is taken)."),
)


@router.post(
    "",
    status_code=201,
    responses=error_models(
        (409, "The id is taken, or the server's cap of resident tenants (--tenants N) is reached."),
        (422, "Invalid settings."),
        (507, "Out of device memory while building the tenant (nothing of it is kept): retire a tenant."),
    ),
)
async def create_tenant(body: TenantCreate, tenants: TenantsDep) -> TenantView:
    """Create a LoRA tenant over the frozen base: its adapter (the server's rank and targets), optimizer,
    settings (fields left out take the server's), pool partition and folder; it trains at once on the
    episodes begun under it (``EpisodeCreate.tenant``)."""
    return await tenants.create(body)


@router.get("")
def list_tenants(tenants: TenantsDep) -> list[TenantView]:
    """Every tenant of this run dir: resident ones (active, paused, failed), then retired ones."""
    return tenants.views()


@router.get("/{tenant_id}", responses=_UNKNOWN)
def get_tenant(tenant_id: str, tenants: TenantsDep) -> TenantView:
    """One tenant, resident or retired."""
    return tenants.view(tenant_id)


@router.get("/{tenant_id}/metrics", responses=error_models((404, "No tenant has this id.")))
def tenant_metrics(tenant_id: str, tenants: TenantsDep, since_step: int = 0) -> list[ServerStepMetrics]:
    """A tenant's per-step metrics after ``since_step`` (its ``metrics.jsonl``), oldest first; a retired
    tenant's stay readable. Its events: ``GET /api/v1/events?tenant={id}``."""
    return tenants.metrics(tenant_id, since_step)


@router.post("/{tenant_id}/pause", responses=_LIFECYCLE)
async def pause_tenant(tenant_id: str, tenants: TenantsDep, body: NoOptions | None = None) -> TenantView:
    """No new episodes under the tenant (503) and no step until resumed; its open episodes keep sampling.
    No body, or ``{}``."""
    return tenants.pause(tenant_id)


@router.post("/{tenant_id}/resume", responses=_LIFECYCLE)
async def resume_tenant(tenant_id: str, tenants: TenantsDep, body: NoOptions | None = None) -> TenantView:
    """Resume a paused or failed tenant (its reason is cleared). No body, or ``{}``."""
    return tenants.resume(tenant_id)


@router.post("/{tenant_id}/retire", responses=_LIFECYCLE)
async def retire_tenant(tenant_id: str, tenants: TenantsDep, body: NoOptions | None = None) -> TenantView:
    """Retire a tenant: its open episodes are aborted, a running step ends first, its adapter is saved as a
    LoRA checkpoint (``checkpoint``, loadable with ``PeftModel.from_pretrained``) and leaves memory. A
    retire sent while one is under way answers when it ends, with the same view. No body, or ``{}``."""
    return await tenants.retire(tenant_id)
