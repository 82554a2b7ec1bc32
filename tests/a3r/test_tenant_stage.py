"""A sweep stage's runs as LoRA tenants of ONE real ``swarm serve --tenants N`` (issue 36, deliver 5): every
run is created as a tenant, trained by its own ``swarm run --tenant`` client, watched, evaluated on its
adapter and retired; its store record has its own steps, metrics and outcome. A budget cut cancels the
tenants still training (``cancelled (budget)``), never a crash. Which runs can be tenants, and why not."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from a3r.app.tui._run_dir import RunDirReader, run_tenant
from a3r.graph import RunContext, RunSpec
from a3r.study.plans import TrainingSettings
from a3r.study.runs import STORE_STATUS, status_text
from a3r.swarmops.execution import Workspace
from a3r.swarmops.tenancy import (
    AUTO_OFF,
    TenantSettings,
    execute_stage,
    serving_groups,
    stage_runs,
    stage_servers,
    tenant_id,
    tenant_reason,
    tenants_on,
)
from memory import RunStatus, Store
from tests.a3r.planner_states import offline_context
from tests.conftest import vllm_skip_reason

_ONE_CALL = """import asyncio


async def run(task, llm):
    client = llm.openai(max_retries=0)
    await client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return float(task["value"])
"""


def _spec(batch_size: int, seed: int, steps: int = 2, **settings: Any) -> RunSpec:
    return RunSpec(
        key=f"coarse-batch_size={batch_size}-s{seed}",
        purpose="sweep",
        seed=seed,
        stage="coarse",
        value=float(batch_size),
        settings=TrainingSettings(
            **{"steps": steps, "batch_size": batch_size, "group_size": 2, "concurrency": 2, "lora_rank": 8}
            | settings
        ),
    )


def _ctx(tmp_path: Path, store: Store, model: str | None = None) -> RunContext:
    return dataclasses.replace(
        offline_context(tmp_path, store),
        model=model,
        poll_s=0.5,
        hang_after_s=120.0,
        eval_tasks=2,
        eval_samples=2,
        tenants=TenantSettings(enabled=True),  # forced: by default the hf engine keeps one server per run
    )


def test_tenants_by_default_only_on_the_vllm_engine() -> None:
    assert (
        tenants_on(None, {"engine": "vllm"})
        and not tenants_on(None, {})
        and not tenants_on(None, {"engine": "hf"})
    )
    assert tenants_on(True, {}) and not tenants_on(False, {"engine": "vllm"})


def test_which_runs_can_be_tenants() -> None:
    stage = [_spec(b, s) for b in (1, 2) for s in (0, 1)]
    assert [s.key for s in stage_runs(stage, {})] == [s.key for s in stage]
    assert tenant_reason(_spec(1, 0, lora_rank=0), {}) == "own server: full fine-tuning (lora_rank 0)"
    assert "teacher" in str(tenant_reason(_spec(1, 0, distill=True, teacher="http://t"), {}))
    train = RunSpec(key="train-s0", purpose="train", settings=TrainingSettings(lora_rank=8))
    assert tenant_reason(train, {}) == "own server: a train run"
    # another rank ends the stage's tenants; one run alone keeps its own server
    mixed = [_spec(1, 0), _spec(2, 0), _spec(4, 0).model_copy(update={"settings": TrainingSettings()})]
    assert len(stage_runs(mixed, {})) == 2 and stage_runs(stage[:1], {}) == []
    ids = {tenant_id(s) for s in stage}
    assert len(ids) == 4 and all(len(i) <= 32 and i[0].isalpha() for i in ids)
    assert tenant_reason(stage[0], {"lora-rank": 0}) == "own server: full fine-tuning (lora_rank 0)"
    assert stage_servers([*stage, _spec(4, 0, lora_rank=0)], {}) == [
        "4 runs as tenants of one server",
        "coarse-batch_size=4-s0: own server: full fine-tuning (lora_rank 0)",
    ]


def _workspace(tmp_path: Path) -> Workspace:
    ws = Workspace(tmp_path / "ws")
    ws.root.mkdir()
    ws.workflow.write_text(_ONE_CALL)
    (ws.root / "evaluator").mkdir()
    ws.evaluator.write_text(_ONE_CALL)
    rows = "".join(json.dumps({"id": f"t{i}", "value": i % 2}) + "\n" for i in range(40))
    ws.tasks.write_text(rows)
    ws.heldout.write_text("".join(json.dumps({"id": f"h{i}", "value": i % 2}) + "\n" for i in range(4)))
    return ws


def _stage(
    ctx: RunContext,
    ws: Workspace,
    specs: list[RunSpec],
    runs: list[Any],
    *,
    budget_s: float,
    max_tenants: int = 8,
) -> list[Any]:
    """`execute_stage` of ``specs`` in ``ws`` (30 s evaluation reserve), its servers stopped after."""
    try:
        return execute_stage(
            specs,
            ctx=ctx,
            workspace=lambda spec: ws,
            run_ids=[r.id for r in runs],
            servers=ws.root / "servers",
            budget_s=budget_s,
            eval_reserve_s=30.0,
            max_tenants=max_tenants,
        )
    finally:
        ctx.close_servers()


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["ample", "cut"])
def test_a_coarse_stage_runs_as_tenants_of_one_server(
    tmp_path: Path, tiny_model_dir: Path, budget: str
) -> None:
    ws = _workspace(tmp_path)
    store = Store(tmp_path / "memory.db")
    experiment = store.create_experiment(store.create_study("tenants").id, "e").id
    ctx = _ctx(tmp_path, store, str(tiny_model_dir))
    steps = 2 if budget == "ample" else 1000
    specs = [_spec(b, s, steps=steps) for b in (1, 2) for s in (0, 1)]
    runs = [store.start_run(experiment, name=s.key, config={"purpose": "sweep"}) for s in specs]
    # the cap: the fourth run waits for a freed place
    outcomes = _stage(ctx, ws, specs, runs, budget_s=400.0 if budget == "ample" else 60.0, max_tenants=3)
    assert ctx.servers == {}
    # the stage's own time, on every run: what the next stage is priced from (4 runs, 3 at once: 2 waves)
    timing = outcomes[0].tenant_stage
    assert timing is not None and (timing.runs, timing.waves) == (4, 2)
    assert 0 < timing.start_s < timing.wall_s and all(o.tenant_stage == timing for o in outcomes)
    # ONE server: one server dir, one server log, every run recorded against it
    assert [p.name for p in (ws.root / "servers").iterdir() if p.is_dir()] == ["coarse-tenants"]
    server_dir = ws.root / "servers" / "coarse-tenants"
    records = [store.get_run(r.id) for r in runs]
    assert {r.run_dir for r in records} == {str(server_dir)} and len({r.server_url for r in records}) == 1
    assert sorted(str(r.config["tenant"]) for r in records) == sorted(tenant_id(s) for s in specs)
    events = [json.loads(line) for line in (server_dir / "events.jsonl").read_text().splitlines()]
    created = {e["data"]["tenant"] for e in events if e["kind"] == "tenant.created"}
    retired = {e["data"]["tenant"] for e in events if e["kind"] == "tenant.retired"}
    assert created == retired == {tenant_id(s) for s in specs}
    retired_at = {  # the step each tenant's retire checkpointed ("retired at step N")
        e["data"]["tenant"]: int(e["message"].split(" retired at step ")[1].split(";")[0])
        for e in events
        if e["kind"] == "tenant.retired"
    }
    for spec, run, outcome in zip(specs, runs, outcomes, strict=True):
        assert outcome.key == spec.key and outcome.run_id == run.id
        assert outcome.tenant == tenant_id(spec) and outcome.tenant_server == "coarse-tenants"
        if budget == "ample":
            assert outcome.status == "finished" and outcome.reason.startswith("reached step 2"), (
                outcome.reason
            )
            assert outcome.steps == 2 and [s for s, _ in outcome.curve] == [1, 2]
            assert store.metric_history(run.id, "reward_mean")
            assert outcome.eval is not None and outcome.eval.episodes == 4  # its adapter, 2 tasks × 2
            # the TUI reads a finished tenant run's own metrics from the shared run dir
            record = store.get_run(run.id)
            reader = RunDirReader(str(record.run_dir), tenant=run_tenant(record.config))
            assert [row["step"] for row in asyncio.run(reader.poll()).metrics or []] == [1, 2]
        else:
            assert outcome.status == "budget", outcome.reason
            assert status_text(outcome.status) == "cancelled (budget)"
            assert STORE_STATUS[outcome.status] is RunStatus.cancelled
            assert not any(d.kind.value == "crash" for d in outcome.diagnoses), [
                (d.summary, d.evidence) for d in outcome.diagnoses
            ]
            if outcome.eval is None:  # retired at the stop: a step under way then counts (fresh-s6 #2)
                assert outcome.steps == retired_at[outcome.tenant], (outcome.steps, outcome.reason)
    store.close()


def test_the_dry_run_says_which_runs_share_a_server(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    base = ["research", "find min stable batch size on arithmetic", "--dry-run"]
    base += ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "m.db")]
    shared = CliRunner().invoke(app, [*base, "--tenants"])
    alone = CliRunner().invoke(app, [*base, "--no-tenants"])
    auto = CliRunner().invoke(app, base)
    assert shared.exit_code == alone.exit_code == auto.exit_code == 0, shared.output + alone.output
    assert "servers: 8 runs as tenants of one server" in shared.output
    assert "servers: own server per run (--no-tenants)" in alone.output
    # by default the hf (CPU) engine keeps one server per run, and says why
    assert f"servers: {AUTO_OFF}" in " ".join(auto.output.split())
    assert "tenants of one server" not in auto.output.replace(AUTO_OFF, "")

    def minutes(output: str) -> float:
        line = next(x for x in output.splitlines() if "estimated time: ≈ " in x)
        return float(line.split("≈ ")[1].split(" min")[0])

    # one server start per stage (a refine round is a stage), not per run: 7 + 2 + 5 server starts of 20 s
    # fewer; on hf the side-by-side runs share the cores, so their work is priced as their sum
    assert minutes(alone.output) - minutes(shared.output) == pytest.approx(14 * 20 / 60, abs=1.0)
    assert "servers: up to 2 rounds, each 2 runs as tenants of one server" in shared.output


def test_the_dry_run_of_a_lora_rank_study_names_each_servers_rank(tmp_path: Path) -> None:
    """fresh36 #12: the rank is a server's setting, so a LoRA-rank study has one tenant server per rank:
    each coarse line names its rank, and refine and replicate say that a rank's seeds are tenants of its
    server, which is what the runner does with their queue (`serving_groups`, as `stage_runs` takes it)."""
    from typer.testing import CliRunner

    from a3r.app.cli import app
    from a3r.providers.offline import OfflineProvider
    from a3r.study.research import sweep_specs

    question = "find the best lora rank on arithmetic"
    where = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "m.db")]
    dry = CliRunner().invoke(app, ["research", question, "--dry-run", "--tenants", *where])
    assert dry.exit_code == 0, dry.output
    servers = [" ".join(x.split()) for x in dry.output.splitlines() if "servers:" in x]
    tenants = "2 runs as tenants of one server: priced as one server start"
    assert [x.split(": ", 2)[1] for x in servers[:3]] == ["lora_rank=4", "lora_rank=16", "lora_rank=64"]
    assert all(tenants in x for x in servers[:3])
    per_rank = "servers: one server per LoRA rank (the adapter's rank is the server's): up to 2 ranks, each "
    assert servers[3].startswith(per_rank + tenants), servers  # refine: a round's 2 ranks, 2 seeds each
    assert servers[4].startswith(per_rank + "4 runs as tenants of one server"), servers  # replicate
    plan = OfflineProvider().plan(question, mode="research")
    for stage, seeds in (("refine1", [0, 1]), ("replicate", [2, 3, 4, 5])):  # as the planner queues them
        queue = [s for rank in (16.0, 32.0) for s in sweep_specs(plan, [rank], stage, seeds=seeds)]
        groups = serving_groups(queue, {})
        assert [(len(g), {s.settings.lora_rank for s in g}) for g in groups] == [
            (len(seeds), {16}),
            (len(seeds), {32}),
        ]


@pytest.mark.skipif(vllm_skip_reason() is None, reason="this machine runs vLLM: nothing to report")
def test_the_dry_run_plans_vllm_on_a_machine_that_cannot_run_it(tmp_path: Path) -> None:
    """fresh36 #11: the dry run starts nothing, so on a machine without a GPU or vLLM it prints the plan and
    one line saying what this machine lacks; the real run still refuses in one line, writing nothing."""
    from typer.testing import CliRunner

    from a3r.app.cli import app

    where = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "m.db")]
    ask = ["research", "find min stable batch size on arithmetic", *where]
    ask += ["--serve-option", "engine=vllm", "--serve-option", "device=cuda"]
    dry = CliRunner().invoke(app, [*ask, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "servers: 8 runs as tenants of one server" in dry.output
    (estimate,) = [line for line in dry.output.splitlines() if "estimated time" in line]
    assert (
        "the hf engine's speed on CPU, likely an overestimate for this plan's engine=vllm, device=cuda"
        in estimate
    )
    notes = [line for line in dry.output.splitlines() if "this machine cannot run it" in line]
    assert len(notes) == 1 and dry.output.rstrip().endswith(notes[0]), dry.output
    assert "sees no CUDA device" in notes[0] or "vLLM is not installed" in notes[0], notes[0]
    bad = CliRunner().invoke(app, [*ask, "--dry-run", "--serve-option", "max-staleness=-1"])
    assert bad.exit_code == 1 and "--max-staleness" in bad.output  # option mistakes still refuse
    real = CliRunner().invoke(app, ask)
    assert real.exit_code == 1 and "swarm serve refuses it" in real.output, real.output
    assert len(real.output.strip().splitlines()) == 1 and not (tmp_path / ".a3r").exists()


def test_the_report_and_the_tui_show_a_runs_tenant() -> None:
    from a3r.app.tui._run_dir import tenant_text
    from a3r.study.report import _runs
    from a3r.study.runs import RunOutcome

    own = RunOutcome(key="coarse-batch_size=8-s0", run_id=1, status="finished", reason="ok")
    shared = own.model_copy(
        update={"key": "coarse-batch_size=1-s0", "tenant": "t1", "tenant_server": "coarse-tenants"}
    )
    table = "\n".join(_runs([own, shared], None, None))
    assert "| server |" in table and "| tenant of server coarse |" in table and "| own |" in table
    assert "| server |" not in "\n".join(_runs([own], None, None))  # reports without tenants unchanged
    assert tenant_text({"tenant": "t1", "tenant_server": "coarse-tenants"}) == "tenant of server coarse"
    assert tenant_text({"purpose": "sweep"}) == ""


@pytest.mark.slow
def test_the_runner_records_a_tenant_stage_like_single_runs(tmp_path: Path, tiny_model_dir: Path) -> None:
    from langgraph.runtime import Runtime

    from a3r.graph.runner import _tenant_stage, runner
    from a3r.study.analysis import RewardSummary
    from a3r.study.research import spent_s
    from tests.a3r.planner_states import preflight_state

    ws = _workspace(tmp_path)
    store = Store(tmp_path / "memory.db")
    state: Any = preflight_state(
        store,
        "find min stable batch size on arithmetic",
        RewardSummary(tasks=2, episodes=4, mean_reward=0.5, pass_at_1=0.5, pass_at_2=0.5),
    )
    stage = [_spec(1, 0, steps=1), _spec(2, 0, steps=1)]
    state |= {"workspace": str(ws.root), "queue": [*stage, RunSpec(key="later", purpose="train")]}
    ctx = dataclasses.replace(_ctx(tmp_path, store, str(tiny_model_dir)), budget_s=900.0)
    off = dataclasses.replace(ctx, tenants=TenantSettings(enabled=False))
    auto = dataclasses.replace(ctx, tenants=TenantSettings())  # the hf engine: no tenants unless asked
    assert _tenant_stage(state["queue"], auto) == []
    assert _tenant_stage(state["queue"], off) == [] and _tenant_stage(state["queue"], ctx) == stage
    try:
        update: Any = runner(state, Runtime(context=ctx))
    finally:
        ctx.close_servers()
    outcomes = update["outcomes"]
    assert update["ran"] == 2 and [o.key for o in outcomes] == [s.key for s in stage]
    assert [s.key for s in update["queue"]] == ["later"]
    assert all(o.status == "finished" and o.tenant_server == "coarse-tenants" for o in outcomes)
    # the stage's time counts once: the runs ran side by side
    assert spent_s(outcomes) < sum(o.wall_s + o.overhead_s for o in outcomes)
    assert sum(1 for o in outcomes if o.shared_s > 0) == 1
    # priced from the stage's measured start and tenants, never as runs of their own servers
    from a3r.study.research import measured_run_s, measured_tenants

    measured = measured_tenants(outcomes)
    assert measured is not None and measured.stages == 1 and measured.start_s > 0
    assert measured_run_s(outcomes) is None
    runs = {r.name: r for r in store.runs()}
    assert all(runs[s.key].status is RunStatus.finished for s in stage)
    assert all(runs[s.key].config["tenant_server"] == "coarse-tenants" for s in stage)
    assert any("tenant of server coarse-tenants" in line for line in update["log"])
    store.close()


@pytest.mark.slow
def test_a_stage_resumed_after_a_killed_a3r_continues_its_tenants(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from a3r.swarmops.execution import tenant_server_options
    from a3r.swarmops.processes import start_server

    ws = _workspace(tmp_path)
    store = Store(tmp_path / "memory.db")
    experiment = store.create_experiment(store.create_study("tenants").id, "e").id
    ctx = _ctx(tmp_path, store, str(tiny_model_dir))
    specs = [_spec(1, 0, steps=1), _spec(1, 1, steps=1)]
    # the stage's server, killed with a tenant of the first run resident (paused by a budget stop)
    server_dir = ws.root / "servers" / "coarse-tenants"
    before = start_server(
        server_dir, model=str(tiny_model_dir), options=tenant_server_options(specs[0], ctx, 2)
    )
    try:
        with before.client() as admin:
            admin.create_tenant(tenant_id(specs[0]), batch_size=1, group_size=2, max_steps=1, seed=0)
            admin.pause_tenant(tenant_id(specs[0]))
    finally:
        before.stop()
    runs = [store.start_run(experiment, name=s.key, config={"purpose": "sweep"}) for s in specs]
    outcomes = _stage(ctx, ws, specs, runs, budget_s=400.0)
    assert [o.status for o in outcomes] == ["finished", "finished"], [o.reason for o in outcomes]
    notes = [e.message for e in store.events(run_id=runs[0].id)]
    assert any(f"continuing as tenant {tenant_id(specs[0])} from its step 0" in n for n in notes), notes
    store.close()


def test_on_vllm_every_server_serves_one_dtype_and_float32_keeps_one_server_per_run(tmp_path: Path) -> None:
    """vLLM serves LoRA tenants in bf16/fp16 only: without a ``dtype`` server option every server of a study
    (the preflight, a stage's tenant server, a run's own server) serves ``--dtype auto`` (bf16 on the
    H200); a ``dtype=float32`` asked on vLLM keeps one server per run, even with ``--tenants``, and the dry
    run's ``servers:`` line says why. Nothing here needs vLLM: no server starts."""
    from a3r.app.commands import _research_design, _stage_lines
    from a3r.app.session import SessionSettings
    from a3r.graph.runner import _tenant_stage
    from a3r.swarmops.execution import _server_options, tenant_server_options
    from a3r.swarmops.serving_dtype import tenant_dtype_clash

    fp32 = {"engine": "vllm", "device": "cuda", "dtype": "float32"}
    clash = "vLLM serves LoRA tenants in bf16/fp16 only; dtype=float32 asked"
    assert tenant_dtype_clash(fp32) == clash and tenant_dtype_clash({"engine": "vllm"}) is None
    assert not tenants_on(None, fp32) and not tenants_on(True, fp32)
    assert tenants_on(None, {"engine": "vllm", "dtype": "bfloat16"}) and tenants_on(
        True, {"dtype": "float32"}
    )

    store = Store(tmp_path / "memory.db")
    stage = [_spec(1, 0), _spec(2, 0)]
    preflight = RunSpec(key="preflight", purpose="preflight", settings=TrainingSettings(lora_rank=8))
    vllm = dataclasses.replace(
        offline_context(tmp_path, store), server_options={"engine": "vllm", "device": "cuda"}
    )
    assert _tenant_stage(stage, vllm) == stage  # tenants by default on vLLM, in auto (bf16 LoRA)
    for argv in (
        tenant_server_options(stage[0], vllm, 2).argv(),
        _server_options(stage[0], vllm).argv(),
        _server_options(preflight, vllm).argv(),
    ):
        assert argv[argv.index("--dtype") + 1] == "auto" and argv[argv.index("--engine") + 1] == "vllm"
    asked = dataclasses.replace(vllm, server_options=fp32)
    forced = dataclasses.replace(asked, tenants=TenantSettings(enabled=True))
    assert _tenant_stage(stage, asked) == [] and _tenant_stage(stage, forced) == []
    for spec in (stage[0], preflight):
        argv = _server_options(spec, asked).argv()
        assert argv[argv.index("--dtype") + 1] == "float32"
    store.close()

    question = "find min stable batch size on arithmetic"

    def servers(options: dict[str, Any], tenants: bool | None = None) -> list[str]:
        settings = SessionSettings(
            root=tmp_path / ".a3r", store=str(tmp_path / "none.db"), server_options=options, tenants=tenants
        )
        return [x.strip() for x in _stage_lines(_research_design(question, settings, {})) if "servers:" in x]

    assert servers({"engine": "vllm", "device": "cuda"})[0].startswith(
        "servers: 8 runs as tenants of one server"
    )
    for tenants in (None, True):
        lines = servers(fp32, tenants)
        assert lines and all(line == f"servers: own server per run: {clash}" for line in lines)
