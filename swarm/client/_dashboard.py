"""What ``swarm top`` draws: a server's state, step, pool, clients and reward curve as rich renderables."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from swarm.client._sync import SwarmClient
from swarm.errors import ClientError, SwarmError
from swarm.protocol import ServerStepMetrics, StatusView

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 60) -> str:
    """The last ``width`` values as unicode block characters scaled min→max (NaN → space)."""
    tail = list(values)[-width:]
    finite = [v for v in tail if math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = high - low
    chars = []
    for v in tail:
        if not math.isfinite(v):
            chars.append(" ")
            continue
        level = 0 if span == 0 else round((v - low) / span * (len(_BLOCKS) - 1))
        chars.append(_BLOCKS[level])
    return "".join(chars)


@dataclass
class Snapshot:
    """One poll of a server: status, per-step metrics (``None`` when the server serves none), error."""

    status: StatusView | None = None
    metrics: list[ServerStepMetrics] | None = None
    error: str | None = None
    metrics_note: str = ""
    rewards: list[float] = field(default_factory=list)


def poll(client: SwarmClient) -> Snapshot:
    """Read ``/api/v1/status`` and ``/api/v1/metrics`` (a 404 on metrics is not an error)."""
    snap = Snapshot()
    try:
        snap.status = client.status()
    except httpx.TransportError as exc:
        snap.error = f"cannot reach {client.url}: {type(exc).__name__}"
        return snap
    except SwarmError as exc:
        snap.error = str(exc)
        return snap
    try:
        snap.metrics = client.metrics()
    except ClientError as exc:
        snap.metrics_note = "no metrics route on this server" if exc.status_code == 404 else str(exc)
    except httpx.TransportError as exc:
        snap.metrics_note = f"metrics unavailable: {type(exc).__name__}"
    snap.rewards = [m.reward_mean for m in snap.metrics or [] if m.reward_mean is not None]
    return snap


def render(url: str, snap: Snapshot) -> RenderableType:
    """The ``swarm top`` frame for one snapshot."""
    if snap.status is None:
        return Panel(Text(snap.error or "no answer", style="bold red"), title=f"swarm top {url}")
    st = snap.status
    head = Table.grid(padding=(0, 2))
    step = "per tenant (below)" if st.training_per_tenant else str(st.step)  # the frozen base: no step
    head.add_row("state", Text(st.state.value, style="bold"), "policy step", step)
    head.add_row("model", st.model, "uptime", f"{st.uptime_s:.0f} s")
    training = "per tenant" if st.training_per_tenant else "on" if st.training_enabled else "off"
    head.add_row("training", training, "run dir", st.run_dir)

    pool = Table(title="episodes", show_edge=False)
    counts = st.episodes.model_dump(exclude=None if st.tenants is not None else {"pending_retired"})
    for name in counts:
        pool.add_column(name, justify="right")
    pool.add_row(*(str(v) for v in counts.values()))

    clients = Table(title="clients", show_edge=False)
    clients.add_column("client")
    clients.add_column("open episodes", justify="right")
    for name, n in sorted(st.clients.items()):
        clients.add_row(name, str(n))
    if not st.clients:
        clients.add_row("-", "0")

    parts: list[RenderableType] = [head, Text(""), pool, Text(""), clients, Text("")]
    # a tenants server (fresh-s6 #5): each tenant's state and step, as `swarm status`
    if st.tenants is not None:
        brief = f"tenants: {st.tenants.resident} of {st.tenants.cap} resident, {st.tenants.retired} retired"
        tenants = Table(show_edge=False)
        for name in ("tenant", "state", "step"):
            tenants.add_column(name, justify="right" if name == "step" else "left")
        for t in st.tenants.tenants:
            tenants.add_row(t.id, t.state.value, str(t.step))
        if not st.tenants.tenants:
            tenants.add_row("-", "-", "-")
        parts += [Text(brief, style="bold"), tenants, Text("")]
    if snap.rewards:
        curve: RenderableType = Text.assemble(
            (sparkline(snap.rewards), "green"),
            f"  last {snap.rewards[-1]:.3f}  min {min(snap.rewards):.3f}  max {max(snap.rewards):.3f}"
            f"  ({len(snap.rewards)} steps)",
        )
    else:
        per_tenant = "training is per tenant: the tenants' steps are above" if st.training_per_tenant else ""
        curve = Text(snap.metrics_note or per_tenant or "no training step yet", style="dim")
    return Panel(Group(*parts, Text("reward mean per step", style="bold"), curve), title=f"swarm top {url}")
