"""The research preflight stops as soon as its attempts rule out the signal GRPO needs: the evaluator
(against a real tiny-model server on loopback) cancels the attempts under way once the sequential
test decides; failed attempts say what failed and after how long; the planner concludes with the
bound, and goes on to the sweep when the evidence does not decide."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.runtime import Runtime

from a3r.graph.planner import planner
from a3r.providers import OfflineProvider
from a3r.study.analysis import EpisodeRecord, RewardSummary
from a3r.study.sequential import SignalRule
from a3r.swarmops.evaluate import main as evaluate
from memory import Store
from tests.a3r.planner_states import offline_context, preflight_state


def _workflow(tmp_path: Path, body: str, tasks: int) -> tuple[Path, Path]:
    code = "import asyncio\n\n\nasync def run(task, llm):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    workflow = tmp_path / "workflow.py"
    workflow.write_text(code + "\n")
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"id": f"h{i}", "value": i}) + "\n" for i in range(tasks)))
    return workflow, heldout


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _evaluate(
    tmp_path: Path, server: Any, body: str, tasks: int, extra: list[str], client_id: str
) -> tuple[Path, dict[str, Any]]:
    """Run the held-out evaluator (stop test at G = 4) on a workflow with ``body``; its records' path and
    its summary."""
    workflow, heldout = _workflow(tmp_path, body, tasks=tasks)
    out, summary = tmp_path / "eval.jsonl", tmp_path / "summary.json"
    args = [str(workflow), "--server", server.url, "--dataset", str(heldout), "--out", str(out)]
    args += ["--summary", str(summary), "--stop-group-size", "4", *extra]
    assert evaluate([*args, "--client-id", client_id]) == 0
    return out, json.loads(summary.read_text())


def test_the_evaluator_stops_once_the_attempts_rule_out_enough_signal(tmp_path: Path, server: Any) -> None:
    body = """
        client = llm.openai(max_retries=0)
        await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        return 0.0
    """
    out, result = _evaluate(
        tmp_path, server, body, 16, ["--samples", "4", "--concurrency", "8"], "preflight-stop"
    )
    test = SignalRule().test(4, 64)
    signal = result["signal"]
    assert test.first_stop == 32 and signal["stopped"] and signal["planned"] == 64
    # The look that stopped saw the first ≥ 32 attempts in start order; the ones under way then were
    # cancelled and left no record.
    assert 32 <= signal["attempts"] < 32 + 8 and signal["successes"] == 0
    records = _records(out)
    assert result["ended"] == len(records) < 64 and result["attempts"] == 64
    assert {r["order"] for r in records} >= set(range(32))
    assert all(r["status"] == "finished" and r["seconds"] >= 0 for r in records)
    # Round-robin start order: the first 16 attempts are one per task.
    first = sorted((r for r in records if r["order"] < 16), key=lambda r: r["order"])
    assert [r["task_id"] for r in first] == [f"h{i}" for i in range(16)]
    assert {r["member"] for r in first} == {0}
    assert server.runtime.episodes.clients()["preflight-stop"] == 0  # cancelled episodes were aborted


def test_failed_attempts_say_what_failed_and_after_how_long(tmp_path: Path, server: Any) -> None:
    body = """
        if task["value"] == 0:
            await asyncio.sleep(30)
        raise RuntimeError()
    """
    workflow, heldout = _workflow(tmp_path, body, tasks=2)
    out = tmp_path / "eval.jsonl"
    args = [str(workflow), "--server", server.url, "--dataset", str(heldout), "--out", str(out)]
    assert evaluate([*args, "--samples", "1", "--episode-timeout", "0.5"]) == 0
    errors = {r["task_id"]: r["error"] for r in _records(out)}
    assert errors["h0"] == (
        "TimeoutError: task h0 attempt 0 did not end within the 0.5 s episode limit (--episode-timeout)"
    )
    assert errors["h1"] == "RuntimeError: (no message) (task h1 attempt 0, after 0 s)"


def test_the_failure_note_groups_time_limits() -> None:
    from a3r.swarmops.execution import _failure_note

    def failed(error: str) -> EpisodeRecord:
        return EpisodeRecord(kind="eval", round=0, task_id="t", member=0, status="aborted", error=error)

    limit = "TimeoutError: task h{} attempt 0 did not end within the 300 s episode limit (--episode-timeout)"
    records = [failed(limit.format(i)) for i in range(12)] + [failed("ValueError: bad answer (task h3 …)")]
    note = _failure_note(records, 60)
    assert note == (
        "13 of 60 held-out attempts failed and count as incorrect (12 ran past the 300 s episode time "
        "limit; ValueError: bad answer (task h3 …))"
    )


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "memory.db") as opened:
        yield opened


def _preflight_state(store: Store, rewards: list[float], *, with_check: bool) -> dict[str, Any]:
    question = "find min stable batch size on arithmetic"
    mean = sum(rewards) / len(rewards)
    baseline = RewardSummary(
        tasks=15, episodes=len(rewards), mean_reward=mean, pass_at_1=mean, pass_at_2=mean, rewards=rewards
    )
    signal = None
    if with_check:
        test = SignalRule().test(OfflineProvider().plan(question, mode="research").training.group_size, 60)
        signal = test.check(sum(1 for r in rewards if r > 0), len(rewards))
    reason = (
        "baseline held-out mean reward 0.000; 12 of 22 held-out attempts failed and count as incorrect "
        "(12 ran past the 300 s episode time limit)"
    )
    return preflight_state(store, question, baseline, reason=reason, signal=signal)


def test_the_planner_concludes_with_the_bound(tmp_path: Path, store: Store) -> None:
    ctx = offline_context(tmp_path, store)
    stop = planner(_preflight_state(store, [0.0] * 32, with_check=True), Runtime(context=ctx))  # type: ignore[arg-type]
    assert stop.goto == "reporter"
    text = stop.update["conclusion"]  # type: ignore[index]
    # the bound it measured, never "scores zero" (issue 33, 7)
    assert (
        text.startswith(
            "stopped before the sweep: the untrained model gets too little signal for GRPO on arithmetic: held-out "
            "success rate below 0.1"
        )
        and "at 95% (0 of 32 attempts earned a reward)" in text
    )
    assert "scores zero" not in text
    assert "below 0.102" in text and "≥ 0.159" in text and "stopped after 32 of 60 planned attempts" in text
    assert "--force" in text and "Note: 12 of 22 held-out attempts failed" in text
    assert "12 ran past the 300 s episode time limit" in text
    assert "few-shot examples on" not in text  # the plan has them on already (a fresh user was told to)


def test_a_rare_success_is_too_little_signal_and_a_common_one_goes_on(tmp_path: Path, store: Store) -> None:
    ctx = offline_context(tmp_path, store)
    rare = [1.0] + [0.0] * 59  # 1 of 60: the rate is below p_min, though not zero
    stop = planner(_preflight_state(store, rare, with_check=False), Runtime(context=ctx))  # type: ignore[arg-type]
    assert stop.goto == "reporter"
    text = stop.update["conclusion"]  # type: ignore[index]
    assert "gets too little signal for GRPO on arithmetic" in text and "1 of 60 held-out attempts" in text
    common = [1.0, 0.0, 0.0, 0.0] * 15  # 15 of 60: these attempts do not rule out enough signal
    go = planner(_preflight_state(store, common, with_check=False), Runtime(context=ctx))  # type: ignore[arg-type]
    assert go.goto == "runner" and go.update["stage"] == "coarse"  # type: ignore[index]


def test_the_time_budget_cuts_attempts_and_says_how_far_they_got(tmp_path: Path, server: Any) -> None:
    from a3r.swarmops.execution import _cut_note, _failure_note

    body = """
        client = llm.openai(max_retries=0)
        await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        if task["value"] % 2 == 0:
            await asyncio.sleep(60)  # an attempt that would run on past the budget
        return 0.0
    """
    out, result = _evaluate(
        tmp_path, server, body, 4, ["--samples", "1", "--time-budget", "4"], "preflight-cut"
    )
    records = {r["task_id"]: r for r in _records(out)}
    assert set(records) == {"h0", "h1", "h2", "h3"}
    for task in ("h0", "h2"):  # cut by the budget, at most the budget after the client's start
        cut = records[task]
        assert cut["cut"] is True and cut["status"] == "aborted" and 1.0 < cut["seconds"] <= 4.5
        assert cut["error"].startswith(f"cut: task {task} attempt 0 was cut after ")
        assert "4 s time budget (--time-budget); it counts as no success" in cut["error"]
    for task in ("h1", "h3"):  # ended on their own: the server's record gives their tokens
        assert records[task]["status"] == "finished" and 1 <= records[task]["tokens"] <= 3
    assert result["cut"] == 2 and result["time_budget_s"] == 4 and result["tokens_per_s"] > 0
    assert result["cut_tokens"] == round(result["tokens_per_s"] * result["cut_after_s"])
    alone = result["uncut_signal"]
    assert alone["attempts"] == 2 and alone["successes"] == 0 and not alone["stopped"]
    note = _cut_note(result)
    assert (
        note.startswith("2 of 4 attempts were cut at ")
        and "by the preflight's 4 s time budget after ≈ " in note
    )
    assert (
        "the bound counts a cut attempt as no success, i.e. it assumes a cut attempt would not have" in note
    )
    assert (
        "the 2 attempts that ended on their own had 0 success(es)" in note
        and "would not stop the test alone" in note
    )
    failed = [EpisodeRecord.model_validate(r) for r in records.values() if r["status"] != "finished"]
    assert _failure_note(failed, 4) == (
        "2 of 4 held-out attempts failed and count as incorrect (2 cut at the evaluation's time budget)"
    )
    assert server.runtime.episodes.clients()["preflight-cut"] == 0  # the cut episodes were aborted


def test_the_verdict_says_how_many_attempts_the_budget_cut(tmp_path: Path, store: Store) -> None:
    from a3r.swarmops.execution import _cut_note

    summary = {
        "attempts": 64,
        "ended": 23,
        "cut": 12,
        "cut_after_s": 262.4,
        "time_budget_s": 271.0,
        "tokens_per_s": 3.31,
        "cut_tokens": 869,
        "not_begun": 0,
        "uncut_signal": SignalRule().test(4, 64).check(0, 11).model_dump(),
    }
    cut = _cut_note(summary)
    state = _preflight_state(store, [0.0] * 32, with_check=True)
    state["outcomes"] = [
        o.model_copy(
            update={
                "reason": "baseline held-out mean reward 0.000; 12 of 23 held-out attempts failed and count as "
                f"incorrect (12 cut at the evaluation's time budget): {cut}"
            }
        )
        for o in state["outcomes"]
    ]
    ctx = offline_context(tmp_path, store)
    stop = planner(state, Runtime(context=ctx))  # type: ignore[arg-type]
    text = stop.update["conclusion"]  # type: ignore[index]
    assert "stopped after 32 of 60 planned attempts" in text
    assert (
        "Note: 12 of 23 held-out attempts failed and count as incorrect (12 cut at the evaluation's time budget): "
        "12 of 23 attempts were cut at 262 s by the preflight's 271 s time budget after ≈ 869 completion tokens "
        "each (the 3.3 tokens/s the ended attempts decoded); the bound counts a cut attempt as no success, i.e. it "
        "assumes a cut attempt would not have succeeded; the 11 attempts that ended on their own had 0 "
        "success(es), a rate below "
    ) in text
    assert "which would not stop the test alone." in text


def test_a_comparison_that_cannot_run_both_arms_stops_instead_of_running_one(
    tmp_path: Path, store: Store
) -> None:
    """Found by a fresh user: the budget dropped one arm of an A-vs-B study and spent the rest on the other,
    which cannot answer the question."""
    from a3r.study.design import coarse_values
    from a3r.study.research import estimate_run_s, sweep_specs, token_cap

    question = "is lr 1e-4 better than 3e-4 on arithmetic"
    rewards = [1.0, 0.0, 0.0, 0.0] * 15  # signal enough to sweep
    mean = sum(rewards) / len(rewards)
    baseline = RewardSummary(
        tasks=15, episodes=60, mean_reward=mean, pass_at_1=mean, pass_at_2=mean, rewards=rewards
    )
    state = preflight_state(store, question, baseline)
    plan = state["plan"]
    ctx = offline_context(tmp_path, store)
    specs = sweep_specs(plan, coarse_values(plan, []), "coarse")
    per_value = (
        sum(
            estimate_run_s(
                s,
                seconds_per_episode=0.5,
                eval_episodes=ctx.eval_tasks * ctx.eval_samples,
                measured_tokens=token_cap(plan),
            )
            for s in specs
        )
        / 2
    )
    ctx.budget_s = 40.0 + 1.5 * per_value  # the preflight's 40 s, then room for one arm only
    stop = planner(state, Runtime(context=ctx))  # type: ignore[arg-type]
    assert stop.goto == "reporter"
    text = stop.update["conclusion"]  # type: ignore[index]
    assert (
        text.startswith("stopped: the comparison needs both lr values on 2 seeds, and ")
        and "raise --budget" in text
    )


def test_a_preflight_the_budget_stopped_is_a_budget_stop_not_a_crash(tmp_path: Path, store: Store) -> None:
    """Found by a fresh user: ``--budget-minutes 0.5`` logged "preflight crashed: held-out evaluation
    exceeded 10 s" and the report's run table said ``failed (crashed)``; the README promises
    ``cancelled (budget)`` for a run the budget stopped."""
    from a3r.study.runs import status_text
    from a3r.swarmops.execution import _Evaluation, _preflight_end

    status, reason = _preflight_end(
        _Evaluation(None, "held-out evaluation exceeded the 10 s left", 10.2, timed_out=True)
    )
    assert status_text(status) == "cancelled (budget)"
    assert reason == "the budget stopped it: held-out evaluation exceeded the 10 s left"
    # an evaluation that failed on its own is still a crash
    assert _preflight_end(_Evaluation(None, "evaluation exited with code 1: boom", 3.0))[0] == "crashed"
    state = preflight_state(
        store,
        "lr 1e-4 vs 1e-3 on arithmetic",
        RewardSummary(tasks=0, episodes=0, mean_reward=0, pass_at_1=0, pass_at_2=0),
    )
    state["outcomes"] = [
        o.model_copy(update={"status": status, "reason": reason, "eval": None}) for o in state["outcomes"]
    ]
    stop = planner(state, Runtime(context=offline_context(tmp_path, store)))  # type: ignore[arg-type]
    text = stop.update["conclusion"]  # type: ignore[index]
    assert text.startswith(
        "stopped: the budget ran out during the preflight evaluation (the budget stopped it"
    )
    assert "failed" not in text and text.endswith("raise --budget-minutes")
