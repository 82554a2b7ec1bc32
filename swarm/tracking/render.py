"""Prompt rendering with token splicing (drift repair), for any chat template.

The server renders each chat request itself with the model's chat template and tokenizes the text. A
naive re-tokenization of the history drifts from what the model actually produced: the engine may have
sampled a non-canonical split (``"he" + "llo"`` where the tokenizer would give ``"hello"``), so the new
prompt would no longer start with the earlier call's ``prompt_ids + completion_ids`` and the episode
could not be merged (and the model would be trained on tokens it never saw).

**Splicing rule** (template-agnostic: span boundaries come from rendering, never from hard-coded
special-token strings). Let ``T = template(messages, tools, add_generation_prompt=True)``. For each
assistant message ``j`` that repeats an earlier completion ``C`` of the episode (``C.text == content`` and
the same tool calls, arguments compared as parsed JSON):

1. ``a = len(template(messages[:j], tools, add_generation_prompt=True))``, used only if that text is a
   prefix of ``T`` (the span of message ``j`` starts right after the generation prompt ``C`` saw);
2. ``D = decode(C.completion_ids)`` with special tokens kept;
3. if ``T[a:]`` starts with ``D``, the characters ``[a, a + len(D))`` are replaced by ``C.completion_ids``
   (a *splice*); otherwise the template rendered the message differently (stripped ``<think>``,
   re-formatted tool call, stop string removed, other end token): nothing is replaced — the text the
   template produced is never changed — and a *splice mismatch* is counted (the merger will then see
   a prefix break).

The text between splices is tokenized segment by segment (``add_special_tokens=False``: the template
already writes BOS where it wants one). Call ``A`` (prompt ``template(messages[:j])``) was tokenized by
the same segmentation up to ``a``, so the new prompt ids start with ``A.prompt_ids + A.completion_ids``
by construction whenever ``A``'s completion was spliced. Among several matching calls the one whose
``prompt_ids`` equal the ids built so far wins (that is the call that produced this span), then the most
recent call of the same agent, then the most recent call.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from pydantic import BaseModel, Field

from swarm.errors import ConfigError
from swarm.tracking.chat_templates import resolve_chat_template, supports_tools
from swarm.tracking.errors import PromptError
from swarm.tracking.messages import ChatMessage, parse_messages
from swarm.tracking.records import CallRecord

if TYPE_CHECKING:  # transformers is heavy to import; only its type is needed here
    from transformers import PreTrainedTokenizerBase

V = TypeVar("V")

_PASSTHROUGH_KEYS = ("name", "tool_call_id", "reasoning_content")


class RenderedPrompt(BaseModel):
    """A chat request rendered to the exact prompt ids the engine will consume."""

    prompt_ids: list[int]
    """Prompt token ids, shape (P,), with spliced spans taken verbatim from earlier completions."""
    text: str
    """The rendered prompt text (what ``prompt_ids`` decode to)."""
    splices: int
    """Assistant spans whose ids were reused from earlier completions."""
    splice_mismatches: int
    """Assistant messages that repeated an earlier completion but rendered to different text."""
    spliced_calls: list[int] = Field(default_factory=list)
    """Index of the earlier call whose completion ids were reused, per splice, in prompt order."""


def _tool_call_key(tool_call: Any) -> tuple[str, str]:
    """``(name, canonical JSON of arguments)`` of an OpenAI or template-format tool call."""
    function = tool_call.get("function", tool_call) if isinstance(tool_call, dict) else {}
    name = function.get("name", "") if isinstance(function, dict) else ""
    arguments = function.get("arguments", {}) if isinstance(function, dict) else {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return str(name), arguments
    return str(name), json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _template_message(message: ChatMessage) -> dict[str, Any]:
    """One validated message in the form HF chat templates expect."""
    entry: dict[str, Any] = {
        "role": "system" if message.role == "developer" else message.role,
        "content": message.text(),
    }
    if message.role == "assistant" and message.tool_calls:
        entry["tool_calls"] = [
            {
                "id": tool_call.id,
                "type": "function",
                "function": {
                    "name": tool_call.function.name,
                    "arguments": tool_call.function.parsed_arguments(),
                },
            }
            for tool_call in message.tool_calls
        ]
    for key in _PASSTHROUGH_KEYS:
        value = getattr(message, key)
        if value is not None:
            entry[key] = value
    return entry


def to_template_messages(messages: Sequence[ChatMessage | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Convert OpenAI chat messages into the dicts Hugging Face chat templates expect.

    Text parts are joined with ``"\\n"``, ``None`` content becomes ``""``, tool-call arguments are parsed
    from JSON strings into dicts and ``developer`` becomes ``system``. Validated `ChatMessage` models are
    taken as they are; plain dicts are validated first (`parse_messages`).

    Raises:
        PromptError: not a non-empty list of messages, an unknown role, non-text content or bad arguments.
    """
    return [_template_message(message) for message in parse_messages(messages)]


