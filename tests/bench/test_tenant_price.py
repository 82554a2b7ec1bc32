"""The price of a sweep stage run as LoRA tenants of one server (issue 36, deliver 5): one server start
and, per wave of at most ``max_tenants`` runs, its slowest run or its episodes at the engine's aggregate
speed; measured after a tenant stage from the stage's wall, start and waves, not from each tenant's
overlapping wall. Runs through the real graph (planner, runner, analyst, reporter on SQLite) with
``bench/research.py``'s simulated runs behind the run seam and a simulated ``execute_stage`` that
records the stage's time as the real one does."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from research import LANDSCAPES, SimulatedRuns, invoke_study  # type: ignore[import-not-found]

import a3r.graph.context
import a3r.graph.runner
from a3r.graph.context import Ledger, RunContext
from a3r.providers import OfflineProvider
from a3r.study.price import SEQUENTIAL, TenantMeasure, estimate_run_s, stage_s, tenant_stage_s
from a3r.study.research import fit_budget, measured_tenants, sweep_specs, token_cap
from a3r.study.runs import RunOutcome, RunSpec, TenantStageTiming
from a3r.swarmops.tenancy import TenantSettings, plan_stage_serving, stage_pricing
from memory import Store

QUESTION = "find min stable batch size on arithmetic"
START_S = 95.0
"""The H200's tenant server start with vLLM and LoRA enabled (issue 36: 95 s)."""


def _plan() -> Any:
    return OfflineProvider().plan(QUESTION, mode="research")


def test_a_tenant_coarse_stage_of_8_runs_is_priced_as_one_start_and_its_slowest_run() -> None:
    plan = _plan()
    specs = sweep_specs(plan, plan.sweep.coarse, "coarse")
    assert len(specs) == 8  # B ∈ {1, 2, 4, 8} × 2 seeds
    one = {s.key: estimate_run_s(s, seconds_per_episode=0.3, eval_episodes=32) for s in specs}
    slowest = max(one.values())
    vllm = stage_pricing(TenantSettings(), {"engine": "vllm"})  # tenants by default on vLLM
    price: dict[str, Any] = {"seconds_per_episode": 0.3, "eval_episodes": 32}
    assert stage_s(specs, serving=vllm, **price) == pytest.approx(slowest)  # one 20 s start + B = 8's run
    assert stage_s(specs, serving=SEQUENTIAL, **price) == pytest.approx(
        sum(one.values())
    )  # 8 starts, in turn
    # the dry run says and prices it so
    served = plan_stage_serving(
        plan,
        "coarse",
        plan.sweep.coarse,
        seeds=2,
        runs=8,
        server_options={"engine": "vllm"},
        seconds_per_episode=0.3,
        eval_episodes=32,
    )
    assert served.lines == [
        "8 runs as tenants of one server: priced as one server start, then its slowest run"
    ]
    assert served.seconds == pytest.approx(slowest)
    # the memory cap: 8 runs, 3 at once = 3 waves, each its slowest run, one start
    capped = stage_pricing(TenantSettings(max_tenants=3), {"engine": "vllm"})
    waves = [specs[:3], specs[3:6], specs[6:]]
    expected = 20.0 + sum(max(one[s.key] for s in wave) - 20.0 for wave in waves)
    assert stage_s(specs, serving=capped, **price) == pytest.approx(expected)
    # hf with --tenants: one start, and the runs share the cores: the sum of their work
    hf = stage_pricing(TenantSettings(enabled=True), {})
    assert stage_s(specs, serving=hf, **price) == pytest.approx(sum(one.values()) - 7 * 20.0)
    # measured: the stage's start, its aggregate speed, and a wave at least the measured tenant run
    measured = TenantMeasure(start_s=START_S, seconds_per_episode=0.05, run_s=60.0, stages=1)
    at = tenant_stage_s(specs[:2], measured=measured, batched=True, **price)
    assert at == pytest.approx(START_S + 60.0)
    crowded = TenantMeasure(start_s=START_S, seconds_per_episode=0.3, run_s=0.0, stages=1)
    # an engine that served them no faster side by side than one after another: the sum of the work
    assert tenant_stage_s(specs, measured=crowded, batched=True, **price) == pytest.approx(
        START_S + sum(one.values()) - 8 * 20.0
    )


