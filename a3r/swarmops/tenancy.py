"""A sweep stage's runs as LoRA tenants of one server (issue 36): one ``swarm serve --tenants N
--lora-rank R`` per stage, each run a tenant trained side by side with the others.

Which runs can be tenants (`tenant_reason`): LoRA runs (``lora_rank`` > 0) of a sweep stage with the
stage's rank, without a teacher, on a server a3r starts. The runs of one stage that can
(`stage_runs`) are executed together by `execute_stage`: one server for the stage, up to
`TenantSettings.max_tenants` tenants resident at once (the rest wait for a freed place), each run in its
own thread through `a3r.swarmops.execution.execute_tenant_run` (the single run's client, monitoring,
budget, held-out evaluation and outcome, reading its tenant's step and metrics), then the server stops.

A tenant server serves the study's one weights dtype (`a3r.swarmops.serving_dtype`): on vLLM it must be
bf16/fp16, so a ``dtype=float32`` asked on vLLM keeps one server per run (`tenants_on`).

The budget of a stage is shared: every run gets all of it (they run side by side), less the evaluation
reserve; a run still training when it ends is cancelled (``cancelled (budget)``): its tenant is paused,
evaluated and retired.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from a3r.errors import SwarmProcessError
from a3r.study.plans import PlanDraft
from a3r.study.price import SEQUENTIAL, Serving, stage_s
from a3r.study.research import sweep_specs, token_cap
from a3r.study.runs import RunOutcome, RunSpec, TenantStageTiming
from a3r.swarmops.context import ExecutionContext
from a3r.swarmops.execution import Workspace, execute_tenant_run, tenant_server_options
from a3r.swarmops.processes import start_server
from a3r.swarmops.serving_dtype import tenant_dtype_clash
from swarm.client import ServeOptionsError

__all__ = [
    "AUTO_OFF",
    "StageServing",
    "TenantSettings",
    "execute_stage",
    "plan_stage_serving",
    "serving_groups",
    "stage_pricing",
    "stage_runs",
    "stage_server_key",
    "stage_servers",
    "tenant_id",
    "tenant_reason",
    "tenants_on",
]


@dataclass(frozen=True)
class TenantSettings:
    """Whether and how many of a stage's runs train as tenants of one server.

    Attributes:
        enabled: Run a qualifying stage as tenants (``a3r research --tenants``); ``False`` keeps one
            server per run (``--no-tenants``); ``None`` (the default) decides by the engine
            (`tenants_on`): tenants on the vLLM engine, one server per run on the hf (CPU) engine.
        max_tenants: The memory cap: tenants resident on the stage's server at once (each holds its
            adapter, optimizer state and pool partition); a stage with more runs runs the rest as places
            free up.
    """

    enabled: bool | None = None
    max_tenants: int = 8

    def __post_init__(self) -> None:
        if self.max_tenants < 1:
            raise ValueError(f"max_tenants must be >= 1, not {self.max_tenants}")


AUTO_OFF = (
    "own server per run: tenants of one server pay off where one engine batches their requests (vLLM, "
    "--serve-option engine=vllm); on the hf engine side-by-side runs split the CPU cores (--tenants forces them)"
)
"""What the dry run says of a stage when ``--tenants`` was not given and the engine is not vLLM."""


def tenants_on(enabled: bool | None, server_options: Mapping[str, Any]) -> bool:
    """Whether a qualifying stage runs as tenants: never in a dtype the engine cannot serve LoRA tenants
    in (`a3r.swarmops.serving_dtype.tenant_dtype_clash`: vLLM and ``dtype=float32``, even with
    ``--tenants``); else ``enabled`` when the user said (``--tenants`` / ``--no-tenants``); otherwise only
    on the vLLM engine (``--serve-option engine=vllm``). On the hf engine a tenant stage is not measured to
    pay off: on 2 CPU cores a fresh user's 6-minute study ran 6 tenants at 10.7 s per episode (0.4 s alone)
    and the budget cancelled every run before its last step."""
    if tenant_dtype_clash(server_options) is not None:
        return False
    if enabled is not None:
        return enabled
    return str(server_options.get("engine", "hf")) == "vllm"


def tenant_reason(spec: RunSpec, server_options: Mapping[str, Any]) -> str | None:
    """Why ``spec`` needs its own server (one line), or ``None`` when it can be a tenant of its stage's
    server: a sweep run with LoRA, no teacher, and no ``swarm serve`` option of the user's
    (``server_options``) that a tenant cannot express (full fine-tuning, tenants of their own)."""
    s = spec.settings
    if spec.purpose != "sweep" or not spec.stage:
        return f"own server: a {spec.purpose} run"
    if s.lora_rank <= 0 or int(server_options.get("lora-rank", 1) or 0) <= 0:
        return "own server: full fine-tuning (lora_rank 0)"
    if s.distill or s.teacher:
        return "own server: distillation from a teacher (a tenant server has no teacher)"
    if spec.start_step or spec.keep_server:
        return "own server: it continues on a server of its own"
    if "tenants" in server_options:
        return "own server: --serve-option tenants is set by the user"
    return None


def stage_runs(queue: Sequence[RunSpec], server_options: Mapping[str, Any]) -> list[RunSpec]:
    """The runs at the head of ``queue`` that one tenant server can run together: consecutive sweep
    runs of the head's stage that can be tenants (`tenant_reason`) with the same LoRA rank; empty when
    fewer than two (one run keeps its own server)."""
    if not queue or tenant_reason(queue[0], server_options) is not None:
        return []
    head = queue[0]
    found: list[RunSpec] = []
    for spec in queue:
        same = spec.stage == head.stage and spec.settings.lora_rank == head.settings.lora_rank
        if not same or tenant_reason(spec, server_options) is not None:
            break
        found.append(spec)
    return found if len(found) >= 2 else []


def serving_groups(specs: Sequence[RunSpec], server_options: Mapping[str, Any]) -> list[list[RunSpec]]:
    """``specs`` split, in queue order, as the runner serves them: each group `stage_runs` takes from the
    queue (the tenants of one server), and each other run alone (a server of its own)."""
    groups: list[list[RunSpec]] = []
    queue = list(specs)
    while queue:
        group = stage_runs(queue, server_options) or queue[:1]
        groups.append(group)
        queue = queue[len(group) :]
    return groups


def stage_servers(specs: Sequence[RunSpec], server_options: Mapping[str, Any]) -> list[str]:
    """How a stage's runs will be served, one line per server, as the dry run says it: ``"4 runs as
    tenants of one server"`` for each group `stage_runs` takes from the queue, and ``"<run key>: own server:
    <why>"`` for each run that cannot be a tenant (`tenant_reason`) or is left alone."""
    lines: list[str] = []
    for group in serving_groups(specs, server_options):
        if len(group) > 1:
            lines.append(f"{len(group)} runs as tenants of one server")
            continue
        spec = group[0]
        why = tenant_reason(spec, server_options) or "own server: the only run of its LoRA rank"
        lines.append(f"{spec.key}: {why}")
    return lines


