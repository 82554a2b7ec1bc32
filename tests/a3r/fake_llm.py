"""Tiny fakes with the real interfaces: a loopback HTTP server speaking the OpenAI chat-completions and
Anthropic Messages wire formats, and a LangChain fake chat model that supports tool binding.

The server answers structured-output requests with canned objects keyed by the schema (tool) name the
request names, in the shape each SDK expects (OpenAI: ``message.content`` JSON for ``json_schema``
response formats, ``message.tool_calls`` when tools are sent; Anthropic: a ``tool_use`` content
block). Every request is recorded (headers included) so tests can check what went over the wire.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from tests.conftest import free_port


@dataclass
class FakeLLMServer:
    """Canned answers by schema name (a list: one answer per call, in order; the last one repeats);
    ``fail_with`` makes every call answer that HTTP status."""

    canned: dict[str, dict[str, Any] | list[dict[str, Any]]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    fail_with: int | None = None
    port: int = field(default_factory=free_port)
    _server: uvicorn.Server | None = None

    def answer(self, name: str) -> dict[str, Any]:
        """The next canned answer for schema ``name``."""
        found = self.canned[name]
        if isinstance(found, dict):
            return found
        return found.pop(0) if len(found) > 1 else found[0]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def openai_chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append({"api": "openai", "headers": dict(request.headers), "body": body})
            if self.fail_with:
                return JSONResponse(
                    {
                        "error": {
                            "message": "bad key",
                            "type": "invalid_request_error",
                            "code": "invalid_api_key",
                        }
                    },
                    status_code=self.fail_with,
                )
            message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
            finish = "stop"
            if body.get("tools"):
                name = body["tools"][0]["function"]["name"]
                message["tool_calls"] = [
                    {
                        "id": f"call_{uuid.uuid4().hex[:8]}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(self.answer(name))},
                    }
                ]
                finish = "tool_calls"
            else:
                name = body["response_format"]["json_schema"]["name"]
                message["content"] = json.dumps(self.answer(name))
            return JSONResponse(
                {
                    "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                }
            )

        @app.post("/v1/messages")
        async def anthropic_messages(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append({"api": "anthropic", "headers": dict(request.headers), "body": body})
            if self.fail_with:
                return JSONResponse(
                    {
                        "type": "error",
                        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
                    },
                    status_code=self.fail_with,
                )
            name = body["tools"][0]["name"]
            return JSONResponse(
                {
                    "id": f"msg_{uuid.uuid4().hex[:8]}",
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": [
                        {
                            "type": "tool_use",
                            "id": f"toolu_{uuid.uuid4().hex[:8]}",
                            "name": name,
                            "input": self.answer(name),
                        }
                    ],
                    "stop_reason": "tool_use",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 9},
                }
            )

        return app

    def start(self) -> FakeLLMServer:
        config = uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        thread = threading.Thread(target=self._server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake LLM server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        assert self._server is not None
        self._server.should_exit = True


class ToolCallingFakeChatModel(GenericFakeChatModel):
    """`GenericFakeChatModel` that accepts ``bind_tools`` (so ``with_structured_output`` works) and
    answers each call with the next scripted message (tool calls carry the structured objects)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ToolCallingFakeChatModel:  # type: ignore[override]
        return self


def tool_answers(*calls: tuple[str, dict[str, Any]]) -> Iterator[AIMessage]:
    """Scripted answers: one AI message per ``(schema name, arguments)`` with that tool call."""
    return iter(
        AIMessage(
            content="", tool_calls=[{"name": name, "args": args, "id": f"call-{i}", "type": "tool_call"}]
        )
        for i, (name, args) in enumerate(calls)
    )
