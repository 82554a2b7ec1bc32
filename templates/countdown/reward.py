"""Countdown reward: an expression over the given numbers that equals the target.

Scoring (as in TinyZero's countdown reward: 1 for a correct equation, a small format score for a
well-formed wrong one, 0 otherwise):

* The answer is the content of the last ``<answer>...</answer>`` outside ``<think>`` blocks (else the
  last ``\\boxed{}``). Text after an ``=`` is dropped (``3 * 8 = 24`` → ``3 * 8``); ``×``/``÷`` are read
  as ``*``/``/``.
* The expression is parsed with :mod:`ast`, never evaluated as code: only integer literals, ``+ - * /``
  and parentheses are allowed (no unary minus, powers, names or calls), at most 200 characters, and it
  is computed exactly with :class:`fractions.Fraction` (division by zero is invalid).
* It must use exactly the given numbers (as a multiset; ``use_all=False`` allows a sub-multiset), so
  writing the target itself, or reusing a number, does not count.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from templates.answers import boxed_contents, strip_thinking

MAX_EXPRESSION_CHARS = 200
MAX_COMPLETION_CHARS = 10_000
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


class InvalidExpression(ValueError):
    """The answer is not an allowed arithmetic expression."""


def extract_expression(completion: str) -> str | None:
    """The answer expression of a completion, or ``None`` when there is none (see module docstring)."""
    if len(completion) > MAX_COMPLETION_CHARS:
        return None
    visible = strip_thinking(completion)
    tagged = _ANSWER_TAG.findall(visible)
    candidates = tagged or boxed_contents(visible)
    if not candidates:
        return None
    expression = (
        candidates[-1].replace("×", "*").replace("÷", "/").replace("\\times", "*").replace("\\div", "/")
    )
    expression = expression.split("=")[0].strip()
    return expression or None


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of ``expression`` and the integer literals it uses.

    Raises:
        InvalidExpression: Syntax outside integers, ``+ - * /`` and parentheses; too long; or division
            by zero.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise InvalidExpression(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise InvalidExpression(f"not an expression: {expression!r}") from exc
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise InvalidExpression("division by zero")
            return left / right
        raise InvalidExpression(f"{type(node).__name__} is not allowed")

    return walk(tree.body), used


def reward(
    completion: str,
    numbers: Sequence[int],
    target: int,
    *,
    format_reward: float = 0.1,
    use_all: bool = True,
) -> float:
    """Score one countdown answer.

    Args:
        completion: Model output.
        numbers: The given numbers (a multiset).
        target: The number to reach.
        format_reward: Reward for a valid expression over the numbers that misses the target.
        use_all: Require every number exactly once (else each at most once).

    Returns:
        ``1.0`` (correct), ``format_reward`` (valid but wrong value) or ``0.0``.
    """
    expression = extract_expression(completion)
    if expression is None:
        return 0.0
    try:
        value, used = evaluate(expression)
    except InvalidExpression:
        return 0.0
    given, counted = Counter(numbers), Counter(used)
    if use_all and counted != given:
        return 0.0
    if not use_all and any(counted[n] > given[n] for n in counted):
        return 0.0
    return 1.0 if value == target else format_reward


def gold_completion(task: dict[str, Any]) -> str:
    """A reply that must earn full reward on ``task``."""
    return f"<answer>{task['solution']}</answer>"


def self_check(tasks: list[dict[str, Any]]) -> list[str]:
    """Gold answers earn 1; garbage and gaming answers earn 0; returns failure messages."""
    failures = []
    for task in tasks:
        numbers, target = task["numbers"], task["target"]
        if reward(gold_completion(task), numbers, target) != 1.0:
            failures.append(f"{task['id']}: gold answer earned less than 1")
        garbage = [
            "",
            "I cannot solve this.",
            f"<answer>{target}</answer>",
            f"<think><answer>{task['solution']}</answer></think>",
            f"<answer>{' + '.join(map(str, numbers))} + {' + '.join(map(str, numbers))}</answer>",
            f"<answer>__import__('os').system('echo {target}')</answer>",
            f"<answer>{numbers[0]} ** {target}</answer>",
            "<answer>" + "1 + " * 100 + "1</answer>",
            f"{task['solution']}",
        ]
        for text in garbage:
            if reward(text, numbers, target) != 0.0:
                failures.append(f"{task['id']}: garbage {text[:40]!r} earned reward")
    return failures