def stage_pricing(settings: TenantSettings, server_options: Mapping[str, Any]) -> Serving:
    """How a stage's price sees its serving (`a3r.study.price.Serving`): with tenants on (`tenants_on`),
    the groups the runner serves together (`serving_groups`) within ``settings.max_tenants``, batched on
    the vLLM engine (a wave costs about its slowest run until a tenant stage is measured) and not on hf
    (the runs share the cores: about the sum of their work); else `a3r.study.price.SEQUENTIAL`."""
    if not tenants_on(settings.enabled, server_options):
        return SEQUENTIAL
    options = dict(server_options)
    return Serving(
        groups=lambda specs: serving_groups(specs, options),
        max_tenants=settings.max_tenants,
        batched=str(options.get("engine", "hf")) == "vllm",
    )


@dataclass(frozen=True)
class StageServing:
    """How a planned stage's runs will be served (the dry run's line), and what that costs.

    Attributes:
        lines: `stage_servers`' lines (``"8 runs as tenants of one server"``, ``"<key>: own server: …"``).
        starts_saved: Server starts the stage does not pay: its runs less its servers.
        seconds: The stage's price served so (`a3r.study.price.stage_s`: one server start and per wave its
            slowest run on the vLLM engine, the sum of the runs' work on hf); ``None``: one server per run,
            the design's own estimate.
    """

    lines: list[str]
    starts_saved: int
    seconds: float | None = None


