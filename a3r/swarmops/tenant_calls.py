"""Creating and retiring a run's LoRA tenant on a stage's shared server, so that no tenant is left active.

`a3r.swarmops.execution.execute_tenant_run` creates each run's tenant and retires it when the run ends.
Both wait on the server for the running sampling batch and tenant step (`swarm.server.tenants`: adapter
injection and removal go before queued steps, yet a step under way ends first), which on a loaded CPU takes
tens of seconds, so they get their own long timeout (:data:`CALL_TIMEOUT_S`) rather than the control
polls' 10 s. A create the client stops waiting for goes on on the server, so after a timeout or a lost
connection the tenant is read back (``GET``): still ``creating`` is waited out, an existing tenant is used,
and a missing one is a `TenantStartError` whose message names the timeout. A retire that finds the tenant
still ``creating`` (409) is retried until it is created, then retires it; one sent again after a timeout
joins the retire under way on the server (the same 200 view), and one after it ended is a 404 (``None``).
`retire_and_read` retires a tenant the budget stopped and reads what it trained: a step under way at the
stop ends before the retire, so its final step and metrics are the retire's, not the watch's last poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from a3r.swarmops.processes import ServerHandle
from swarm.client import ClientError, ServerStepMetrics, SwarmClient, TenantView

__all__ = [
    "CALL_TIMEOUT_S",
    "TenantStartError",
    "create_tenant",
    "retire_and_read",
    "retire_tenant",
    "transport_failure",
]

CALL_TIMEOUT_S = 180.0
"""Seconds a create or retire may take (one batch plus one tenant step on a loaded 2-core CPU, with room)."""
CREATING = "creating"
"""`swarm.protocol.TenantState` of a tenant whose create is still under way."""
POLL_S = 0.5
"""Seconds between reads of a tenant still being created."""


class TenantStartError(Exception):
    """The run's tenant could not be created (a timeout, a lost connection); the message says which."""


def transport_failure(exc: httpx.TransportError, what: str, timeout_s: float) -> str:
    """A one-line reason for a failed call (httpx's own message is often empty): ``"<what> timed out after
    N s"`` for a timeout, else ``"<what> failed: <error or its type>"``."""
    if isinstance(exc, httpx.TimeoutException):
        return f"{what} timed out after {timeout_s:.0f} s"
    return f"{what} failed: {str(exc) or type(exc).__name__}"


def create_tenant(
    handle: ServerHandle,
    tenant: str,
    settings: dict[str, Any],
    *,
    note: Callable[[str], None],
    timeout_s: float = CALL_TIMEOUT_S,
    wait_s: float = CALL_TIMEOUT_S,
) -> TenantView:
    """Create ``tenant`` with ``settings`` (fields of `swarm.protocol.TenantCreate`), waiting up to
    ``timeout_s`` for the answer; after a timeout or lost connection, reconcile with the server (see the
    module docstring; a tenant still ``creating`` is waited for up to ``wait_s`` more) and ``note`` what
    happened.

    Returns:
        The tenant's view (``active`` once created).

    Raises:
        ClientError: the server refused it (409: the id taken or the cap reached; 422: its settings).
        TenantStartError: the create failed and the server has no such tenant, or it was still being
            created ``wait_s`` later.
    """
    with handle.client(timeout_s=timeout_s, deadline_s=timeout_s) as client:
        try:
            return client.create_tenant(tenant, **settings)
        except httpx.TransportError as exc:
            failure = transport_failure(exc, f"creating tenant {tenant}", timeout_s)
        view = _once_created(client, tenant, wait_s, failure)
        note(f"{failure}, but the server created it: using it")
        return view


def _once_created(client: SwarmClient, tenant: str, wait_s: float, failure: str) -> TenantView:
    """``tenant``'s view once it is no longer ``creating`` (polled for up to ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            view: TenantView | None = client.tenant(tenant)
        except ClientError as exc:
            if exc.status_code == 404:
                raise TenantStartError(f"{failure}; the server has no tenant {tenant}") from None
            raise
        except httpx.TransportError:
            view = None  # too busy to answer this poll
        if view is not None and view.state.value != CREATING:
            return view
        if time.monotonic() > deadline:
            raise TenantStartError(f"{failure}; tenant {tenant} was still being created {wait_s:.0f} s later")
        time.sleep(POLL_S)


def retire_tenant(
    handle: ServerHandle, tenant: str, *, timeout_s: float = CALL_TIMEOUT_S
) -> TenantView | None:
    """Retire ``tenant``; one still being created is retired once created (waited for up to ``timeout_s``).

    Returns:
        Its retired view, or ``None`` when the server has no resident tenant of this id (404: never
        created, or retired already).

    Raises:
        ClientError: the tenant was still ``creating`` after the wait, or the server hosts no tenants (409).
        httpx.TransportError: the server did not answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    with handle.client(timeout_s=timeout_s, deadline_s=timeout_s) as client:
        while True:
            try:
                return client.retire_tenant(tenant)
            except ClientError as exc:
                if exc.status_code == 404:
                    return None
                if exc.status_code != 409 or time.monotonic() > deadline:
                    raise
                client.tenant(tenant)  # a 409 of its own where the server hosts no tenants; else: creating
            time.sleep(POLL_S)


def retire_and_read(
    handle: ServerHandle, tenant: str, *, timeout_s: float = CALL_TIMEOUT_S
) -> tuple[int | None, list[ServerStepMetrics]]:
    """Retire ``tenant`` (`retire_tenant`: a step under way ends first and is checkpointed) and read the
    per-step metrics of every step it trained (a retired tenant's are kept).

    Returns:
        ``(final step, metrics rows oldest first)``: the final step is the retire's answer, or the last
        metrics row's step where the tenant was retired already (404); ``None`` when neither says.

    Raises:
        ClientError | httpx.TransportError: as `retire_tenant`; the metrics read is best effort (``[]``).
    """
    view = retire_tenant(handle, tenant, timeout_s=timeout_s)
    rows: list[ServerStepMetrics] = []
    with handle.client(timeout_s=timeout_s, deadline_s=timeout_s) as client:
        try:
            rows = client.tenant_metrics(tenant)
        except (ClientError, httpx.TransportError):
            rows = []
    steps = [row.step for row in rows] + ([view.step] if view is not None else [])
    return (max(steps) if steps else None), rows
