"""One chat request of an episode as the server records it, apart from any wire format.

A request is checked and rendered into a `PreparedCall`; the engine samples it; each sampled choice
becomes one `CallRecord` of the episode. `swarm.server.chat_service.ChatService` does this for the chat
routes (its module also holds the request's sampling rules, ``max_tokens``'s among them) and answers with a `ChatResult` (the records, the engine's completions and what a response needs);
`swarm.server.openai_format` and `swarm.server.anthropic_format` turn that into their wire formats.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from swarm.engine.base import Completion, SamplingParams
from swarm.errors import RequestError, quoted
from swarm.protocol import ChatCompletionRequest
from swarm.tracking.records import CallRecord, FinishReason
from swarm.tracking.render import RenderedPrompt
from swarm.tracking.toolcalls import parse_tool_calls


@dataclass(frozen=True)
class PreparedCall:
    """A checked, rendered chat request (`swarm.server.chat_service.ChatService.prepare`), ready to be sampled."""

    arrived: float
    """Unix time (s) the request arrived."""
    agent: str
    params: SamplingParams
    rendered: RenderedPrompt
    parse_tools: bool
    """Whether the completion text is parsed for tool calls (the request has tools and allows them)."""


@dataclass(frozen=True)
class ChatResult:
    """One answered chat request: what was recorded and what a response is built from."""

    records: list[CallRecord]
    """One call record per choice, in choice order (already appended to the episode)."""
    completions: list[Completion]
    """The engine's completions, aligned with ``records`` (they carry the top logprobs)."""
    prompt_tokens: int
    """Length of the prompt every choice was sampled from."""
    agent: str
    policy_version: int
    """The server's policy version (completed trainer steps) when the answer was complete."""
    created_at: float
    """Unix time (s) the answer was complete."""
    arrived: float = 0.0
    """Unix time (s) the request arrived (`PreparedCall.arrived`)."""
    engine_s: float = 0.0
    """Wall seconds from handing the prompt to the engine until its completions were back on the
    server's event loop (queueing in the engine included)."""

    def server_timing(self, now: float) -> str:
        """A ``Server-Timing`` header value (W3C Server Timing; durations in ms): ``engine`` as in
        :attr:`engine_s`, ``server`` the rest of the request's time in the handler until ``now``
        (validation, rendering, recording, building the answer) and ``total``."""
        total = max(0.0, now - self.arrived)
        return (
            f"engine;dur={1e3 * self.engine_s:.1f}, server;dur={1e3 * max(0.0, total - self.engine_s):.1f}, "
            f"total;dur={1e3 * total:.1f}"
        )


def agent_for(request: ChatCompletionRequest, model_name: str) -> str:
    """The agent name of a request: ``model="<served>:<agent>"`` or the ``user`` field.

    Raises:
        RequestError: the model name is not served here (404 ``model_not_found``).
    """
    model = request.model
    if model == model_name:
        return request.user or "default"
    prefix = model_name + ":"
    if model.startswith(prefix) and len(model) > len(prefix):
        return model[len(prefix) :]
    raise RequestError(
        f"model {quoted(model)} is not served here; use {model_name!r} (or '{prefix}<agent>')",
        status_code=404,
        param="model",
    )


def record_call(
    prepared: PreparedCall,
    completion: Completion,
    *,
    index: int,
    trainable: bool,
    salt: str,
    queued: float,
) -> CallRecord:
    """The record of one sampled choice.

    Args:
        prepared: the request the choice answers.
        completion: the engine's completion of that choice.
        index: position of the call in its episode.
        trainable: whether the agent's calls are trained in this episode.
        salt: makes the ids of parsed tool calls unique (the server passes ``"<episode id>:<index>"``).
        queued: Unix time (s) the request was handed to the engine.
    """
    text = completion.text
    tool_calls: list[dict[str, Any]] = []
    finish = completion.finish_reason
    if prepared.parse_tools:
        content, tool_calls = parse_tool_calls(text, salt=salt)
        if tool_calls:
            text = content or ""
            finish = FinishReason.TOOL_CALLS
    params = prepared.params
    sampling = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "stop": list(params.stop),
        "seed": params.seed,
        "n": params.n,
    }
    return CallRecord(
        index=index,
        agent=prepared.agent,
        trainable=trainable,
        prompt_ids=prepared.rendered.prompt_ids,
        completion_ids=completion.ids,
        logprobs=completion.logprobs,
        finish_reason=finish,
        text=text,
        tool_calls=tool_calls,
        sampling=sampling,
        splices=prepared.rendered.splices,
        splice_mismatches=prepared.rendered.splice_mismatches,
        policy_version=completion.policy_version,
        tenant=params.adapter,
        created_at=prepared.arrived,
        queue_s=max(0.0, time.time() - queued - completion.generate_s),
        generate_s=completion.generate_s,
    )
