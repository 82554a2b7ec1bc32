"""Token-exact tracking: call records, prompt rendering with token splicing, prefix merging.

See docs/ARCHITECTURE.md §Call record, §Sample, §One request's path (token splicing).

Public front::

    parse_messages(messages) -> list[ChatMessage]                                  # messages.py
    PromptRenderer(tokenizer).render(messages, tools, history) -> RenderedPrompt   # render.py
    parse_tool_calls(text) -> (content, tool_calls)                                # toolcalls.py
    build_samples(episode_id, calls, weighting, merge=, decode=) -> (samples, MergeStats)  # merge.py
"""

from swarm.tracking.chat_templates import CHATML_TOOLS_TEMPLATE, resolve_chat_template
from swarm.tracking.errors import MergeError, PromptError
from swarm.tracking.merge import (
    LossWeighting,
    MergeMode,
    MergeStats,
    PrefixBreak,
    aggregate_stats,
    build_samples,
    call_sequences,
    token_loss_weights,
)
from swarm.tracking.messages import ChatMessage, parse_messages
from swarm.tracking.records import CallRecord, FinishReason, Sample
from swarm.tracking.render import PromptRenderer, RenderedPrompt, to_template_messages
from swarm.tracking.toolcalls import parse_tool_calls

__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "CallRecord",
    "ChatMessage",
    "FinishReason",
    "LossWeighting",
    "MergeError",
    "MergeMode",
    "MergeStats",
    "PrefixBreak",
    "PromptError",
    "PromptRenderer",
    "RenderedPrompt",
    "Sample",
    "aggregate_stats",
    "build_samples",
    "call_sequences",
    "parse_messages",
    "parse_tool_calls",
    "resolve_chat_template",
    "to_template_messages",
    "token_loss_weights",
]
