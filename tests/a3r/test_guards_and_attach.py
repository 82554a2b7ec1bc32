"""Guard rails and the less travelled paths: API keys never reach the store, checkpoints or
workspace; the research preflight stops on a zero baseline (unless forced); ``--server`` attaches
to a running swarm server and drives it through its HTTP API only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.runtime import Runtime

from a3r.graph import RunContext, RunOutcome, build_graph, open_checkpointer
from a3r.graph.context import Ledger
from a3r.graph.planner import planner
from a3r.providers import OfflineProvider, ProviderConfig, make_provider
from a3r.study.analysis import Diagnosis, DiagnosisKind, RewardSummary
from memory import RunStatus, Store
from tests.a3r.fake_llm import FakeLLMServer
from tests.a3r.planner_states import offline_context, preflight_state
from tests.a3r.test_providers import PLAN, SECRET


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "memory.db") as opened:
        yield opened


def test_api_keys_never_reach_store_checkpoints_or_workspace(tmp_path: Path, store: Store) -> None:
    fake = FakeLLMServer(canned={"PlanDraft": PLAN}).start()
    try:
        config = ProviderConfig.from_env(
            "anthropic", base_url=fake.url, environ={"ANTHROPIC_API_KEY": SECRET}
        )
        ctx = RunContext(
            store=store,
            provider=make_provider(config),
            ledger=Ledger(tmp_path / "checkpoints.db"),
            thread_id="t-secret",
            root=tmp_path / ".a3r",
            eval_tasks=2,
        )
        graph = build_graph(open_checkpointer(tmp_path / "checkpoints.db"), interrupt_before=["runner"])
        list(
            graph.stream(
                {"request": "train countdown", "mode": "vibe"},
                {"configurable": {"thread_id": "t-secret"}},
                context=ctx,
            )
        )
    finally:
        fake.stop()
    assert fake.requests, "the provider was called"
    store.close()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "workflow.py" for p in files) and any(
        p.name.startswith("checkpoints.db") for p in files
    )
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path


def _research_state(store: Store, mean: float, episodes: int = 24) -> dict[str, Any]:
    baseline = RewardSummary(tasks=8, episodes=episodes, mean_reward=mean, pass_at_1=mean, pass_at_2=mean)
    return preflight_state(store, "find min stable batch size on AIME", baseline)


def test_a_zero_score_on_too_few_attempts_to_decide_does_not_stop_the_study(
    tmp_path: Path, store: Store
) -> None:
    # found by a fresh user: 16 attempts at zero stopped a study whose own sequential test said "these
    # attempts do not rule that rate out (16 attempts are too few for it to ever stop)"
    ctx = offline_context(tmp_path, store)
    go = planner(_research_state(store, 0.0, episodes=16), Runtime(context=ctx))  # type: ignore[arg-type]
    assert go.goto == "runner" and go.update["stage"] == "coarse"  # type: ignore[index]
    (line,) = [entry for entry in go.update["log"] if entry.startswith("preflight:")]  # type: ignore[index]
    assert "a zero score, but not a stop" in line and "16 attempts are too few for it to ever stop" in line


def test_research_stops_on_a_zero_baseline_unless_forced(tmp_path: Path, store: Store) -> None:
    ctx = offline_context(tmp_path, store)
    # 40 attempts at zero: the sequential test (stopping below 0.102, issue 33) stops at 28
    state = _research_state(store, 0.0, episodes=40)
    stop = planner(state, Runtime(context=ctx))  # type: ignore[arg-type]
    assert stop.goto == "reporter"
    conclusion = stop.update["conclusion"]  # type: ignore[index]
    assert (
        "gets too little signal for GRPO on math: held-out success rate below" in conclusion
        and "arithmetic template" in conclusion
        and "--force" in conclusion
    )
    forced = planner({**state, "force": True}, Runtime(context=ctx))  # type: ignore[arg-type]
    assert forced.goto == "runner"
    queue = forced.update["queue"]  # type: ignore[index]
    assert {s.stage for s in queue} == {"coarse"} and {s.seed for s in queue} == {0, 1}
    assert sorted({s.settings.batch_size for s in queue}) == [1, 2, 4, 8]
    tight = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=ctx.ledger,
        thread_id="t",
        root=tmp_path,
        budget_s=120.0,
    )
    cut = planner({**state, "force": True}, Runtime(context=tight))  # type: ignore[arg-type]
    assert cut.goto == "reporter" and "fits the remaining budget" in cut.update["conclusion"]  # type: ignore[index]


@pytest.mark.slow
def test_vibe_attaches_to_a_running_server(tmp_path: Path, store: Store, trainable_server: Any) -> None:
    live = trainable_server
    ctx = RunContext(
        store=store,
        provider=OfflineProvider(),
        ledger=Ledger(tmp_path / "checkpoints.db"),
        thread_id="t-attach",
        root=tmp_path / ".a3r",
        server_url=live.url,
        hang_after_s=120.0,
        poll_s=0.5,
        eval_tasks=2,
    )
    graph = build_graph(open_checkpointer(tmp_path / "checkpoints.db"))
    config = {"configurable": {"thread_id": "t-attach"}}
    request = {
        "request": "train arithmetic",
        "mode": "vibe",
        "overrides": {"steps": 2, "batch_size": 1, "group_size": 2},
    }
    step_before = live.runtime.step
    graph.invoke(request, config, context=ctx, durability="sync")
    state = graph.get_state(config).values
    assert ctx.servers == {}  # nothing was started
    assert live.runtime.step >= step_before + 2
    batch = live.runtime.training.effective_config()["training"]["batch"]
    assert batch["batch_size"] == 1 and batch["group_size"] == 2
    runs = store.study_runs(state["study_id"])
    assert runs[0].name == "smoke" and all(r.status is not RunStatus.running for r in runs)
    assert state["outcomes"][-1].steps >= step_before + 2 and state["report"]
    assert any("attached to" in e.message for e in store.events(study_id=state["study_id"]))


def test_a_failed_smoke_run_ends_the_thread_with_its_evidence(tmp_path: Path, store: Store) -> None:
    from a3r.graph.analyst import analyst
    from a3r.study.analysis import detect_crash

    plan = OfflineProvider().plan("train arithmetic", mode="vibe")
    study = store.create_study("train arithmetic", kind="vibe")
    run = store.start_run(store.create_experiment(study.id, "arithmetic-train").id, name="smoke")
    log = "Traceback (most recent call last):\n  File \"workflow.py\", line 9, in run\nKeyError: 'question'\n"
    smoke = RunOutcome(
        key="smoke",
        run_id=run.id,
        purpose="smoke",
        status="crashed",
        reason="swarm run exited with code 1",
        diagnoses=detect_crash(log, exit_code=1),
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "workflow.py").write_text("PARAMS = {}\n")
    state = {
        "mode": "vibe",
        "study_id": study.id,
        "workspace": str(ws),
        "plan": plan,
        "outcomes": [smoke],
        "queue": [],
        "hypothesis_ids": [],
    }
    ctx = offline_context(tmp_path, store)
    command = analyst(state, Runtime(context=ctx))  # type: ignore[arg-type]
    assert command.goto == "planner" and command.update["queue"] == []  # type: ignore[index]
    assert "KeyError: 'question'" in command.update["conclusion"]  # type: ignore[index]
    (finding,) = store.findings(study.id)
    assert "crash" in finding.statement and finding.run_ids == [run.id]


def test_cli_user_mistakes_end_with_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from a3r.app.cli import app

    runner = CliRunner()
    common = ["--root", str(tmp_path / ".a3r"), "--store", str(tmp_path / "memory.db")]
    result = runner.invoke(app, ["vibe", "train a chess engine", *common])
    assert result.exit_code == 1
    assert "error: no task template covers" in result.output and "LLM provider" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(
        app,
        ["research", "find min stable batch size on arithmetic", "--provider", "anthropic", *common],
        env={"ANTHROPIC_API_KEY": ""},
    )
    assert result.exit_code == 1 and "ANTHROPIC_API_KEY" in result.output
    result = runner.invoke(app, ["resume", "t-unknown", "--root", str(tmp_path / ".a3r")])
    assert result.exit_code == 1 and "unknown thread" in result.output
    result = runner.invoke(app, ["resume", "t-unknown", "--approve", "--reject", "--root", str(tmp_path)])
    assert result.exit_code == 1 and "exclude each other" in result.output
    # Mistakes caught before a thread or a study exists: nothing is written.
    fresh = tmp_path / "fresh"
    untouched = ["--root", str(fresh / ".a3r"), "--store", str(fresh / "memory.db")]
    dead = runner.invoke(app, ["vibe", "train arithmetic", "--server", "http://127.0.0.1:1", *untouched])
    assert dead.exit_code == 1 and "cannot reach it" in dead.output
    empty = runner.invoke(app, ["vibe", "   ", *untouched])
    assert empty.exit_code == 1 and "the request is empty" in empty.output
    bad = runner.invoke(app, ["vibe", "train arithmetic", "--serve-option", "max-staleness", *untouched])
    assert bad.exit_code == 1 and "--serve-option 'max-staleness': expected KEY=VALUE" in bad.output
    managed = runner.invoke(
        app, ["research", "find min stable batch size", "--serve-option", "--admin-token=s3cret", *untouched]
    )
    assert managed.exit_code == 1 and "--serve-option admin-token: a3r gives its servers" in managed.output
    assert "s3cret" not in managed.output
    planned = runner.invoke(app, ["vibe", "train arithmetic", "--serve-option", "lr=1", *untouched])
    assert planned.exit_code == 1 and "--serve-option lr: set from the plan" in planned.output
    for option, reason in [
        ("max-staleness=abc", "Invalid value for '--max-staleness'"),
        ("max-staleness=-1", "--max-staleness: Input should be greater than or equal to 0"),
        ("bogus=1", "No such option: --bogus"),
    ]:
        refused = runner.invoke(app, ["vibe", "train arithmetic", "--serve-option", option, *untouched])
        assert refused.exit_code == 1 and f"swarm serve refuses it: {reason}" in refused.output, option
        assert len(refused.output.strip().splitlines()) == 1
    missing = runner.invoke(app, ["vibe", "train arithmetic", "--model", str(fresh / "no-model"), *untouched])
    assert missing.exit_code == 1 and "no-model does not exist" in missing.output
    (tmp_path / "notes.txt").write_text("not a model")
    not_a_model = runner.invoke(
        app, ["vibe", "train arithmetic", "--model", str(tmp_path / "notes.txt"), *untouched]
    )
    assert not_a_model.exit_code == 1 and "neither a model directory nor a .gguf file" in not_a_model.output
    unplannable = runner.invoke(app, ["vibe", "train a chess engine", *untouched])
    assert unplannable.exit_code == 1 and "no task template covers" in unplannable.output
    assert "thread" not in unplannable.output  # no thread id for a thread that never existed
    assert not fresh.exists()


def test_a_thread_that_stopped_before_its_goal_exits_non_zero() -> None:
    import typer

    from a3r.app.commands import _finish
    from a3r.app.session import Step

    stopped = Step(thread_id="t", status="done", conclusion="stopped: the smoke run smoke ended crashed: …")
    with pytest.raises(typer.Exit) as exit_:
        _finish(stopped)
    assert exit_.value.exit_code == 1
    _finish(Step(thread_id="t", status="done", conclusion="reward rose from 0.1 to 0.4"))  # no exit
    assert not Step(thread_id="t", status="waiting").stopped


def test_serve_options_parse_into_swarm_serve_flags() -> None:
    from a3r.app.commands import _serve_options
    from swarm.client import ServeOptions

    options = _serve_options(["max-staleness=1", "--threads=2", "tis-cap=2", "dtype=auto"], options=())
    assert options == {"max-staleness": "1", "threads": "2", "tis-cap": "2", "dtype": "auto"}
    assert ServeOptions.from_flags({**options, "train": False}).argv() == [
        "--dtype", "auto", "--threads", "2", "--no-train", "--tis-cap", "2", "--max-staleness", "1",
    ]  # fmt: skip


def test_a_repeated_quota_serve_option_keeps_every_family() -> None:
    from a3r.app.commands import _serve_options
    from swarm.client import ServeOptions

    options = _serve_options(["quota=math=0.5", "quota=code=0.5"], options=())
    assert options == {"quota": ["math=0.5", "code=0.5"]}
    assert ServeOptions.from_flags(options).argv() == ["--quota", "math=0.5", "--quota", "code=0.5"]


def test_train_reward_up_while_held_out_down_is_flagged(tmp_path: Path, store: Store) -> None:
    from a3r.graph.analyst import analyst

    plan = OfflineProvider().plan("train arithmetic", mode="vibe")
    study = store.create_study("train arithmetic", kind="vibe")
    experiment = store.create_experiment(study.id, "arithmetic-train")
    smoke_run = store.start_run(experiment.id, name="smoke")
    train_run = store.start_run(experiment.id, name="train-s0")
    held = {"tasks": 4, "episodes": 8, "pass_at_1": 0.0, "pass_at_2": 0.0}
    smoke = RunOutcome(
        key="smoke",
        run_id=smoke_run.id,
        purpose="smoke",
        status="finished",
        reason="",
        eval=RewardSummary(mean_reward=0.5, **held),
    )
    train = RunOutcome(
        key="train-s0",
        run_id=train_run.id,
        purpose="train",
        status="finished",
        reason="reached step 4",
        curve=[(1, 0.2), (2, 0.4), (3, 0.5), (4, 0.7)],
        eval=RewardSummary(mean_reward=0.25, **held),
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    state = {
        "mode": "vibe",
        "study_id": study.id,
        "workspace": str(ws),
        "plan": plan,
        "outcomes": [smoke, train],
        "queue": [],
        "hypothesis_ids": [],
    }
    ctx = offline_context(tmp_path, store)
    assert analyst(state, Runtime(context=ctx)).goto == "planner"  # type: ignore[arg-type]
    (finding,) = store.findings(study.id)
    assert (
        "reward_hacking" in finding.statement
        and "+0.500" in finding.statement
        and "-0.250" in finding.statement
    )
    assert finding.run_ids == [smoke_run.id, train_run.id]


_RISING = [0.0, 0.08, 0.1, 0.22, 0.28, 0.35, 0.38, 0.5, 0.55, 0.62]
_ZIGZAG = [-0.18, 0.10, -0.12, 0.16, -0.05, 0.08, -0.15, 0.12, -0.02, 0.07]  # the spy run
_ZERO_SIGNAL = Diagnosis(kind=DiagnosisKind.zero_signal, summary="9/10 groups have identical rewards")


@pytest.mark.parametrize(
    ("curve", "status", "diagnoses"),
    [
        ([0.0, 0.5], "unconfirmed", []),  # too few steps for an interval
        ([0.3], "unconfirmed", []),  # one step: "over 1 step", not "over 1 steps"
        (_RISING, "confirmed", []),
        ([-v for v in _RISING], "refuted", []),
        (_ZIGZAG, "unconfirmed", []),  # +0.036 on one noisy seed: not a confirmation
        (_RISING, "unconfirmed", [_ZERO_SIGNAL]),  # a run that cannot learn is never confirmed
    ],
)
def test_the_vibe_verdict_clears_the_noise(
    tmp_path: Path, store: Store, curve: list[float], status: str, diagnoses: list[Diagnosis]
) -> None:
    from a3r.graph.reporter import _vibe_conclusion

    study = store.create_study("train arithmetic", kind="vibe")
    run = store.start_run(store.create_experiment(study.id, "arithmetic-train").id, name="train-s0")
    state = {
        "mode": "vibe",
        "study_id": study.id,
        "plan": OfflineProvider().plan("train arithmetic", mode="vibe"),
        "outcomes": [
            RunOutcome(
                key="train-s0",
                run_id=run.id,
                purpose="train",
                status="finished",
                reason="",
                steps=len(curve),
                curve=[(i + 1, v) for i, v in enumerate(curve)],
                diagnoses=diagnoses,
            )
        ],
        "hypothesis_ids": [],
    }
    ctx = offline_context(tmp_path, store)
    conclusion = _vibe_conclusion(state, ctx)  # type: ignore[arg-type]
    (finding,) = store.findings(study.id)
    assert finding.status.value == status and conclusion.startswith(f"hypothesis {status}")
    steps = f"{len(curve)} step" + ("s" if len(curve) != 1 else "")
    assert f"change of the mean train reward over {steps} of arithmetic on 1 seed(s)" in conclusion
    assert "95% CI" in conclusion or "step(s)" in conclusion
    if status == "unconfirmed" and not diagnoses:  # how many more steps, or that more are unlikely to help
        assert ("would settle it" in conclusion) != (
            "unlikely to settle it at this effect size" in conclusion
        )
    if diagnoses:
        assert "identical rewards" in conclusion


def test_a_patched_run_is_judged_on_the_steps_trained_on_the_patched_reward(
    tmp_path: Path, store: Store
) -> None:
    """Seen on the H200: a broken reward paid for leaks (train reward up to 0.57), the patch took that pay
    away (down to −0.06), and the 60-step trend across the patch read −0.171 for a run whose reward rose
    after it. The verdict is judged on the steps after the last patch, and says so."""
    from a3r.graph.reporter import _vibe_conclusion

    study = store.create_study("train arithmetic", kind="vibe")
    experiment = store.create_experiment(study.id, "arithmetic-train").id
    hacked = [0.1 + 0.05 * i for i in range(10)]  # paid by the broken reward
    after = [v - 0.6 for v in _RISING]  # the patched reward: lower, and rising

    def outcome(key: str, first_step: int, curve: list[float], patch: int | None) -> RunOutcome:
        return RunOutcome(
            key=key,
            run_id=store.start_run(experiment, name=key).id,
            purpose="train",
            status="finished",
            reason="",
            steps=first_step + len(curve) - 1,
            curve=[(first_step + i, v) for i, v in enumerate(curve)],
            reward_patch=patch,
        )

    outcomes = [outcome("train-s0", 1, hacked, None), outcome("train-s0-p1", 11, after, 1)]
    state = {
        "mode": "vibe",
        "study_id": study.id,
        "plan": OfflineProvider().plan("train arithmetic", mode="vibe"),
        "outcomes": outcomes,
        "hypothesis_ids": [],
    }
    conclusion = _vibe_conclusion(state, offline_context(tmp_path, store))  # type: ignore[arg-type]
    assert conclusion.startswith(
        f"hypothesis confirmed: change of the mean train reward over {len(_RISING)} steps"
    )
    assert (
        f"judged on steps 11–{10 + len(_RISING)}, trained on the reward of patch 1 (the 10 steps before it"
        in conclusion
    )
    (finding,) = store.findings(study.id)
    assert finding.run_ids == [outcomes[1].run_id]
