"""The Anthropic Messages wire format (``POST /v1/messages``), mapped onto the recorded chat call.

Pure: request models, the mapping of a Messages request onto the internal `ChatCompletionRequest`
(so rendering, splicing, recording and merging are exactly those of chat completions), and the
``message`` object and stream events built from a `ChatResult`. No runtime, engine or I/O.

Mapping (https://docs.anthropic.com/en/api/messages):

- ``system`` (a string or text blocks, joined with ``"\\n"``) → a system message;
- a user message's text blocks → a user message; each ``tool_result`` block → a tool message
  (``tool_call_id`` = ``tool_use_id``), in block order;
- an assistant message's text blocks → its content, its ``tool_use`` blocks → tool calls (``input``
  as JSON arguments), so an assistant turn the server produced matches its call record and is spliced
  token-exactly on the next request;
- ``tools`` → function tools (``input_schema`` as ``parameters``); ``tool_choice`` ``auto``/``none``;
  ``stop_sequences`` → stop strings; ``metadata.user_id`` names the agent (like OpenAI's ``user``).

Everything else is refused with an Anthropic error naming the field (``top_k``, ``thinking``, forced
tool choices, image/document blocks, unknown fields): the server never ignores what it cannot honour.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.json_schema import SkipJsonSchema

from swarm.errors import RequestError
from swarm.protocol import ChatCompletionRequest, ChatMessage, FunctionCall, ToolCall, UnicodeBody, only_type
from swarm.server.chat import ChatResult
from swarm.server.detokenizer import Detokenizer
from swarm.server.openai_format import text_pieces
from swarm.tracking.records import CallRecord, FinishReason

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]

_BLOCK_TYPES = {"text", "tool_use", "tool_result"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# -- request -------------------------------------------------------------------------------------------------
class TextBlockParam(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    """Accepted and ignored (a prompt-cache hint; the engine has no prompt cache to address)."""


class ToolUseBlockParam(_Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlockParam(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlockParam] = ""
    is_error: bool = False
    """Accepted; the result's text is rendered as it is either way."""
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "\n".join(b.text for b in self.content)


ContentBlockParam = TextBlockParam | ToolUseBlockParam | ToolResultBlockParam


class MessageParam(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlockParam]

    @field_validator("content", mode="before")
    @classmethod
    def _supported_blocks(cls, v: Any) -> Any:
        if isinstance(v, list):
            for i, block in enumerate(v):
                kind = block.get("type") if isinstance(block, Mapping) else None
                if not isinstance(kind, str) or kind not in _BLOCK_TYPES:  # {} is not hashable
                    raise ValueError(
                        f"content[{i}]: {kind!r} blocks are not supported (only text, tool_use and "
                        "tool_result)"
                    )
            # pick the model by its tag, so an error names the block's own fields
            by_type: dict[str, type[BaseModel]] = {
                "text": TextBlockParam,
                "tool_use": ToolUseBlockParam,
                "tool_result": ToolResultBlockParam,
            }
            blocks = []
            for i, block in enumerate(v):
                try:
                    present = {k: value for k, value in block.items() if value is not None}  # null = absent
                    blocks.append(by_type[block["type"]].model_validate(present))
                except ValidationError as exc:
                    problems = [
                        f"content[{i}].{'.'.join(str(p) for p in e['loc'])}: "
                        + ("not a supported field" if e["type"] == "extra_forbidden" else str(e["msg"]))
                        for e in exc.errors()
                    ]
                    raise ValueError("; ".join(problems)) from None
            return blocks
        return v