def test_hf_without_tenants_prices_as_before() -> None:
    plan = _plan()
    specs = sweep_specs(plan, plan.sweep.coarse, "coarse")
    default = stage_pricing(TenantSettings(), {})  # hf: one server per run unless --tenants
    assert default is SEQUENTIAL and not default.tenants
    # the numbers the runner priced the coarse stage at before tenants: 8 runs of 20 s + their episodes
    assert stage_s(specs, seconds_per_episode=0.3, eval_episodes=32, serving=default) == pytest.approx(380.8)
    # and each at no less than the measured run (the H200's 85 s): 8 × 85 s
    assert stage_s(specs, seconds_per_episode=0.3, eval_episodes=32, min_run_s=85.0) == pytest.approx(680.0)
    kept, dropped = fit_budget(
        specs,
        budget_s=200.0,
        seconds_per_episode=0.3,
        eval_episodes=32,
        goal="min_stable",
        measured_tokens=token_cap(plan),
        serving=default,
    )
    assert dropped == [4.0, 8.0] and [s.value for s in kept] == [1.0, 1.0, 2.0, 2.0]  # 2 × 34.4 + 2 × 39.2
    vllm = stage_pricing(TenantSettings(), {"engine": "vllm"})
    kept, dropped = fit_budget(
        specs, budget_s=200.0, seconds_per_episode=0.3, eval_episodes=32, goal="min_stable", serving=vllm
    )
    assert dropped == [] and len(kept) == 8  # as tenants the whole stage costs 68 s