def _off_line(enabled: bool | None, server_options: Mapping[str, Any]) -> str:
    """The dry run's line for a stage with tenants off: why (`tenants_on`)."""
    clash = tenant_dtype_clash(server_options)
    if clash is not None:
        return f"own server per run: {clash}"
    return "own server per run (--no-tenants)" if enabled is False else AUTO_OFF


def _tenant_line(runs: int, serving: Serving) -> str:
    """The dry run's line for ``runs`` runs of a stage as tenants of one server, with how they are priced."""
    waves = math.ceil(runs / serving.max_tenants)
    each = "its slowest run" if serving.batched else "the sum of its runs' work (on hf they share the cores)"
    wave = f"{waves} waves of up to {serving.max_tenants}, each" if waves > 1 else "then"
    return f"{runs} runs as tenants of one server: priced as one server start, {wave} {each}"


def plan_stage_serving(
    plan: PlanDraft,
    stage: str,
    values: Sequence[float],
    *,
    seeds: int,
    runs: int,
    server_options: Mapping[str, Any],
    enabled: bool | None = None,
    max_tenants: int = 8,
    seconds_per_episode: float = math.nan,
    eval_episodes: int = 0,
) -> StageServing:
    """How a stage of ``plan`` will be served, before it runs (``a3r research --dry-run``), and its price
    so served (`a3r.study.price.stage_s` at the design's speed): its runs as built for the queue
    (`a3r.study.research.sweep_specs`), grouped as the runner groups them (`serving_groups`); in a
    LoRA-rank sweep each server line names its rank (``lora_rank=16: 2 runs as tenants…``: the adapter's
    rank is the server's). A stage whose values are decided later (refine, replicate) is judged by runs of
    the dearest coarse value (the design prices them so), and its ``runs`` at most share one server when
    such a run can be a tenant, a refine stage's one server per round (its seeds of one value for
    min-stable, of two for best); in a LoRA-rank sweep one server per configuration, its seeds its tenants
    (the runner's queue holds a configuration's seeds side by side: `stage_runs` takes them together).

    Args:
        plan: A research plan.
        stage: The stage's name.
        values: Its values (empty: decided later).
        seeds: Seeds per configuration.
        runs: Its runs (at most).
        server_options: The user's ``swarm serve`` options.
        enabled: ``a3r research --tenants`` (``False``: one server per run; ``None``: by the engine,
            `tenants_on`).
        max_tenants: Tenants resident at once (`TenantSettings.max_tenants`).
        seconds_per_episode: The design's speed (`a3r.study.design.StudyDesign.seconds_per_episode`).
        eval_episodes: Held-out attempts of each run's evaluation.
    """
    assert plan.sweep is not None
    serving = stage_pricing(TenantSettings(enabled=enabled, max_tenants=max_tenants), server_options)
    if not serving.tenants:
        return StageServing([_off_line(enabled, server_options)], 0)
    if runs < 2:
        return StageServing([], 0)
    price = functools.partial(
        stage_s,
        seconds_per_episode=seconds_per_episode,
        eval_episodes=eval_episodes,
        measured_tokens=token_cap(plan),
        serving=serving,
    )
    if values:
        specs = sweep_specs(plan, values, stage, seeds=list(range(max(1, seeds))))
        groups = serving_groups(specs, server_options)
        rank = plan.sweep.variable == "lora_rank"  # each server is configured with its runs' rank
        lines = [
            (f"lora_rank={g[0].settings.lora_rank}: " if rank else "") + _tenant_line(len(g), serving)
            if len(g) > 1
            else stage_servers(g, server_options)[0]
            for g in groups
        ]
        tenants = sum(len(g) for g in groups if len(g) > 1)
        servers = sum(1 for g in groups if len(g) > 1)
        return StageServing(lines, tenants - servers, price(specs))
    (probe,) = sweep_specs(plan, plan.sweep.coarse[:1], stage, seeds=[0])
    why = tenant_reason(probe, server_options)
    if why is not None:
        return StageServing([f"{why}"], 0)

    def alone(value: float) -> float:
        return price(sweep_specs(plan, [value], stage, seeds=[0]), serving=SEQUENTIAL)

    dearest = max(plan.sweep.coarse, key=alone)
    if plan.sweep.variable == "lora_rank":
        return _rank_stage_serving(plan, stage, dearest, seeds=seeds, runs=runs, price=price, serving=serving)
    # a refine stage is a round at a time (one value a round for min-stable, two for best), each its server
    group = runs
    if stage == "refine" and seeds > 0:
        group = min(runs, seeds * (1 if plan.sweep.goal == "min_stable" else 2))
    rounds = max(1, runs // max(1, group))
    if group < 2:
        return StageServing(["own server: one run a round"], 0)
    specs = sweep_specs(plan, [dearest], stage, seeds=list(range(group)))
    line = (
        f"up to {rounds} rounds, each {_tenant_line(group, serving)}"
        if rounds > 1
        else f"up to {_tenant_line(group, serving)}"
    )
    return StageServing([line], runs - rounds, rounds * price(specs))


def _rank_stage_serving(
    plan: PlanDraft,
    stage: str,
    dearest: float,
    *,
    seeds: int,
    runs: int,
    price: Callable[..., float],
    serving: Serving,
) -> StageServing:
    """`plan_stage_serving` of a LoRA-rank sweep's stage whose ranks are decided later: one server per
    rank (its adapters' rank is the server's ``--lora-rank``), the rank's runs its tenants. A refine round
    adds ``seeds`` runs per rank; a replicate stage brings its two configurations to ``seeds`` seeds, so
    each adds about half of ``runs``. A rank with one run keeps a server of its own, as the runner does
    (`stage_runs` takes two runs or more)."""
    each = seeds if stage == "refine" else math.ceil(runs / 2)
    each = max(1, min(each, runs))
    servers = math.ceil(runs / each)
    why = "one server per LoRA rank (the adapter's rank is the server's)"
    if each < 2:
        return StageServing([f"own server per run: one run per LoRA rank, {why}"], 0)
    specs = sweep_specs(plan, [dearest], stage, seeds=list(range(each)))
    line = f"{why}: up to {servers} ranks, each {_tenant_line(each, serving)}"
    return StageServing([line], runs - servers, servers * price(specs))


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
    servers: Path,
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
        servers: The study's folder of server run dirs (the stage's server is ``<servers>/<stage>-tenants``,
            also for runs that train in a template-knob variant's workspace).
        budget_s: Wall seconds of the stage, shared: every run may take all of it.
        eval_reserve_s: Seconds of it each run keeps for its held-out evaluation.
        max_tenants: Tenants resident at once (`TenantSettings.max_tenants`).

    Returns:
        One outcome per run, each with the stage's measured time (`TenantStageTiming`: wall, server
        start, waves); a server that cannot start gives every run a ``failed_to_start`` outcome.
    """
    started = time.monotonic()
    first = specs[0]
    key = stage_server_key(first.stage)
    ws = dataclasses.replace(workspace(first), servers=servers)
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
            ws=dataclasses.replace(workspace(spec), servers=servers),
            handle=handle,
            server_key=key,
            tenant=tenant_id(spec),
            run_id=run_id,
            budget_s=max(0.0, left),
            eval_reserve_s=eval_reserve_s,
        )

    start_s = time.monotonic() - started
    pool = ThreadPoolExecutor(max_workers=places, thread_name_prefix="a3r-tenant")
    try:
        futures = [pool.submit(one, spec, run_id) for spec, run_id in zip(specs, run_ids, strict=True)]
        outcomes = [future.result() for future in futures]
    finally:
        # first the server (an interrupted stage's runs then see it gone and end), then their threads
        ctx.servers.pop(key, None)
        handle.stop()
        pool.shutdown(wait=True, cancel_futures=True)
    # what the next stage's price is measured from (`a3r.study.research.measured_tenants`)
    timing = TenantStageTiming(
        wall_s=time.monotonic() - started,
        start_s=start_s,
        runs=len(specs),
        waves=math.ceil(len(specs) / places),
    )
    return [outcome.model_copy(update={"tenant_stage": timing}) for outcome in outcomes]
