"""The OpenAI wire format built from call records, with SmolLM2's real tokenizer (no engine, no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swarm.engine.base import Completion
from swarm.errors import EpisodeStateError
from swarm.server.chat import ChatResult
from swarm.server.detokenizer import TokenizerDetokenizer
from swarm.server.openai_format import (
    ChoiceText,
    ResponseHeader,
    chat_completion,
    error_body,
    replay_chunks,
    text_pieces,
    token_logprob,
)
from swarm.tracking.records import CallRecord, FinishReason
from swarm.tracking.toolcalls import parse_tool_calls

END = 2  # SmolLM2's <|im_end|>
HEADER = ResponseHeader("chatcmpl-test", 1_700_000_000, "smollm2:planner", "policy-3")


@pytest.fixture
def detok(tokenizer: Any) -> TokenizerDetokenizer:
    return TokenizerDetokenizer(tokenizer)


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def answered(
    ids: list[int], text: str, *, finish: FinishReason = FinishReason.STOP, tool_calls: Any = ()
) -> tuple[CallRecord, Completion]:
    """A record and completion of one choice (made-up logprobs, two top alternatives per token)."""
    logprobs = [-0.5 - t / 10 for t in range(len(ids))]
    top = [[(i, lp), (END, lp - 1.0)] for i, lp in zip(ids, logprobs, strict=True)]
    record = CallRecord(
        index=0,
        prompt_ids=[1, 2, 3, 4],
        completion_ids=ids,
        logprobs=logprobs,
        finish_reason=finish,
        text=text,
        tool_calls=list(tool_calls),
    )
    return record, Completion(ids=ids, logprobs=logprobs, finish_reason=finish, text=text, top_logprobs=top)


def result_of(*choices: tuple[CallRecord, Completion]) -> ChatResult:
    return ChatResult(
        records=[r for r, _ in choices],
        completions=[c for _, c in choices],
        prompt_tokens=4,
        agent="planner",
        policy_version=3,
        created_at=1_700_000_000.0,
    )


def test_detokenizer_keeps_special_tokens(tokenizer: Any, detok: TokenizerDetokenizer) -> None:
    ids = [*encode(tokenizer, "Hello world"), END]
    assert detok.decode(ids) == "Hello world<|im_end|>"
    assert [detok.token_text(i) for i in ids] == ["Hello", " world", "<|im_end|>"]


def test_text_pieces_follow_tokens_and_wait_for_whole_characters(
    tokenizer: Any, detok: TokenizerDetokenizer
) -> None:
    ids = [*encode(tokenizer, "ok 🦜!"), END]  # the parrot is three byte-level tokens
    pieces = text_pieces(detok, ids, "ok 🦜!")
    assert pieces == ["ok", "", "", " 🦜", "!", ""]  # the end-of-turn token adds no text
    cut = text_pieces(detok, encode(tokenizer, "Hello world STOP"), "Hello world ")  # stop string cut
    assert len(cut) == 4 and "".join(cut) == "Hello world "


def test_token_logprob_shows_text_bytes_and_alternatives(tokenizer: Any, detok: TokenizerDetokenizer) -> None:
    (world,) = encode(tokenizer, " world")
    entry = token_logprob(detok, world, -0.25, [(world, -0.25), (END, -3.0)])
    assert (entry.token, entry.logprob, entry.bytes) == (" world", -0.25, list(b" world"))
    assert [(t.token, t.logprob, t.bytes) for t in entry.top_logprobs] == [
        (" world", -0.25, list(b" world")),
        ("<|im_end|>", -3.0, list(b"<|im_end|>")),
    ]
    partial = token_logprob(detok, encode(tokenizer, "🦜")[0], -1.0, [])
    assert partial.token == "\ufffd" and partial.top_logprobs == []


def test_chat_completion_from_records(tokenizer: Any, detok: TokenizerDetokenizer) -> None:
    ids = [*encode(tokenizer, "Five."), END]
    result = result_of(answered(ids, "Five."))
    plain = chat_completion(result, HEADER, logprobs=False, detokenizer=detok)
    assert (plain.id, plain.created, plain.model, plain.system_fingerprint) == (
        "chatcmpl-test",
        1_700_000_000,
        "smollm2:planner",
        "policy-3",
    )
    (choice,) = plain.choices
    assert choice.message.content == "Five." and choice.message.tool_calls is None
    assert choice.finish_reason == "stop" and choice.logprobs is None
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens, plain.usage.total_tokens) == (4, 3, 7)

    with_logprobs = chat_completion(result, HEADER, logprobs=True, detokenizer=detok).choices[0].logprobs
    assert with_logprobs is not None and with_logprobs.content is not None
    assert [t.token for t in with_logprobs.content] == ["Five", ".", "<|im_end|>"]
    assert [t.logprob for t in with_logprobs.content] == result.records[0].logprobs
    assert all(len(t.top_logprobs) == 2 for t in with_logprobs.content)


def test_tool_calls_and_several_choices(tokenizer: Any, detok: TokenizerDetokenizer) -> None:
    call_text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls = parse_tool_calls(call_text, salt="ep:0")
    tool_choice = answered(
        [*encode(tokenizer, call_text), END], content or "", finish=FinishReason.TOOL_CALLS, tool_calls=calls
    )
    text_choice = answered([*encode(tokenizer, "No tool.")], "No tool.", finish=FinishReason.LENGTH)
    completion = chat_completion(
        result_of(tool_choice, text_choice), HEADER, logprobs=False, detokenizer=detok
    )
    first, second = completion.choices
    assert first.message.content is None and first.finish_reason == "tool_calls"
    assert first.message.tool_calls is not None
    (call,) = first.message.tool_calls
    assert call.id == calls[0]["id"] and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert (second.index, second.message.content, second.finish_reason) == (1, "No tool.", "length")
    assert completion.usage.completion_tokens == len(tool_choice[0].completion_ids) + 3


@pytest.mark.parametrize("include_usage", [False, True])
def test_replay_chunks(tokenizer: Any, detok: TokenizerDetokenizer, include_usage: bool) -> None:
    call_text = 'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls = parse_tool_calls(call_text, salt="ep:0")
    result = result_of(
        answered(
            [*encode(tokenizer, call_text), END],
            content or "",
            finish=FinishReason.TOOL_CALLS,
            tool_calls=calls,
        )
    )
    completion = chat_completion(result, HEADER, logprobs=True, detokenizer=detok)
    chunks = list(replay_chunks(completion, result.records, detok, include_usage=include_usage))
    assert all(c.id == "chatcmpl-test" and c.system_fingerprint == "policy-3" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    contents = [c for c in chunks if c.choices and c.choices[0].delta.content is not None][1:]
    assert "".join(c.choices[0].delta.content or "" for c in contents) == "Adding."
    # every token's logprob rides on a chunk, even where its text is held for the tool call
    assert len(contents) == len(result.records[0].completion_ids)
    (tool_chunk,) = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    delta_calls = tool_chunk.choices[0].delta.tool_calls
    assert delta_calls is not None and delta_calls[0]["index"] == 0 and delta_calls[0]["id"] == calls[0]["id"]
    finish = chunks[-2] if include_usage else chunks[-1]
    assert finish.choices[0].finish_reason == "tool_calls"
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage == completion.usage
    else:
        assert all(c.usage is None for c in chunks)


def test_choice_text_holds_back_what_could_begin_a_stop_string(
    tokenizer: Any, detok: TokenizerDetokenizer
) -> None:
    text = ChoiceText(detok, frozenset({END}), stop=("STOP",))
    hello, world, st, op = encode(tokenizer, "Hello world STOP")
    assert text.push(hello) == "He"  # 3 characters could begin "STOP"
    assert text.push(world) == "llo wo"
    assert text.push(st) == "rld"  # " ST" stays back
    assert text.push(op, last=True) == ""  # the last token's text comes with the record
    assert text.finish("Hello world ") == " "  # the engine cut the text before the stop string
    assert text.sent == "Hello world "


def test_choice_text_never_sends_end_of_turn_or_half_characters(
    tokenizer: Any, detok: TokenizerDetokenizer
) -> None:
    text = ChoiceText(detok, frozenset({END}))
    released = [text.push(i) for i in encode(tokenizer, "ok 🦜!")]
    assert released == ["ok", " ", "", "🦜", "!"]  # U+FFFD is never sent: the space goes first
    assert text.push(END) == ""  # an end-of-turn token is held even when not marked last
    assert text.finish("ok 🦜!") == ""
    assert text.sent == "ok 🦜!"


def test_error_body_names_swarm_errors_and_hides_others() -> None:
    ended = error_body(EpisodeStateError("ep-1", "episode ep-1 ended while this call was running"))
    assert (ended.error.type, ended.error.message) == (
        "conflict",
        "episode ep-1 ended while this call was running",
    )
    hidden = error_body(KeyError("secret detail"))
    assert (hidden.error.type, hidden.error.message) == ("server_error", "internal error: KeyError")
