"""The workflow contract: what a user's agent file defines and what it is given.

A workflow is a Python file defining ``async def run(task, llm) -> float | Result`` (or a class with
such an ``async def run`` method). ``task`` is one dataset record (a ``dict``); ``llm`` says where the
trainable model is served for this episode. The workflow may use any OpenAI- or Anthropic-compatible client.
"""

from __future__ import annotations

import inspect
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
    _opened: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)

    def openai(self, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client bound to this episode (kwargs go to the constructor).

        The runner closes it when the episode ends (`aclose`); do not keep it for later episodes,
        whose calls need their own key anyway.
        """
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)
        self._opened.append(client)
        return client

    def openai_sync(self, **kwargs: Any) -> Any:
        """An ``openai.OpenAI`` (blocking) client bound to this episode (closed like `openai`'s)."""
        from openai import OpenAI

        client = OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)
        self._opened.append(client)
        return client

    def anthropic(self, **kwargs: Any) -> Any:
        """An ``anthropic.AsyncAnthropic`` client bound to this episode (the server's ``/v1/messages``;
        kwargs go to the constructor; closed like `openai`'s)."""
        from anthropic import AsyncAnthropic

        client = AsyncAnthropic(base_url=self.base_url.removesuffix("/v1"), api_key=self.api_key, **kwargs)
        self._opened.append(client)
        return client

    async def aclose(self) -> None:
        """Close the clients `openai`, `openai_sync` and `anthropic` made, on the event loop that used them.

        Left to the garbage collector, an async client's connections are closed by a task scheduled
        on whatever loop runs at that moment, possibly another ``asyncio.run``'s.
        """
        while self._opened:
            closed = self._opened.pop().close()
            if inspect.isawaitable(closed):
                await closed

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
