"""LLM-driven paths of the graph with fake chat models (no network, no server): planning a task no
template covers, writing and validating its code, refusing generated code that fails its checks, and
patch proposals checked against the allow-list."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.runtime import Runtime

from a3r.graph import PatchReview, RunContext, RunOutcome, RunSpec, build_graph, open_checkpointer, serializer
from a3r.graph.analyst import analyst
from a3r.graph.context import Ledger
from a3r.providers import ChatProvider
from a3r.study.analysis import Diagnosis, DiagnosisKind
from memory import ArtifactKind, PatchStatus, Store, StudyStatus
from tests.a3r.fake_llm import ToolCallingFakeChatModel, tool_answers

WORKFLOW = '''"""Reverse a word."""
from typing import Any

# <params>
PARAMS: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0}
# </params>


async def run(task, llm):
    client = llm.openai()
    reply = await client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "user", "content": f"Reverse the word {task['word']}."}],
        max_tokens=PARAMS["max_tokens"],
        temperature=PARAMS["temperature"],
    )
    text = (reply.choices[0].message.content or "").strip().lower()
    return 1.0 if text == task["answer"] else 0.0
'''

REWARD_OK = """def reward(completion: str, answer: str) -> float:
    return 1.0 if completion.strip().lower() == answer else 0.0


def self_check(tasks):
    failures = []
    for task in tasks:
        if reward(task["answer"], task["answer"]) != 1.0:
            failures.append(f"{task['id']}: gold earned 0")
        if reward("", task["answer"]) != 0.0:
            failures.append(f"{task['id']}: empty earned reward")
    return failures
