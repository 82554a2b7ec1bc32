"""The workflow contract: what a user's agent file defines and what it is given.

A workflow is a Python file defining ``async def run(task, llm) -> float | Result`` (or a class with
such an ``async def run`` method). ``task`` is one dataset record (a ``dict``); ``llm`` says where the
trainable model is served for this episode. The workflow may use any OpenAI-compatible client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LLM:
    """Connection details of one episode's model endpoint (OpenAI-compatible).

    The ``api_key`` is the episode's secret: every call made with it is recorded into that episode.
    """

    base_url: str
    """OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``."""
    api_key: str
    """Episode API key (secret; never log it)."""
    model: str
    """Model name to pass as ``model``."""

    def openai(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client bound to this episode (kwargs go to the constructor)."""
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def openai_sync(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` (blocking) client bound to this episode."""
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def __repr__(self) -> str:  # keep the secret out of logs and tracebacks
        return f"LLM(base_url={self.base_url!r}, model={self.model!r}, api_key='***')"


@dataclass
class Result:
    """What a workflow may return instead of a bare float reward."""

    reward: float
    """Scalar episode reward (used for the GRPO group statistics)."""
    agent_rewards: dict[str, float] = field(default_factory=dict)
    """Optional per-agent rewards for multi-agent episodes (agent name → reward)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Optional numeric metrics reported with the episode (e.g. ``correct``, ``format_ok``)."""
