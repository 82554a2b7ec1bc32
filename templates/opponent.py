"""The opponent endpoint of multi-agent templates: an OpenAI client for the untrained players.

Multi-agent templates (who-is-the-spy, werewolves) let the untrained seats call another OpenAI-compatible
endpoint (a frozen copy of the model, a stronger model, another server) named by three workflow
parameters: ``opponent_base_url``, ``opponent_model`` and ``opponent_api_key_env`` (the NAME of an
environment variable holding the key, so no secret is written into a rendered workflow).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def opponent_client(params: Mapping[str, Any]) -> Any:
    """An ``openai.AsyncOpenAI`` client for ``params["opponent_base_url"]``, keyed from the environment
    variable ``params["opponent_api_key_env"]`` (``"EMPTY"`` when it names none or is unset)."""
    from openai import AsyncOpenAI

    env = params["opponent_api_key_env"]
    key = os.environ.get(env, "") if env else ""
    return AsyncOpenAI(base_url=params["opponent_base_url"], api_key=key or "EMPTY")
