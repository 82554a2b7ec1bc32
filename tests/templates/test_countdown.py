"""Countdown template: solvable seeded puzzles and the expression reward."""

from collections import Counter
from fractions import Fraction

import pytest

from templates.countdown import data
from templates.countdown.reward import InvalidExpression, evaluate, extract_expression, reward, self_check


@pytest.mark.parametrize(("n_numbers", "max_number"), [(2, 10), (3, 20), (4, 100), (6, 9)])
def test_every_puzzle_is_solved_by_its_solution(n_numbers, max_number):
    for task in data.build(n_numbers=n_numbers, max_number=max_number, n_tasks=40, seed=1):
        value, used = evaluate(task["solution"])
        assert value == task["target"] > 0
        assert Counter(used) == Counter(task["numbers"])
        assert all(1 <= n <= max_number for n in task["numbers"])


def test_puzzles_are_seeded_by_index():
    full = data.build(n_tasks=12, seed=5)
    assert data.make_task(11, seed=5) == full[11]
    assert len({t["id"] for t in full}) == 12
    with pytest.raises(ValueError):
        data.make_task(0, n_numbers=1)


def test_evaluate_is_exact_and_refuses_code():
    assert evaluate("(6 / 4) * 2") == (Fraction(3), [6, 4, 2])
    for bad in ["2 ** 10", "-3 + 5", "abs(3)", "x + 1", "1 / 0", "3.5 + 1", "[1, 2]", "1 +", "1" * 201]:
        with pytest.raises(InvalidExpression):
            evaluate(bad)


def test_extract_expression():
    assert extract_expression("<answer> 3 × 8 = 24 </answer>") == "3 * 8"
    assert extract_expression("<answer>1+2</answer> then <answer>3+4</answer>") == "3+4"
    assert extract_expression(r"\boxed{2 \times 5}") == "2 * 5"
    assert extract_expression("<think><answer>1+2</answer></think>") is None
    assert extract_expression("<answer></answer>") is None
    assert extract_expression("<answer>1+2</answer>" + " " * 10_000) is None


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer>(3 + 5) * 2</answer>", 1.0),
        ("<answer>2 * (5 + 3) = 16</answer>", 1.0),
        ("<answer>3 * 5 + 2</answer>", 0.1),  # valid, wrong value: format reward
        ("<answer>16</answer>", 0.0),  # the target itself
        ("<answer>(3 + 5) * 2 * 1</answer>", 0.0),  # a number not given
        ("<answer>(3 + 3) * 2</answer>", 0.0),  # a number reused
        ("<answer>3 + 5</answer>", 0.0),  # a number unused
        ("(3 + 5) * 2", 0.0),  # no answer tag
        ("<answer>(3 + 5) * 2</answer", 0.0),
        ("", 0.0),
    ],
)
def test_reward_tricky_outputs(completion, expected):
    assert reward(completion, [2, 3, 5], 16) == pytest.approx(expected)


def test_reward_options():
    assert reward("<answer>3 + 5</answer>", [2, 3, 5], 8, use_all=False) == 1.0
    assert reward("<answer>3 + 3</answer>", [2, 3, 5], 6, use_all=False) == 0.0
    assert reward("<answer>3 * 5 + 2</answer>", [2, 3, 5], 16, format_reward=0.0) == 0.0


def test_self_check_passes():
    assert self_check(data.build(n_tasks=20)) == []
