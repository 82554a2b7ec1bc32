"""A sweep stage's runs as LoRA tenants of one server (issue 36): one ``swarm serve --tenants N
--lora-rank R`` per stage, each run a tenant trained side by side with the others.

Which runs can be tenants (`tenant_reason`): LoRA runs (``lora_rank`` > 0) of a sweep stage with the
stage's rank, without a teacher, on a server a3r starts. The runs of one stage that can
(`stage_runs`) are executed together by `execute_stage`: one server for the stage, up to
`TenantSettings.max_tenants` tenants resident at once (the rest wait for a freed place), each run in its
own thread through `a3r.swarmops.execution.execute_tenant_run` (the single run's client, monitoring,
budget, held-out evaluation and outcome, reading its tenant's step and metrics), then the server stops.

The budget of a stage is shared: every run gets all of it (they run side by side), less the evaluation
reserve; a run still training when it ends is cancelled (``cancelled (budget)``): its tenant is paused,
evaluated and retired.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from a3r.errors import SwarmProcessError
from a3r.study.runs import RunOutcome, RunSpec
from a3r.swarmops.context import ExecutionContext
from a3r.swarmops.execution import Workspace, execute_tenant_run, tenant_server_options
from a3r.swarmops.processes import start_server
from swarm.client import ServeOptionsError

__all__ = [
    "TenantSettings",
    "execute_stage",
    "stage_runs",
    "stage_server_key",
    "tenant_id",
    "tenant_reason",
]


@dataclass(frozen=True)
class TenantSettings:
    """Whether and how many of a stage's runs train as tenants of one server.

    Attributes:
        enabled: Run a qualifying stage as tenants (``a3r research --tenants``, the default); ``False``
            keeps one server per run (``--no-tenants``).
        max_tenants: The memory cap: tenants resident on the stage's server at once (each holds its
            adapter, optimizer state and pool partition); a stage with more runs runs the rest as places
            free up.
    """

    enabled: bool = True
    max_tenants: int = 8

    def __post_init__(self) -> None:
        if self.max_tenants < 1:
            raise ValueError(f"max_tenants must be >= 1, not {self.max_tenants}")


def tenant_reason(spec: RunSpec, ctx: ExecutionContext) -> str | None:
    """Why ``spec`` needs its own server (one line), or ``None`` when it can be a tenant of its stage's
    server: a sweep run with LoRA, no teacher, and no ``swarm serve`` option of the user's that a
    tenant cannot express (full fine-tuning, an attached server)."""
    s = spec.settings
    if spec.purpose != "sweep" or not spec.stage:
        return f"own server: a {spec.purpose} run"
    if s.lora_rank <= 0 or int(ctx.server_options.get("lora-rank", 1) or 0) <= 0:
        return "own server: full fine-tuning (lora_rank 0)"
    if s.distill or s.teacher:
        return "own server: distillation from a teacher (a tenant server has no teacher)"
    if spec.start_step or spec.keep_server:
        return "own server: it continues on a server of its own"
    if "tenants" in ctx.server_options:
        return "own server: --serve-option tenants is set by the user"
    return None


def stage_runs(queue: Sequence[RunSpec], ctx: ExecutionContext) -> list[RunSpec]:
    """The runs at the head of ``queue`` that one tenant server can run together: consecutive sweep
    runs of the head's stage that can be tenants (`tenant_reason`) with the same LoRA rank; empty when
    fewer than two (one run keeps its own server)."""
    if not queue or tenant_reason(queue[0], ctx) is not None:
        return []
    head = queue[0]
    found: list[RunSpec] = []
    for spec in queue:
        same = spec.stage == head.stage and spec.settings.lora_rank == head.settings.lora_rank
        if not same or tenant_reason(spec, ctx) is not None:
            break
        found.append(spec)
    return found if len(found) >= 2 else []


def stage_server_key(stage: str) -> str:
    """The server key (and run dir name, under ``servers/``) of a stage's tenant server."""
    return f"{stage}-tenants"


def tenant_id(spec: RunSpec) -> str:
    """A run's tenant id on its stage's server (lower-case letters, digits and ``-``, ≤ 32 characters),
    unique within the thread: its key made safe and cut, with 4 hex digits of the key's SHA-256 (the same
    id after a resume)."""
    safe = "".join(c if c.isascii() and c.isalnum() else "-" for c in spec.key.lower()).strip("-")
    digest = hashlib.sha256(spec.key.encode()).hexdigest()[:4]
    head = (safe if safe[:1].isalpha() else "r" + safe)[:27].rstrip("-")
    return f"{head}-{digest}"


StageWorkspace = Callable[[RunSpec], Workspace]
"""The workspace a run trains in (a template-knob variant's own, else the study's)."""


def execute_stage(
    specs: Sequence[RunSpec],
    *,
    ctx: ExecutionContext,
    workspace: StageWorkspace,
    run_ids: Sequence[int],
    budget_s: float,
    eval_reserve_s: float,
    max_tenants: int = 8,
) -> list[RunOutcome]:
    """Run ``specs`` (one sweep stage, `stage_runs`) as tenants of one ``swarm serve --tenants N`` and
    return their outcomes in the order given.

    Args:
        specs: The stage's runs.
        ctx: Run context (store, servers, limits).
        workspace: Each run's workspace.
        run_ids: Each run's store run (``running``), in the order of ``specs``.
        budget_s: Wall seconds of the stage, shared: every run may take all of it.
        eval_reserve_s: Seconds of it each run keeps for its held-out evaluation.
        max_tenants: Tenants resident at once (`TenantSettings.max_tenants`).

    Returns:
        One outcome per run; a server that cannot start gives every run a ``failed_to_start`` outcome.
    """
    started = time.monotonic()
    first = specs[0]
    key = stage_server_key(first.stage)
    ws = workspace(first)
    places = max(1, min(max_tenants, len(specs)))
    try:
        handle = start_server(
            ws.server_dir(key), model=ctx.model, options=tenant_server_options(first, ctx, places)
        )
    except (ServeOptionsError, SwarmProcessError) as exc:
        reason = f"the stage's tenant server did not start: {exc}"
        ctx.say(f"runner: {reason}")
        return [
            RunOutcome(**spec.outcome_fields(), run_id=run_id, status="failed_to_start", reason=reason)
            for spec, run_id in zip(specs, run_ids, strict=True)
        ]
    ctx.servers[key] = handle
    ctx.say(
        f"runner: stage {first.stage}: {len(specs)} runs as tenants of one server at {handle.url} "
        f"(run dir {ws.server_dir(key)}; {places} at once)"
    )

    def one(spec: RunSpec, run_id: int) -> RunOutcome:
        left = budget_s - (time.monotonic() - started)  # a run that waited for a place has less
        return execute_tenant_run(
            spec,
            ctx=ctx,
            ws=workspace(spec),
            handle=handle,
            server_key=key,
            tenant=tenant_id(spec),
            run_id=run_id,
            budget_s=max(0.0, left),
            eval_reserve_s=eval_reserve_s,
        )

    try:
        with ThreadPoolExecutor(max_workers=places, thread_name_prefix="a3r-tenant") as pool:
            futures = [pool.submit(one, spec, run_id) for spec, run_id in zip(specs, run_ids, strict=True)]
            return [future.result() for future in futures]
    finally:
        ctx.servers.pop(key, None)
        handle.stop()
