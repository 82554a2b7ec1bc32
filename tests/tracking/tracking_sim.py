"""Test helpers of the tracker tests: a chat template set-up and a simulator of the server's per-request
work (render with splicing, record the engine output). Named uniquely so ``import`` never picks up
another folder's module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swarm.tracking.records import CallRecord, FinishReason
from swarm.tracking.render import PromptRenderer, RenderedPrompt
from swarm.tracking.toolcalls import parse_tool_calls


@dataclass(frozen=True)
class TemplateSetup:
    """A chat template, the tokenizer to apply it with and the token that ends an assistant turn."""

    name: str
    tokenizer: Any
    chat_template: str | None
    eos_text: str

    @property
    def eos_id(self) -> int:
        ids = self.tokenizer.encode(self.eos_text, add_special_tokens=False)
        assert len(ids) == 1, f"{self.eos_text} must be one token"
        return int(ids[0])

    def renderer(self) -> PromptRenderer:
        return PromptRenderer(self.tokenizer, self.chat_template)


@dataclass
class Sim:
    """Does per request what the server does: render with splicing, then record the engine's output.

    The "engine output" is given as token ids (possibly a non-canonical split); logprobs are distinct
    made-up numbers so alignment can be checked.
    """

    setup: TemplateSetup
    tools: list[dict[str, Any]] | None = None
    calls: list[CallRecord] = field(default_factory=list)
    renderer: PromptRenderer | None = None

    def render(self, messages: list[dict[str, Any]], agent: str | None = None) -> RenderedPrompt:
        if self.renderer is None:
            self.renderer = self.setup.renderer()
        return self.renderer.render(messages, self.tools, history=self.calls, agent=agent)

    def ids(self, text: str, *, eos: bool = True) -> list[int]:
        ids = list(self.setup.tokenizer.encode(text, add_special_tokens=False))
        return [*ids, self.setup.eos_id] if eos else ids

    def call(
        self,
        messages: list[dict[str, Any]],
        completion_ids: list[int],
        *,
        agent: str = "default",
        trainable: bool = True,
        finish: FinishReason | None = None,
    ) -> tuple[CallRecord, dict[str, Any]]:
        """Record one call; returns the record and the assistant message a client would append."""
        rendered = self.render(messages, agent)
        tok = self.setup.tokenizer
        text = tok.decode(completion_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        content: str | None = text
        tool_calls: list[dict[str, Any]] = []
        if self.tools:
            content, tool_calls = parse_tool_calls(text)
        if finish is None:
            ended = bool(completion_ids) and completion_ids[-1] == self.setup.eos_id
            finish = (
                FinishReason.TOOL_CALLS if tool_calls else FinishReason.STOP if ended else FinishReason.LENGTH
            )
        index = len(self.calls)
        record = CallRecord(
            index=index,
            agent=agent,
            trainable=trainable,
            prompt_ids=rendered.prompt_ids,
            completion_ids=list(completion_ids),
            logprobs=[-(index + 1) - k / 1000 for k in range(len(completion_ids))],
            finish_reason=finish,
            text=content or "",
            tool_calls=tool_calls,
            splices=rendered.splices,
            splice_mismatches=rendered.splice_mismatches,
        )
        self.calls.append(record)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return record, message