class ToolParam(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    """Client tools only: server tools (``bash_…``, ``web_search_…``) run at Anthropic, not here."""
    cache_control: dict[str, Any] | None = None


class ToolChoiceParam(_Strict):
    type: Literal["auto", "none"] | SkipJsonSchema[Literal["any", "tool"]]
    """"any" and "tool" are parsed to be refused with a reason (the sampler cannot force a tool call)."""
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MetadataParam(_Strict):
    user_id: str | None = None


class MessagesRequest(_Strict, UnicodeBody):
    """``POST /v1/messages`` body (Anthropic Messages API; unknown fields refused, naming the field)."""

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlockParam] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    """Sent by raw clients and older SDKs (newer SDKs pass it with ``extra_body``)."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: SkipJsonSchema[int] | None = None
    """Refused: the sampler has no top-k (an integer is parsed for the message; the schema says null)."""
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, max_length=4)
    metadata: MetadataParam | None = None
    stream: bool = False
    thinking: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"properties": {"type": {"const": "disabled"}}, "required": ["type"]}
    )
    """Accepted only as ``{"type": "disabled"}``: thinking is whatever the chat template renders."""
    service_tier: Literal["auto", "standard_only"] | None = None
    """Accepted and ignored (one tier here)."""
    cache_control: dict[str, Any] | None = None
    """Accepted and ignored, like the blocks' (a prompt-cache hint)."""

    @field_validator("top_k")
    @classmethod
    def _no_top_k(cls, v: int | None) -> int | None:
        if v is not None:
            raise ValueError("not supported: the sampler has no top-k (use top_p, or leave it out)")
        return v

    @field_validator("thinking")
    @classmethod
    def _no_thinking(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        refusal = (
            "extended thinking has no budget here; a thinking model thinks as its chat template says "
            "(send {'type': 'disabled'} or leave it out)"
        )
        return only_type(v, "disabled", refusal)


class CountTokensRequest(MessagesRequest):
    """``POST /v1/messages/count_tokens`` body: a Messages request without ``max_tokens``."""

    max_tokens: int = Field(default=1, ge=1)
    """Not part of a count request; accepted for convenience (the count does not depend on it)."""


class TokenCount(BaseModel):
    input_tokens: int
    """Prompt tokens the request would be sampled from (after splicing against the episode)."""


def _system_text(system: str | list[TextBlockParam]) -> str:
    return system if isinstance(system, str) else "\n".join(block.text for block in system)


_MISPLACED: dict[str, tuple[type[ContentBlockParam], str]] = {
    "user": (ToolUseBlockParam, "tool_use blocks belong in assistant messages"),
    "assistant": (ToolResultBlockParam, "tool_result blocks belong in user messages"),
}
"""Per role, the block kind that belongs to the other role, and what the 400 says."""


def _blocks(position: int, role: str, content: str | list[ContentBlockParam]) -> list[ContentBlockParam]:
    """The content of message ``position`` as blocks (a string is one text block).

    Raises:
        RequestError: A block of the other role (``param``: ``messages.<position>.content.<i>``).
    """
    if isinstance(content, str):
        return [TextBlockParam(type="text", text=content)]
    misplaced, why = _MISPLACED[role]
    for i, block in enumerate(content):
        if isinstance(block, misplaced):
            raise RequestError(why, param=f"messages.{position}.content.{i}")
    return content


def _user_messages(position: int, content: str | list[ContentBlockParam]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    texts: list[str] = []
    for block in _blocks(position, "user", content):
        if isinstance(block, ToolResultBlockParam):
            if texts:
                out.append(ChatMessage(role="user", content="\n".join(texts)))
                texts = []
            out.append(ChatMessage(role="tool", content=block.text(), tool_call_id=block.tool_use_id))
        elif isinstance(block, TextBlockParam):
            texts.append(block.text)
    if texts or not out:
        out.append(ChatMessage(role="user", content="\n".join(texts)))
    return out


def _assistant_message(position: int, content: str | list[ContentBlockParam]) -> ChatMessage:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in _blocks(position, "assistant", content):
        if isinstance(block, ToolUseBlockParam):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(ToolCall(id=block.id, function=FunctionCall(name=block.name, arguments=arguments)))
        elif isinstance(block, TextBlockParam):
            texts.append(block.text)
    text = "\n".join(texts)
    return ChatMessage(
        role="assistant", content=text if text or not calls else None, tool_calls=calls or None
    )


def to_chat_request(request: MessagesRequest) -> ChatCompletionRequest:
    """The internal chat request a Messages request stands for (rendered and recorded like any other).

    Raises:
        RequestError: a forced tool choice, ``disable_parallel_tool_use``, a block in the wrong role, a
            tool name outside ``[a-zA-Z0-9_-]{1,64}`` or a ``tool_result`` answering no earlier
            ``tool_use`` (400, ``param`` names the field).
    """
    messages: list[ChatMessage] = []
    if request.system is not None:
        messages.append(ChatMessage(role="system", content=_system_text(request.system)))
    for position, message in enumerate(request.messages):
        if message.role == "user":
            messages.extend(_user_messages(position, message.content))
        else:
            messages.append(_assistant_message(position, message.content))
    tool_choice: str | None = None
    if request.tool_choice is not None:
        choice = request.tool_choice
        if choice.type in ("any", "tool"):
            raise RequestError(
                f"tool_choice {choice.type!r} is not supported: the sampler cannot force a tool call "
                "(use 'auto' and say in the prompt which tool to call)",
                param="tool_choice.type",
            )
        if choice.disable_parallel_tool_use:
            raise RequestError(
                "disable_parallel_tool_use is not supported: the sampler cannot limit the number of "
                "tool calls",
                param="tool_choice.disable_parallel_tool_use",
            )
        tool_choice = choice.type
    tools = None
    if request.tools:
        tools = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    **({"description": tool.description} if tool.description is not None else {}),
                    "parameters": tool.input_schema,
                },
            }
            for tool in request.tools
        ]
    try:
        return ChatCompletionRequest(
            model=request.model,
            messages=messages,
            tools=tools,
            tool_choice=tool_choice,
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=request.max_tokens,
            stop=request.stop_sequences,
            user=request.metadata.user_id if request.metadata else None,
        )
    except ValidationError as exc:  # the chat request's own rules (tool names, results answering calls)
        first = exc.errors()[0]
        raise RequestError(
            str(first["msg"]).removeprefix("Value error, "), param=_chat_param(first["loc"])
        ) from None