class _BoundedCache(Generic[V]):
    """A thread-safe least-recently-used map from text to ``V`` holding at most ``max_chars`` characters
    (each entry's size is given when it is put; an entry larger than the bound is not kept)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self._entries: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: str, value: V, chars: int) -> None:
        if chars > self.max_chars:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (value, chars)
            self.chars += chars
            while self.chars > self.max_chars:
                self.chars -= self._entries.popitem(last=False)[1][1]


class PromptRenderer:
    """Render chat requests to prompt ids with a chat template, splicing earlier completion ids.

    Two least-recently-used caches, each bounded by characters, keep the hot path from doing the same
    work twice; a hit gives exactly what a fresh computation would:

    - *segment ids*: the tokenizer is a pure function of the text. Each call of an episode re-renders
      the whole history, and the segment before its first splice is the previous call's prompt text, the
      one between two splices the previous call's last segment: a call tokenizes only what is new since
      the previous one, and the calls of a GRPO group that share their prompt tokenize it once;
    - *rendered text* per (messages, tools), keyed by their JSON: the prefix renders of the splicing
      rule are the previous calls' prompts. Off for templates that call ``strftime_now`` (the text
      depends on the date) and for messages that are not plain JSON.

    Args:
        tokenizer: The model's tokenizer.
        chat_template: Jinja template overriding the tokenizer's (see
            :func:`swarm.tracking.chat_templates.resolve_chat_template` for the default choice).
        template_kwargs: Extra variables passed to the template (e.g. ``{"enable_thinking": False}``).
        cache_chars: Characters each cache keeps at most (0: no caching).

    Raises:
        ConfigError: neither ``chat_template`` nor the tokenizer provides a template.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        cache_chars: int = 1 << 24,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = resolve_chat_template(tokenizer, chat_template)
        if self.chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the tokenizer has no chat template; pass chat_template=")
        self.template_kwargs = dict(template_kwargs or {})
        self._encoded: _BoundedCache[tuple[int, ...]] = _BoundedCache(cache_chars)
        self._rendered: _BoundedCache[str] = _BoundedCache(cache_chars)
        template = self.chat_template or getattr(tokenizer, "chat_template", None)
        self._render_cached = "strftime_now" not in str(template)

    def _render_text(self, conversation: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        key = None
        if self._render_cached:
            try:
                key = json.dumps([conversation, tools], ensure_ascii=False, separators=(",", ":"))
            except (TypeError, ValueError):  # not plain JSON: render without the cache
                key = None
            cached = None if key is None else self._rendered.get(key)
            if cached is not None:
                return cached
        text = self._render_uncached(conversation, tools)
        if key is not None:
            self._rendered.put(key, text, len(key) + len(text))
        return text

    def _render_uncached(self, conversation: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                conversation,
                tools=cast(Any, tools or None),
                chat_template=self.chat_template,
                add_generation_prompt=True,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as exc:  # jinja2 TemplateError, TypeError on None + str, template raise_exception
            raise PromptError(
                f"the chat template cannot render these messages: {exc}", param="messages"
            ) from exc
        if not isinstance(text, str):
            raise PromptError("the chat template did not render to text", param="messages")
        return text

    def _encode(self, text: str) -> list[int]:
        if not text:
            return []
        ids = self._encoded.get(text)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            self._encoded.put(text, ids, len(text))
        return list(ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return str(
            self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        )

    def render(
        self,
        messages: Sequence[ChatMessage | Mapping[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        history: Sequence[CallRecord] = (),
        agent: str | None = None,
    ) -> RenderedPrompt:
        """Render a chat request to prompt ids (``add_generation_prompt=True``), splicing earlier completions.

        Args:
            messages: Chat messages, validated `ChatMessage` models (the server's) or plain OpenAI dicts
                (role, content as ``str`` / list of text parts / ``None``, ``tool_calls`` with
                JSON-string arguments, ``tool_call_id``, ``name``), which are validated first.
            tools: OpenAI tool definitions (``[{"type": "function", "function": {...}}]``), or ``None``.
            history: The episode's earlier calls (any agent). A call matches an assistant message when
                ``CallRecord.text`` equals the message content (``None`` as ``""``) and its
                ``CallRecord.tool_calls`` equal the message's (name and parsed arguments).
            agent: The requesting agent, preferred among equally good matching calls.

        Returns:
            The prompt ids (shape (P,)), rendered text and splice counts.

        Raises:
            PromptError: malformed messages, tools the template cannot render, or a template failure.
        """
        conversation = to_template_messages(messages)
        uses_tools = bool(tools) or any("tool_calls" in m or m["role"] == "tool" for m in conversation)
        if uses_tools and self.chat_template is not None and not supports_tools(self.chat_template):
            raise PromptError("this model's chat template cannot render tools or tool calls", param="tools")
        if tools is not None and not isinstance(tools, list):
            raise PromptError("tools must be a list", param="tools")
        text = self._render_text(conversation, tools)

        ids: list[int] = []  # prompt ids built so far, covering text[:cursor]
        cursor = 0
        splices = mismatches = 0
        spliced_calls: list[int] = []
        for j, message in enumerate(conversation):
            if message["role"] != "assistant" or j == 0:
                continue
            candidates = self._matching_calls(message, history)
            if not candidates:
                continue
            try:
                start = len(prefix := self._render_text(conversation[:j], tools))
            except PromptError:
                mismatches += 1
                continue
            if start < cursor or not text.startswith(prefix):
                mismatches += 1
                continue
            ids_to_start = ids + self._encode(text[cursor:start])
            chosen = self._choose(candidates, text, start, ids_to_start, agent)
            if chosen is None:
                mismatches += 1
                continue
            call, span = chosen
            ids = ids_to_start + list(call.completion_ids)
            cursor = start + len(span)
            splices += 1
            spliced_calls.append(call.index)
        ids += self._encode(text[cursor:])
        if not ids:
            raise PromptError("the rendered prompt is empty", param="messages")
        return RenderedPrompt(
            prompt_ids=ids,
            text=text,
            splices=splices,
            splice_mismatches=mismatches,
            spliced_calls=spliced_calls,
        )

    @staticmethod
    def _matching_calls(message: dict[str, Any], history: Sequence[CallRecord]) -> list[CallRecord]:
        """Earlier calls whose returned content and tool calls equal this assistant message's."""
        calls_key = [_tool_call_key(tc) for tc in message.get("tool_calls", [])]
        return [
            call
            for call in history
            if call.completion_ids
            and call.text == message["content"]
            and [_tool_call_key(tc) for tc in call.tool_calls] == calls_key
        ]

    def _choose(
        self,
        candidates: list[CallRecord],
        text: str,
        start: int,
        ids_to_start: list[int],
        agent: str | None,
    ) -> tuple[CallRecord, str] | None:
        """The best candidate whose decoded completion is rendered verbatim at ``text[start:]``."""
        exact = [
            (call, span)
            for call in candidates
            if (span := self._decode(call.completion_ids)) and text.startswith(span, start)
        ]
        if not exact:
            return None

        def rank(item: tuple[CallRecord, str]) -> tuple[bool, bool, int]:
            call = item[0]
            return (call.prompt_ids == ids_to_start, agent is not None and call.agent == agent, call.index)

        return max(exact, key=rank)
