"""Tool calls in model output: parse ``<tool_call>`` blocks into OpenAI ``tool_calls``.

Format (Hermes / Qwen2.5 / SmolLM2 function calling): each call is a JSON object with ``name`` and
``arguments`` (an object) inside ``<tool_call>…</tool_call>`` tags. SmolLM2-Instruct was also trained
to emit a JSON *list* of such objects inside one block; both are accepted. The canonical rendering that
:data:`swarm.tracking.chat_templates.CHATML_TOOLS_TEMPLATE` produces (and that the model is asked to
imitate) is::

    <optional content>\\n<tool_call>\\n{"name": "add", "arguments": {"a": 1}}\\n</tool_call>

Parsing is total: malformed output is returned as plain content with no tool calls, never an exception,
so a weak policy's broken call reaches the agent as text (and the reward can punish it).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


def tool_call_id(text: str, position: int, salt: str = "") -> str:
    """Deterministic OpenAI tool-call id: the same completion text and salt always yield the same ids.

    Args:
        text: The full completion text the call was parsed from.
        position: 0-based position of the call within that completion.
        salt: Where the completion was made (the server passes episode id and call index), so that the
            same call made twice gets two ids an agent framework can tell apart.

    Returns:
        ``"call_"`` followed by 24 hex characters of ``sha256(salt, position, text)``.
    """
    digest = hashlib.sha256(f"{salt}\x00{position}\x00{text}".encode()).hexdigest()
    return f"call_{digest[:24]}"


def _parse_block(body: str) -> list[tuple[str, dict[str, Any]]] | None:
    """Parse one block body into ``(name, arguments)`` pairs, or ``None`` if it is malformed."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError:
        return None
    items = payload if isinstance(payload, list) else [payload]
    calls: list[tuple[str, dict[str, Any]]] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):  # some models emit the OpenAI wire form (a JSON string)
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        calls.append((item["name"], arguments))
    return calls if calls else None


def parse_tool_calls(text: str, salt: str = "") -> tuple[str | None, list[dict[str, Any]]]:
    """Split model output into message content and OpenAI-format tool calls.

    Args:
        text: Decoded completion text (special tokens and stop strings removed).
        salt: Makes the call ids unique to where the text was sampled (`tool_call_id`).

    Returns:
        ``(content, tool_calls)``. Without ``<tool_call>`` blocks: ``(text, [])``. With well-formed blocks:
        ``content`` is the text outside the blocks, whitespace-stripped (``None`` if empty), and
        ``tool_calls`` is ``[{"id", "type": "function", "function": {"name", "arguments": JSON string}}]``
        in order of appearance. If any block is malformed (bad JSON, no ``name``, non-object arguments,
        an unclosed tag): ``(text, [])``.
    """
    if TOOL_CALL_OPEN not in text:
        return text, []
    blocks = list(_BLOCK.finditer(text))
    outside = _BLOCK.sub("", text)
    if not blocks or TOOL_CALL_OPEN in outside or TOOL_CALL_CLOSE in outside:
        return text, []  # unclosed or stray tag
    parsed: list[tuple[str, dict[str, Any]]] = []
    for block in blocks:
        calls = _parse_block(block.group(1).strip())
        if calls is None:
            return text, []
        parsed.extend(calls)
    tool_calls = [
        {
            "id": tool_call_id(text, position, salt),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
        }
        for position, (name, arguments) in enumerate(parsed)
    ]
    content = outside.strip()
    return (content or None), tool_calls
