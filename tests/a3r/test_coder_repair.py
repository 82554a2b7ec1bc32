"""The coder repairs code an LLM wrote: the provider (the official OpenAI and Anthropic SDKs, against a
loopback server speaking their wire formats) first answers code that fails its check, is shown the
failure and its code, and answers a fix; after ``code_attempts`` failures the thread stops with one
line. And code an LLM wrote for a task no template covers (counting the letters of a word) trains end
to end on the tiny model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from a3r.graph import RunContext, build_graph, open_checkpointer
from a3r.graph.context import Ledger
from a3r.providers import ProviderConfig, make_provider
from memory import RunStatus, Store, StudyStatus
from tests.a3r.fake_llm import FakeLLMServer

# The "LLM output": task code for a task no template covers, as a model would write it.
WORKFLOW = '''"""Count the letters of a word: one question, a bare-number reply."""

from __future__ import annotations

from typing import Any

from swarm.client.workflow import LLM, Result
from templates._loader import import_sibling

_reward = import_sibling(__name__, __file__, "reward")

# <params>
PARAMS: dict[str, Any] = {"max_tokens": 6, "temperature": 1.0}
# </params>


async def run(task: dict[str, Any], llm: LLM) -> Result:
    question = f"How many letters does the word '{task['word']}' have? Answer with the number only."
    async with llm.openai() as client:
        response = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": question}],
            max_tokens=PARAMS["max_tokens"],
            temperature=PARAMS["temperature"],
        )
    text = response.choices[0].message.content or ""
    return Result(
        reward=_reward.reward(text, task["answer"]),
        metrics={"correct": float(_reward.first_number(text) == task["answer"])},
    )
'''

REWARD = '''"""Reward of the letter count: 1 for the right number; otherwise up to 0.2 for a short reply (the
answer's format: a bare number)."""

from __future__ import annotations

import re


def first_number(text: str) -> int | None:
    found = re.search(r"-?\\d+", text)
    return int(found.group()) if found else None


def reward(text: str, answer: int) -> float:
    if first_number(text) == answer:
        return 1.0
    return 0.2 * max(0.0, 1.0 - len(text.strip()) / 40)


def self_check(tasks: list[dict]) -> list[str]:
    failures = []
    for task in tasks:
        if reward(str(task["answer"]), task["answer"]) != 1.0:
            failures.append(f"{task['id']}: the gold answer earned less than 1")
        if reward("I do not know how many letters that word has, sorry!", task["answer"]) > 0.05:
            failures.append(f"{task['id']}: a long non-answer earned reward")
    return failures
'''

# The first answer's bug: a misspelt name in the self-check (a NameError traceback at validation).
REWARD_BROKEN = REWARD.replace(
    'if reward(str(task["answer"]), task["answer"]) != 1.0:',
    'if reward(str(task["answer"]), task["anwser"]) != 1.0:',
)
assert REWARD_BROKEN != REWARD

WORDS = ["cat", "house", "sun", "river", "tree", "apple", "moon", "garden", "book", "stone", "bird", "cloud"]
TASKS = [{"id": f"count-{w}", "word": w, "answer": len(w)} for w in WORDS]

PLAN = {
    "kind": "train",
    "template": None,
    "params": {},
    "objective": "teach the policy to count the letters of a word",
    "training": {
        "steps": 2,
        "batch_size": 1,
        "group_size": 2,
        "lr": 1e-4,
        "concurrency": 2,
        "seeds": [0],
        "smoke_tasks": 1,
    },
    "hypotheses": [
        {
            "statement": "letter-count reward rises",
            "expected_outcome": "last steps above the first",
            "decision_rule": "trend interval above the minimum effect",
        }
    ],
    "rationale": "no template covers counting letters",
}


def _code(reward: str) -> dict[str, Any]:
    return {"workflow": WORKFLOW, "reward": reward, "tasks": TASKS}


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "memory.db") as opened:
        yield opened


def _context(tmp_path: Path, store: Store, fake: FakeLLMServer, kind: str, **extra: Any) -> RunContext:
    base = f"{fake.url}/v1" if kind == "openai" else fake.url
    env = {"OPENAI_API_KEY": "sk-test"} if kind == "openai" else {"ANTHROPIC_API_KEY": "sk-ant-test"}
    config = ProviderConfig.from_env(kind, model="fake", base_url=base, environ=env)
    return RunContext(
        store=store,
        provider=make_provider(config.model_copy(update={"max_retries": 0})),
        ledger=Ledger(tmp_path / "checkpoints.db"),
        thread_id="t-repair",
        root=tmp_path / ".a3r",
        eval_tasks=2,
        **extra,
    )


def _user_text(request: dict[str, Any]) -> str:
    """The user turn of a recorded chat-completions or messages request."""
    (message,) = [m for m in request["body"]["messages"] if m["role"] == "user"]
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def test_the_coder_repairs_llm_code_from_its_check_failure(tmp_path: Path, store: Store) -> None:
    fake = FakeLLMServer(
        canned={"PlanDraft": PLAN, "GeneratedCode": [_code(REWARD_BROKEN), _code(REWARD)]}
    ).start()
    try:
        ctx = _context(tmp_path, store, fake, "openai")
        graph = build_graph(open_checkpointer(tmp_path / "checkpoints.db"), interrupt_before=["runner"])
        config = {"configurable": {"thread_id": "t-repair"}}
        chunks = list(graph.stream({"request": "train letter counting", "mode": "vibe"}, config, context=ctx))
    finally:
        fake.stop()
    assert [name for chunk in chunks for name in chunk] == ["planner", "coder", "__interrupt__"]
    plan_call, first, repair = fake.requests
    assert "Request: train letter counting" in _user_text(first)
    assert "failed its check" not in _user_text(first)
    # What the model was shown for the repair: the failed step, the traceback and its own code.
    shown = _user_text(repair)
    assert "Your code (attempt 1) failed its check at step 'import':" in shown
    assert "Traceback (most recent call last):" in shown and "KeyError: 'anwser'" in shown
    assert 'task["anwser"]' in shown and "=== workflow.py ===" in shown and "count-cat" in shown
    values = graph.get_state(config).values
    ws = Path(values["workspace"])
    assert (ws / "reward.py").read_text() == REWARD and (ws / "evaluator" / "reward.py").read_text() == REWARD
    events = [e.message for e in store.events(study_id=values["study_id"])]
    assert any(
        m.startswith(
            "coder: attempt 1 of 3 failed its check at step import: KeyError: 'anwser' (reward.py line"
        )
        for m in events
    )
    assert any("validated after 1 repair" in m for m in events)
    (reward,) = [a for a in store.artifacts(values["study_id"]) if a.name == "reward.py"]
    assert reward.content == REWARD and plan_call["api"] == "openai"


def test_the_coder_gives_up_after_its_attempts_with_one_line(tmp_path: Path, store: Store) -> None:
    fake = FakeLLMServer(canned={"PlanDraft": PLAN, "GeneratedCode": [_code(REWARD_BROKEN)]}).start()
    try:
        ctx = _context(tmp_path, store, fake, "anthropic", code_attempts=2)
        graph = build_graph(open_checkpointer(tmp_path / "checkpoints.db"))
        config = {"configurable": {"thread_id": "t-repair"}}
        graph.invoke({"request": "train letter counting", "mode": "vibe"}, config, context=ctx)
    finally:
        fake.stop()
    assert len(fake.requests) == 3  # plan, code, one repair
    assert "Your code (attempt 1) failed" in json.dumps(fake.requests[-1]["body"])
    values = graph.get_state(config).values
    conclusion = values["conclusion"]
    line = next(i for i, text in enumerate(REWARD_BROKEN.splitlines(), 1) if "anwser" in text)
    assert conclusion == (
        "stopped: the generated code failed its check 2 times; the last failure, at step import: "
        f"KeyError: 'anwser' (reward.py line {line})"
    )
    assert "\n" not in conclusion and store.runs() == []
    assert store.get_study(values["study_id"]).status is StudyStatus.abandoned
    (last,) = [e for e in store.events(study_id=values["study_id"]) if e.level == "error"]
    assert "Traceback (most recent call last):" in last.message  # the full output is kept


@pytest.mark.slow
def test_llm_written_code_for_a_new_task_trains_end_to_end(
    tmp_path: Path, store: Store, trainable_server: Any
) -> None:
    fake = FakeLLMServer(
        canned={"PlanDraft": PLAN, "GeneratedCode": [_code(REWARD_BROKEN), _code(REWARD)]}
    ).start()
    live = trainable_server
    step_before = live.runtime.step
    try:
        ctx = _context(tmp_path, store, fake, "openai", server_url=live.url, hang_after_s=120.0, poll_s=0.5)
        graph = build_graph(open_checkpointer(tmp_path / "checkpoints.db"))
        config = {"configurable": {"thread_id": "t-repair"}}
        graph.invoke(
            {"request": "train letter counting", "mode": "vibe"}, config, context=ctx, durability="sync"
        )
    finally:
        fake.stop()
    values = graph.get_state(config).values
    study_id = values["study_id"]
    runs = store.study_runs(study_id)
    assert [r.name for r in runs] == ["smoke", "train-s0"]
    assert all(r.status is RunStatus.finished for r in runs), [(r.name, r.status, r.error) for r in runs]
    assert live.runtime.step >= step_before + 2  # the policy was updated twice on the LLM's reward
    train = values["outcomes"][-1]
    assert train.steps >= step_before + 2 and train.episodes >= 2 and train.curve
    assert train.parts.get("correct") is not None  # the LLM's reward part reached the report's data
    assert store.metric_history(runs[-1].id, "reward_mean")
    assert train.eval is not None and train.eval.episodes == 4  # held-out: 2 tasks × 2 attempts
    assert store.get_study(study_id).status is StudyStatus.concluded
    assert Path(values["report"]).exists()
