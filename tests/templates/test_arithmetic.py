"""Arithmetic template: seeded generator with levels, and the bare-number reward."""

import ast
import operator

import pytest

from templates.arithmetic import data
from templates.arithmetic.reward import reward, self_check

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _value(node):
    if isinstance(node, ast.Constant):
        return node.value
    return _OPS[type(node.op)](_value(node.left), _value(node.right))


@pytest.mark.parametrize("level", data.LEVELS)
def test_answers_are_the_value_of_the_question(level):
    for task in data.build(level=level, n_tasks=50, seed=3):
        expression = task["question"].removeprefix("What is ").removesuffix("?")
        assert str(_value(ast.parse(expression, mode="eval").body)) == task["answer"]
        assert task["level"] == level


def test_level_one_is_single_digit_addition():
    for task in data.build(level=1, n_tasks=200):
        a, b = task["question"].removeprefix("What is ").removesuffix("?").split(" + ")
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9


def test_tasks_are_seeded_by_index():
    full = data.build(level=3, n_tasks=20, seed=7)
    assert [data.make_task(i, 3, 7) for i in range(10, 20)] == full[10:]
    assert data.build(level=3, n_tasks=20, seed=8) != full
    assert len({t["id"] for t in full}) == 20


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="level"):
        data.make_task(0, level=6)
    with pytest.raises(ValueError, match="n_tasks"):
        data.build(n_tasks=0)


def test_cli_writes_jsonl(tmp_path):
    out = tmp_path / "t.jsonl"
    data.main(["--out", str(out), "--level", "2", "--n-tasks", "5"])
    assert len(out.read_text().splitlines()) == 5


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("7", 1.0),
        ("7.0", 1.0),
        (" The answer is 7.", 1.0),
        ("3 + 4 = 7", 1.0),
        ("\\boxed{7}", 1.0),
        ("7\n8\n9", 1.0),  # only the first line counts
        ("8", 0.0),
        ("7.5", 0.0),
        ("6 7 8", 0.0),
        ("7 or 8", 0.0),
        ("", 0.0),
        ("seven", 0.0),
        ("<think>7</think>", 0.0),
        ("\\boxed{7} \\boxed{8}", 0.0),
        ("\\boxed{x+1}", 0.0),
        ("7" + "!" * 500, 0.0),
    ],
)
def test_reward_tricky_outputs(completion, expected):
    assert reward(completion, "7") == expected


def test_self_check_passes_on_every_level():
    for level in data.LEVELS:
        assert self_check(data.build(level=level, n_tasks=10)) == []
