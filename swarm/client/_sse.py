"""Reading a server-sent-events body (WHATWG HTML §9.2, "event stream" format) into its JSON payloads."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["parse_sse"]


def parse_sse(text: str) -> list[dict[str, Any]]:
    """JSON ``data`` payloads of a server-sent-events body, in order.

    Multi-line ``data`` fields are joined with newlines; comments (``: keep-alive``), ``event``/``id``
    fields and events whose data is not a JSON object are skipped.

    Args:
        text: The whole body of a finished event stream.

    Returns:
        One dict per event whose ``data`` is a JSON object.
    """
    payloads: list[dict[str, Any]] = []
    data: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line == "":
            if data:
                try:
                    value = json.loads("\n".join(data))
                except ValueError:
                    value = None
                if isinstance(value, dict):
                    payloads.append(value)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return payloads
