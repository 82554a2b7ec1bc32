"""The math agent with the Anthropic SDK (``anthropic.AsyncAnthropic``) and a calculator tool.

A tool loop as Claude-Code-style agents run it: the model may answer with ``tool_use`` blocks, the agent
evaluates each expression and sends ``tool_result`` blocks back, until the model answers in text (at
most ``MAX_TURNS`` calls). Every call goes to the server's ``/v1/messages`` and is recorded into the
episode; the turns of one episode merge into one training sample.

Workflow: ``swarm run examples/math_anthropic.py --server URL --dataset examples/data/math.jsonl``.
Script: ``python examples/math_anthropic.py --server URL --tasks 2``.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

import math_common

from swarm.client import LLM, Result

MAX_TURNS = 3
TOOLS = [
    {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression of integers with + - * / // % ** and parentheses.",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    }
]
_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, or ``error: ...`` (never raises: the model sees the error)."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(value(node.right)) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"unsupported: {type(node).__name__}")

    try:
        result = value(ast.parse(str(expression), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError, RecursionError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


async def run(task: dict[str, Any], llm: LLM) -> Result:
    """The tool loop, then the reward of the final text from :func:`math_common.score`."""
    client = llm.anthropic(max_retries=0)  # closed by the runner when the episode ends
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    tool_calls = 0
    for _ in range(MAX_TURNS):
        reply = await client.messages.create(
            model=llm.model,
            system=math_common.SYSTEM,
            messages=messages,
            tools=TOOLS,
            max_tokens=math_common.MAX_TOKENS,
            extra_body={"temperature": 1.0},  # recent SDKs take sampling options through extra_body
        )
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            break
        tool_calls += len(uses)
        messages.append({"role": "assistant", "content": reply.content})
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": u.id,
                        "content": calculate(u.input.get("expression", "")),
                    }
                    for u in uses
                ],
            }
        )
    text = "".join(block.text for block in reply.content if block.type == "text")
    result = math_common.score(text, task)
    result.metrics["tool_calls"] = float(tool_calls)
    return result


if __name__ == "__main__":
    math_common.main(run, __doc__ or "")