"""

REWARD_BROKEN = REWARD_OK.replace("return 1.0 if completion.strip().lower() == answer else 0.0", "return 1.0")

TASKS = [
    {"id": f"w{i}", "word": w, "answer": w[::-1]}
    for i, w in enumerate(["cat", "dog", "sun", "map", "pen", "cup", "hat", "box", "red", "ink"])
]

PLAN = {
    "kind": "train",
    "template": None,
    "params": {},
    "objective": "teach the policy to reverse three-letter words",
    "training": {
        "steps": 2,
        "batch_size": 1,
        "group_size": 2,
        "lr": 1e-5,
        "concurrency": 2,
        "seeds": [0],
        "smoke_tasks": 1,
    },
    "hypotheses": [
        {
            "statement": "reversal accuracy rises",
            "expected_outcome": "last-2 > first-2",
            "decision_rule": "difference > 0",
        }
    ],
    "rationale": "no template covers word reversal",
}


def _context(tmp_path: Path, calls: Iterator[Any], store: Store) -> RunContext:
    return RunContext(
        store=store,
        provider=ChatProvider(ToolCallingFakeChatModel(messages=calls), name="fake-llm"),
        ledger=Ledger(tmp_path / "checkpoints.db"),
        thread_id="t-llm",
        root=tmp_path / ".a3r",
        eval_tasks=2,
    )


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "memory.db") as opened:
        yield opened


def _checkpointer(kind: str, tmp_path: Path) -> Any:
    if kind == "sqlite":
        return open_checkpointer(tmp_path / "checkpoints.db")
    from langgraph.checkpoint.memory import InMemorySaver

    return InMemorySaver(serde=serializer())


@pytest.mark.parametrize("checkpointer", ["memory", "sqlite"])
def test_llm_plans_and_writes_code_for_an_uncovered_task(
    tmp_path: Path, store: Store, checkpointer: str
) -> None:
    code = {"workflow": WORKFLOW, "reward": REWARD_OK, "tasks": TASKS}
    ctx = _context(tmp_path, tool_answers(("PlanDraft", PLAN), ("GeneratedCode", code)), store)
    graph = build_graph(_checkpointer(checkpointer, tmp_path), interrupt_before=["runner"])
    config = {"configurable": {"thread_id": "t-llm"}}
    chunks = list(
        graph.stream(
            {"request": "train word reversal", "mode": "vibe"}, config, context=ctx, stream_mode="updates"
        )
    )
    assert [name for chunk in chunks for name in chunk] == ["planner", "coder", "__interrupt__"]
    state = graph.get_state(config)
    assert state.next == ("runner",)
    values = state.values
    ws = Path(values["workspace"])
    assert (ws / "workflow.py").read_text() == WORKFLOW
    assert (ws / "evaluator" / "reward.py").read_text() == REWARD_OK
    held = [json.loads(line) for line in (ws / "heldout.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (ws / "tasks.jsonl").read_text().splitlines()]
    assert held and not {t["id"] for t in held} & {t["id"] for t in train}
    study_id = values["study_id"]
    assert [h.statement for h in store.hypotheses(study_id)] == ["reversal accuracy rises"]
    kinds = {a.name: a.kind for a in store.artifacts(study_id)}
    assert kinds == {
        "workflow.py": ArtifactKind.workflow,
        "reward.py": ArtifactKind.reward,
        "tasks.jsonl": ArtifactKind.data,
    }
    assert values["queue"][0].key == "smoke"


def test_generated_code_failing_its_checks_is_not_run(tmp_path: Path, store: Store) -> None:
    code = {"workflow": WORKFLOW, "reward": REWARD_BROKEN, "tasks": TASKS}
    ctx = _context(tmp_path, tool_answers(("PlanDraft", PLAN), ("GeneratedCode", code)), store)
    ctx.code_attempts = 1  # no repair (tests/a3r/test_coder_repair.py has them)
    graph = build_graph(open_checkpointer(tmp_path / "checkpoints.db"))
    config = {"configurable": {"thread_id": "t-llm"}}
    chunks = list(
        graph.stream(
            {"request": "train word reversal", "mode": "vibe"}, config, context=ctx, stream_mode="updates"
        )
    )
    assert [name for chunk in chunks for name in chunk] == ["planner", "coder", "reporter"]
    values = graph.get_state(config).values
    assert values["conclusion"].startswith(
        "stopped: the generated code failed its check 1 time; the last failure, at step checks: w0: empty earned reward"
    )
    assert store.get_study(values["study_id"]).status is StudyStatus.abandoned
    assert store.runs() == []
    assert Path(values["report"]).exists()


def _analyst_state(tmp_path: Path, store: Store) -> dict[str, Any]:
    from a3r.study.plans import PlanDraft

    ws = tmp_path / "ws"
    ws.mkdir()
    for name, text in (("workflow.py", WORKFLOW), ("reward.py", REWARD_OK), ("heldout.jsonl", "{}\n")):
        (ws / name).write_text(text)
    study = store.create_study("train word reversal", kind="vibe")
    for name, kind in (("workflow.py", ArtifactKind.workflow), ("reward.py", ArtifactKind.reward)):
        store.add_artifact(study.id, kind, name, (ws / name).read_text())
    experiment = store.create_experiment(study.id, "generated-train")
    run = store.start_run(experiment.id, name="train-s0")
    diagnosis = Diagnosis(
        kind=DiagnosisKind.zero_signal, summary="4/4 groups identical", evidence={"groups": 4}, patchable=True
    )
    outcome = RunOutcome(
        key="train-s0", run_id=run.id, status="needs_attention", reason="zero signal", diagnoses=[diagnosis]
    )
    return {
        "mode": "vibe",
        "study_id": study.id,
        "workspace": str(ws),
        "plan": PlanDraft.model_validate(PLAN),
        "outcomes": [outcome],
        "queue": [],
        "hypothesis_ids": [],
    }


def test_llm_patch_to_a_forbidden_file_is_refused(tmp_path: Path, store: Store) -> None:
    state = _analyst_state(tmp_path, store)
    bad = {
        "file": "heldout.jsonl",
        "new_content": '{"answer": "x"}\n',
        "rationale": "make the held-out set easier",
    }
    ctx = _context(tmp_path, tool_answers(("PatchDraft", bad)), store)
    command = analyst(state, Runtime(context=ctx))  # type: ignore[arg-type]
    assert command.goto == "planner"  # no approval asked; training continues unchanged
    assert command.update["queue"][0].key == "train-s0-c"  # type: ignore[index]
    assert store.patches(state["study_id"]) == []
    assert any("patch refused" in e.message for e in store.events(study_id=state["study_id"]))
    assert (tmp_path / "ws" / "heldout.jsonl").read_text() == "{}\n"


def test_llm_patch_is_proposed_once_with_a_diff(tmp_path: Path, store: Store) -> None:
    state = _analyst_state(tmp_path, store)
    new = WORKFLOW.replace('"temperature": 1.0', '"temperature": 1.2')
    good = {
        "file": "workflow.py",
        "new_content": new,
        "rationale": "identical rewards: sample more diversely",
    }
    ctx = _context(tmp_path, tool_answers(("PatchDraft", good)), store)
    command = analyst(state, Runtime(context=ctx))  # type: ignore[arg-type]
    assert command.goto == "approve"
    review = command.update["pending_patch"]  # type: ignore[index]
    assert isinstance(review, PatchReview) and review.proposed_by == "fake-llm"
    assert '-PARAMS: dict[str, Any] = {"max_tokens": 8, "temperature": 1.0}' in review.diff
    assert '+PARAMS: dict[str, Any] = {"max_tokens": 8, "temperature": 1.2}' in review.diff
    # The node re-runs on resume: the ledger returns the same patch, the fake LLM is not asked again.
    again = analyst(state, Runtime(context=ctx))  # type: ignore[arg-type]
    assert again.update["pending_patch"].patch_id == review.patch_id  # type: ignore[index]
    (patch,) = store.patches(state["study_id"])
    assert patch.status is PatchStatus.pending and patch.rationale == good["rationale"]


def test_checkpoints_revive_only_allow_listed_types() -> None:
    from pydantic import BaseModel

    class Smuggled(BaseModel):
        command: str = "rm -rf /"

    serde = serializer()
    spec = RunSpec(key="train-s0", purpose="train")
    assert serde.loads_typed(serde.dumps_typed({"queue": [spec]})) == {"queue": [spec]}
    revived = serde.loads_typed(serde.dumps_typed({"x": Smuggled()}))
    assert revived == {"x": {"command": "rm -rf /"}}  # plain data, never the class