@pytest.fixture()
def tenant_graph(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The graph's runner runs a sweep stage as tenants with a simulated `execute_stage`: each run is
    the simulator's, with the H200's times (a 95 s server start, the tenants' walls given, 3 s to stop),
    cancelled by the budget when its wall would not fit; the stage's timing recorded as the real one
    records it. Yields the list of stages run (their specs' keys, budget and timing)."""
    stages: list[dict[str, Any]] = []
    # each tenant's own wall (8 side by side on one engine), in turn: the coarse stage's, then later stages'
    walls = iter([140.0, 142.0, 145.0, 147.0, 150.0, 152.0, 155.0, 160.0, 150.0, 155.0, *[150.0] * 20])

    def execute_stage(
        specs: Sequence[RunSpec],
        *,
        ctx: Any,
        workspace: Any,
        run_ids: Sequence[int],
        servers: Path,
        budget_s: float,
        eval_reserve_s: float,
        max_tenants: int = 8,
    ) -> list[RunOutcome]:
        places = max(1, min(max_tenants, len(specs)))
        outcomes = []
        for spec, run_id in zip(specs, run_ids, strict=True):
            out = ctx.execute(
                spec,
                ctx=ctx,
                ws=workspace(spec),
                run_id=run_id,
                budget_s=budget_s,
                eval_reserve_s=eval_reserve_s,
            )
            wall = next(walls)
            update: dict[str, Any] = {"wall_s": wall, "seconds_per_episode": 0.3}
            if START_S + wall > budget_s:  # the budget cancels it before its first step
                wall = max(0.0, budget_s - START_S)
                update |= {"wall_s": wall, "status": "budget", "steps": 0, "curve": [], "eval": None}
                update |= {"reason": f"wall-time budget of {budget_s:.0f} s spent at step 0", "episodes": 0}
            key = f"{spec.stage}-tenants"
            outcomes.append(out.model_copy(update=update | {"tenant": spec.key, "tenant_server": key}))
        timing = TenantStageTiming(
            wall_s=START_S + max(o.wall_s for o in outcomes) + 3.0,
            start_s=START_S,
            runs=len(specs),
            waves=math.ceil(len(specs) / places),
        )
        stages.append({"keys": [s.key for s in specs], "budget_s": budget_s, "timing": timing})
        return [o.model_copy(update={"tenant_stage": timing}) for o in outcomes]

    monkeypatch.setattr(a3r.graph.runner, "execute_stage", execute_stage)
    yield stages


def _study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, minutes: float
) -> tuple[dict[str, Any], str, list[str]]:
    """The H200 study through the graph with tenants on (vLLM), at ``minutes`` of budget."""
    landscape = replace(LANDSCAPES["min-stable-batch"], question=QUESTION)

    class H200Runs(SimulatedRuns):  # type: ignore[misc]
        def __call__(self, spec, *, ctx, ws, run_id, budget_s, eval_reserve_s):  # type: ignore[no-untyped-def]
            out = super().__call__(
                spec, ctx=ctx, ws=ws, run_id=run_id, budget_s=budget_s, eval_reserve_s=eval_reserve_s
            )
            if spec.purpose == "preflight":
                return out.model_copy(update={"wall_s": 112.0, "seconds_per_episode": 0.3})
            return out

    simulator = H200Runs(landscape, 0)
    # the real executor's seam: with it, the runner runs a stage as tenants and the planner prices so
    monkeypatch.setattr(a3r.graph.context, "execute_run", simulator)
    store, ledger = Store(str(tmp_path / "memory.db")), Ledger(tmp_path / "checkpoints.db")
    said: list[str] = []
    ctx = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=ledger,
        thread_id="h200-tenants",
        root=tmp_path,
        budget_s=minutes * 60.0,
        eval_tasks=16,
        eval_samples=2,
        preflight_samples=4,
        execute=simulator,
        server_options={"engine": "vllm"},
        tenants=TenantSettings(),
        notify=said.append,
    )
    assert ctx.serving().tenants and ctx.serving().batched
    try:
        values = invoke_study(ctx, QUESTION, tmp_path)
        report = Path(values["report"]).read_text(encoding="utf-8")
    finally:
        ledger.close()
        store.close()
    return values, report, said


def test_a_re_plan_after_a_tenant_stage_keeps_the_refine_stage_that_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tenant_graph: list[dict[str, Any]]
) -> None:
    values, _, said = _study(tmp_path, monkeypatch, minutes=11)
    coarse, *later = tenant_graph
    # the coarse stage: 8 runs priced at one start + its slowest run fit after the 112 s preflight
    assert len(coarse["keys"]) == 8 and coarse["timing"].waves == 1
    outcomes = values["outcomes"]
    measured = measured_tenants([o for o in outcomes if o.stage == "coarse"])  # what refine was priced at
    assert measured is not None and measured.start_s == START_S
    assert measured.run_s == pytest.approx(148.5)  # the median tenant, not the stage
    # the refine stage (B = 6 on both seeds) ran as tenants: one start + one tenant run ≈ 244 s fit the
    # ≈ 270 s left; priced as before (2 runs × the median run measured, one after another) it would not
    (refine,) = [s for s in later if s["keys"][0].startswith("refine")]
    assert len(refine["keys"]) == 2
    assert refine["budget_s"] >= START_S + measured.run_s
    assert 2 * measured.run_s > refine["budget_s"]
    line = next(x for x in said if x.startswith("refine: testing batch_size"))
    assert "budget: dropped" not in line
    ran = {o.value for o in outcomes if o.purpose == "sweep"}
    assert 6.0 in ran
    # the thread counted each stage's time once: its wall, its start included
    walls = sum(s["timing"].wall_s for s in tenant_graph)
    assert sum(o.wall_s + o.overhead_s - o.shared_s for o in outcomes if o.purpose == "sweep") >= walls


