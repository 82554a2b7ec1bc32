"""Chat messages of a request, validated once (OpenAI Chat Completions format).

The HTTP layer validates a request's messages with these models (`swarm.protocol` re-exports them);
the prompt renderer takes the validated models and converts them to the dicts a chat template expects
without checking them again. Messages given as plain dicts (a library caller of
:meth:`swarm.tracking.render.PromptRenderer.render`) are validated by the same models in
:func:`parse_messages`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic.config import JsonDict

from swarm.tracking.errors import PromptError

Role = Literal["system", "developer", "user", "assistant", "tool"]

_TEXT_PARTS_ONLY = "only text parts ({'type': 'text', 'text': ...}) are supported"


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"
    """JSON-encoded arguments, as produced by the model (an empty string means no arguments)."""

    @field_validator("arguments")
    @classmethod
    def _json(cls, v: str) -> str:
        if v.strip():
            try:
                json.loads(v)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not valid JSON: {exc.msg}") from exc
        return v

    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON (``{}`` for an empty string)."""
        return json.loads(self.arguments) if self.arguments.strip() else {}


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(BaseModel):
    """One part of a message's content list; only text parts are accepted."""

    type: Literal["text"]
    text: str


_CONTENT_OR_TOOL_CALLS: JsonDict = {
    "anyOf": [
        {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
        {
            "required": ["role", "tool_calls"],
            "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}},
        },
    ]
}
"""`ChatMessage`'s rule that a message has content, or is an assistant's tool calls, in its JSON schema."""


class ChatMessage(BaseModel):
    """One message of the conversation (request side; unknown fields are kept and ignored)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_CONTENT_OR_TOOL_CALLS)

    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    """A reasoning model's thinking, passed to templates that render it."""

    @field_validator("content", mode="before")
    @classmethod
    def _text_content(cls, v: Any) -> Any:
        if v is None or isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("content must be a string, a list of text parts or null")
        for part in v:
            text = part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None)
            kind = part.get("type") if isinstance(part, Mapping) else getattr(part, "type", None)
            if kind != "text" or not isinstance(text, str):
                raise ValueError(_TEXT_PARTS_ONLY)
        return v

    @model_validator(mode="after")
    def _content_or_tool_calls(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            article = "an" if self.role == "assistant" else "a"  # of the roles (`Role`), only it
            raise ValueError(f"{article} {self.role} message needs content")
        return self

    def text(self) -> str:
        """The content as one string: text parts joined with ``"\\n"``, ``None`` as ``""``."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


def _location(position: int, loc: Sequence[int | str]) -> str:
    return f"messages[{position}]" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def parse_messages(messages: Sequence[ChatMessage | Mapping[str, Any]]) -> list[ChatMessage]:
    """Validate chat messages given as models or plain dicts (models are taken as they are).

    Raises:
        PromptError: not a non-empty list, an entry that is not an object, or an invalid message (its
            message names the field, e.g. ``messages[0].tool_calls[0].function.name: Field required``).
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise PromptError("messages must be a non-empty list", param="messages")
    parsed: list[ChatMessage] = []
    for position, message in enumerate(messages):
        if isinstance(message, ChatMessage):
            parsed.append(message)
            continue
        if not isinstance(message, Mapping):
            raise PromptError(f"messages[{position}] must be an object", param="messages")
        try:
            parsed.append(ChatMessage.model_validate(message))
        except ValidationError as exc:
            problems = [
                f"{_location(position, err['loc'])}: {str(err['msg']).removeprefix('Value error, ')}"
                for err in exc.errors()
            ]
            raise PromptError("; ".join(problems), param="messages") from None
    return parsed