def _chat_param(loc: tuple[int | str, ...]) -> str:
    """The Messages field behind a chat-request error location (the message list or the tools)."""
    return "tools" if loc and loc[0] == "tools" else "messages"


# -- response --------------------------------------------------------------------------------------------------
class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(BaseModel):
    input_tokens: int
    """Prompt tokens the engine consumed (after splicing)."""
    output_tokens: int
    """Completion tokens sampled (an end-of-turn token included)."""


class Message(BaseModel):
    """The ``message`` object of an answer."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: MessageUsage


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex


def content_blocks(record: CallRecord) -> list[TextBlock | ToolUseBlock]:
    """The content of one recorded call: its text (left out only when it is all tool calls), then one
    ``tool_use`` block per parsed tool call (same id as the record's)."""
    blocks: list[TextBlock | ToolUseBlock] = []
    if record.text or not record.tool_calls:
        blocks.append(TextBlock(text=record.text))
    for call in record.tool_calls:
        function = call["function"]
        blocks.append(
            ToolUseBlock(id=call["id"], name=function["name"], input=json.loads(function["arguments"]))
        )
    return blocks


def stop_reason(
    record: CallRecord, detokenizer: Detokenizer, stop: Sequence[str], stop_ids: frozenset[int]
) -> tuple[StopReason, str | None]:
    """``(stop_reason, stop_sequence)`` of a recorded call.

    A ``stop`` finish is ``stop_sequence`` when one of the request's stop strings cut the text (the
    earliest in the decoded completion, as the engine cuts), else ``end_turn``.
    """
    if record.finish_reason is FinishReason.TOOL_CALLS:
        return "tool_use", None
    if record.finish_reason is FinishReason.LENGTH:
        return "max_tokens", None
    ids = record.completion_ids
    if stop and not (ids and ids[-1] in stop_ids):
        decoded = detokenizer.decode(ids)
        found = [(decoded.find(s), s) for s in stop if s in decoded]
        if found:
            return "stop_sequence", min(found, key=lambda f: f[0])[1]
    return "end_turn", None


def message(
    result: ChatResult,
    *,
    message_id: str,
    model: str,
    detokenizer: Detokenizer,
    stop: Sequence[str],
    stop_ids: frozenset[int],
) -> Message:
    """The ``message`` object of an answered request (one choice: the Messages API has no ``n``)."""
    (record,) = result.records
    reason, sequence = stop_reason(record, detokenizer, stop, stop_ids)
    return Message(
        id=message_id,
        model=model,
        content=content_blocks(record),
        stop_reason=reason,
        stop_sequence=sequence,
        usage=MessageUsage(input_tokens=result.prompt_tokens, output_tokens=len(record.completion_ids)),
    )


# -- errors ----------------------------------------------------------------------------------------------------
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status_code: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (``api_error`` for other 5xx)."""
    return _ERROR_TYPES.get(status_code, "api_error" if status_code >= 500 else "invalid_request_error")


class ErrorDetail(BaseModel):
    """The ``error`` member of an Anthropic error answer."""

    type: str
    message: str


class ErrorResponse(BaseModel):
    """Anthropic's error answer: ``{"type": "error", "error": {"type", "message"}}``."""

    type: Literal["error"] = "error"
    error: ErrorDetail


def error_body(status_code: int, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``, Anthropic's error answer and stream event."""
    return {"type": "error", "error": {"type": error_type(status_code), "message": message}}


# -- streaming ---------------------------------------------------------------------------------------------------
Event = tuple[str, dict[str, Any]]
"""One server-sent event: its name (``event:``) and its JSON payload (whose ``type`` is the name)."""


def message_start(message_id: str, model: str, input_tokens: int) -> Event:
    started = Message(
        id=message_id,
        model=model,
        content=[],
        stop_reason=None,
        usage=MessageUsage(input_tokens=input_tokens, output_tokens=0),
    )
    return "message_start", {"type": "message_start", "message": started.model_dump()}


def block_start(index: int, block: TextBlock | ToolUseBlock) -> Event:
    """``content_block_start``: a text block starts empty, a ``tool_use`` block with ``input: {}``."""
    empty = TextBlock(text="") if isinstance(block, TextBlock) else block.model_copy(update={"input": {}})
    return "content_block_start", {
        "type": "content_block_start",
        "index": index,
        "content_block": empty.model_dump(),
    }


def text_delta(index: int, text: str) -> Event:
    return "content_block_delta", {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "text_delta", "text": text},
    }


def input_json_delta(index: int, partial_json: str) -> Event:
    return "content_block_delta", {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "input_json_delta", "partial_json": partial_json},
    }


