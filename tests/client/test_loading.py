"""Workflow files and task sources: what loads, and the one-line errors for what does not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swarm.client import LLM, DatasetError, Result, TaskSet, WorkflowLoadError, load_workflow
from tests.client.conftest import write_jsonl, write_workflow

LLM_STUB = LLM(base_url="http://127.0.0.1:1/v1", api_key="sk-swarm-test", model="m")


def _call(workflow, task):  # type: ignore[no-untyped-def]
    return asyncio.run(workflow(task, LLM_STUB))


def test_function_workflow(tmp_path: Path) -> None:
    path = write_workflow(tmp_path, "async def run(task, llm):\n    return task['x'] * 2\n")
    assert _call(load_workflow(path), {"x": 3}) == 6


def test_class_workflow_and_explicit_name(tmp_path: Path) -> None:
    code = """
        from swarm.client import Result

        class Agent:
            def __init__(self):
                self.bonus = 0.5

            async def run(self, task, llm):
                return Result(reward=task["x"] + self.bonus, metrics={"m": 1.0})

        class Other:
            async def run(self, task, llm):
                return 0.0
    """
    path = write_workflow(tmp_path, code)
    with pytest.raises(WorkflowLoadError, match="several classes define run"):
        load_workflow(path)
    result = _call(load_workflow(f"{path}:Agent"), {"x": 1})
    assert isinstance(result, Result) and result.reward == 1.5


def test_edited_file_is_read_again(tmp_path: Path) -> None:
    path = write_workflow(tmp_path, "async def run(task, llm):\n    return 1.0\n")
    first = load_workflow(path)
    path.write_text("async def run(task, llm):\n    return 2.0\n")
    assert _call(first, {}) == 1.0
    assert _call(load_workflow(path), {}) == 2.0


def test_workflow_imports_its_neighbours(tmp_path: Path) -> None:
    (tmp_path / "helper_for_wf.py").write_text("BONUS = 7\n")
    path = write_workflow(
        tmp_path, "import helper_for_wf\nasync def run(task, llm):\n    return helper_for_wf.BONUS\n"
    )
    assert _call(load_workflow(path), {}) == 7


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("x = 1\n", "defines no 'async def run"),
        ("def run(task, llm):\n    return 1.0\n", "run must be 'async def run"),
        ("async def run(task):\n    return 1.0\n", "two arguments"),
        ("raise RuntimeError('broken at import')\n", "raised RuntimeError while importing: broken at import"),
        ("def oops(:\n", "raised SyntaxError"),
    ],
)
def test_bad_workflows(tmp_path: Path, code: str, message: str) -> None:
    path = write_workflow(tmp_path, code)
    with pytest.raises(WorkflowLoadError, match=message) as info:
        load_workflow(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_missing_workflow_file(tmp_path: Path) -> None:
    with pytest.raises(WorkflowLoadError, match="no such file"):
        load_workflow(tmp_path / "nope.py")
    with pytest.raises(WorkflowLoadError, match="defines no 'Agent'"):
        load_workflow(f"{write_workflow(tmp_path, 'async def run(t, l):' + chr(10) + '    return 0')}:Agent")


def test_jsonl_ids_and_indices(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": 17, "q": "a"}, {"q": "b"}])
    tasks = list(TaskSet(path))
    assert [(t.index, t.task_id) for t in tasks] == [(0, "17"), (1, "1")]
    assert len(TaskSet(path)) == 2


def test_bad_jsonl_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": 1}\n\n{"q": 2\n')
    with pytest.raises(DatasetError, match=r"d.jsonl:3: invalid JSON"):
        TaskSet(path)
    path.write_text('{"q": 1}\n[1, 2]\n')
    with pytest.raises(DatasetError, match=r"d.jsonl:2: a task must be a JSON object, got list"):
        TaskSet(path)
    with pytest.raises(DatasetError, match="no such file"):
        TaskSet(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="holds no tasks"):
        TaskSet(tmp_path / "empty.jsonl")


def test_generator_sources(tmp_path: Path) -> None:
    gen = tmp_path / "gen.py"
    gen.write_text("def tasks():\n    for i in range(3):\n        yield {'id': f't{i}', 'x': i}\n")
    source = TaskSet(f"{gen}:tasks")
    assert [t.task_id for t in source] == ["t0", "t1", "t2"]
    assert [t.task_id for t in source] == ["t0", "t1", "t2"]  # called again for each epoch
    assert not source.sized
    with pytest.raises(DatasetError, match="defines no function 'nope'"):
        TaskSet(f"{gen}:nope")
    with pytest.raises(DatasetError, match=r"FILE\.py:FUNCTION"):
        TaskSet(gen)
    assert [t.data["x"] for t in TaskSet(lambda: ({"x": i} for i in range(2)))] == [0, 1]


def test_saved_hf_dataset(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(
        [{"id": "a", "question": "1+1", "answer": "2"}, {"id": "b", "question": "2+2", "answer": "4"}]
    )
    ds.save_to_disk(str(tmp_path / "single"))
    assert [t.task_id for t in TaskSet(tmp_path / "single")] == ["a", "b"]
    datasets.DatasetDict({"train": ds, "test": ds.select([1])}).save_to_disk(str(tmp_path / "dict"))
    assert [t.task_id for t in TaskSet(tmp_path / "dict")] == ["a", "b"]
    assert [t.task_id for t in TaskSet(tmp_path / "dict", split="test")] == ["b"]
    (tmp_path / "not-a-dataset").mkdir()
    with pytest.raises(DatasetError, match="not a saved Hugging Face dataset"):
        TaskSet(tmp_path / "not-a-dataset")