def test_a_run_the_budget_cancelled_in_a_tenant_stage_is_not_run_and_priced_as_tenants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tenant_graph: list[dict[str, Any]]
) -> None:
    # 6.2 minutes: the coarse stage (one start + its slowest run at the preflight's 0.3 s per episode, 68 s)
    # fits the ≈ 245 s left after the preflight, but on the H200 its tenants take 140-160 s after the 95 s
    # start: B = 4 and 8 (150-160 s) are cancelled by the budget and judged on nothing
    values, report, _ = _study(tmp_path, monkeypatch, minutes=6.2)
    outcomes = values["outcomes"]
    cut = [o for o in outcomes if o.purpose == "sweep" and o.status == "budget"]
    assert cut, [(o.key, o.status, o.wall_s) for o in outcomes]
    conclusion = values["conclusion"]
    assert "Not run (no claim is made about them)" in conclusion
    assert sorted({o.value for o in cut}) == [4.0, 8.0] and len(cut) == 4
    for value in (4, 8):  # nothing is judged that did not run
        assert (
            f"batch_size = {value} (entirely), seeds 0, 1: cancelled by the budget before its first step"
            in conclusion
        ), conclusion
    # spent: the 112 s preflight + the stage's 247 s (95 s start + its longest tenant + 3 s stop); the 4 runs
    # not run as one more tenant stage: 95 s + the 143.5 s median tenant run ≈ 599 s → 10 minutes
    assert (
        "The budget ran out for 4 runs: as tenants of one server at the measured 95 s server start and 144 s "
        "per tenant run, --budget-minutes 10 would have run them (this one had 6.2)" in conclusion
    ), conclusion
    assert "cancelled (budget)" in report


def _tenant(value: int, seed: int, seconds_per_episode: float, timing: TenantStageTiming) -> RunOutcome:
    return RunOutcome(
        key=f"coarse-batch_size={value}-s{seed}",
        run_id=0,
        purpose="sweep",
        seed=seed,
        stage="coarse",
        value=float(value),
        status="finished",
        reason="reached step 4",
        steps=4,
        planned_steps=4,
        curve=[(1, 0.2), (2, 0.2), (3, 0.2), (4, 0.2)],
        wall_s=100.0,
        seconds_per_episode=seconds_per_episode,
        tenant=f"t{value}-{seed}",
        tenant_server="coarse-tenants",
        tenant_stage=timing,
    )


@pytest.mark.parametrize(("engine", "per_tenant"), [("hf", 2.4), ("vllm", 0.6)])
def test_what_the_engine_made_of_side_by_side_runs_is_measured(engine: str, per_tenant: float) -> None:
    # 8 tenants of one run's 0.3 s per episode: on 2 CPU cores each got 1/8 of the cores (2.4 s), on vLLM
    # the engine batched them at half a run's speed each (0.6 s): 4× one run's episodes per second
    timing = TenantStageTiming(wall_s=400.0, start_s=START_S, runs=8, waves=1)
    outcomes = [_tenant(b, s, per_tenant, timing) for b in (1, 2, 4, 8) for s in (0, 1)]
    measured = measured_tenants(outcomes)
    assert measured is not None and measured.run_s == 100.0 and measured.start_s == START_S
    assert measured.seconds_per_episode == pytest.approx(per_tenant / 8)
    plan = _plan()
    refine = sweep_specs(plan, [6.0], "refine1")  # 2 runs of B = 6 side by side
    price: dict[str, Any] = {"seconds_per_episode": 0.3, "eval_episodes": 32, "measured": measured}
    work = [estimate_run_s(s, seconds_per_episode=0.3, eval_episodes=32) - 20.0 for s in refine]
    serving = stage_pricing(TenantSettings(enabled=True), {"engine": engine} if engine == "vllm" else {})
    at = stage_s(refine, serving=serving, **price)
    aggregate = sum(work) / 0.3 * per_tenant / 8
    assert at == pytest.approx(START_S + max(100.0, *work, aggregate))
    # the episodes of 8 tenants' worth of work at the measured aggregate: the sum of their work on hf
    coarse = sweep_specs(plan, plan.sweep.coarse, "coarse")
    coarse_work = sum(estimate_run_s(s, seconds_per_episode=0.3, eval_episodes=32) - 20.0 for s in coarse)
    hf_sum = START_S + coarse_work
    assert (stage_s(coarse, serving=serving, **price) == pytest.approx(hf_sum)) == (engine == "hf")