def block_stop(index: int) -> Event:
    return "content_block_stop", {"type": "content_block_stop", "index": index}


def message_end(reason: StopReason, sequence: str | None, output_tokens: int) -> list[Event]:
    """``message_delta`` (stop reason, output tokens) and ``message_stop``."""
    return [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


PING: Event = ("ping", {"type": "ping"})


def replay_events(answer: Message, record: CallRecord, detokenizer: Detokenizer) -> Iterator[Event]:
    """A finished answer as Anthropic's event sequence: ``message_start``; per block
    ``content_block_start``, deltas (text one token at a time, a tool's input as one
    ``input_json_delta``), ``content_block_stop``; then ``message_delta`` and ``message_stop``."""
    yield message_start(answer.id, answer.model, answer.usage.input_tokens)
    yield PING
    for index, block in enumerate(answer.content):
        yield block_start(index, block)
        if isinstance(block, TextBlock):
            for piece in text_pieces(detokenizer, record.completion_ids, block.text):
                if piece:
                    yield text_delta(index, piece)
        else:
            yield input_json_delta(index, json.dumps(block.input, ensure_ascii=False))
        yield block_stop(index)
    assert answer.stop_reason is not None
    yield from message_end(answer.stop_reason, answer.stop_sequence, answer.usage.output_tokens)
