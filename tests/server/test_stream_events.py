"""Live stream events without an engine: tokens are handed to the stream's listener by the test and the
call's result is set by hand; the tokenizer is SmolLM2's real one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from swarm.engine.base import Completion, SampledToken, TokenCallback
from swarm.errors import EpisodeStateError
from swarm.server.chat import ChatResult
from swarm.server.detokenizer import TokenizerDetokenizer
from swarm.server.events import EventLog, last_seq
from swarm.server.openai_format import ResponseHeader
from swarm.server.streaming import LiveStream, encode_events, live_events
from swarm.tracking.records import CallRecord, FinishReason

END = 2  # SmolLM2's <|im_end|>


class ManualCall:
    """The ``start`` of a live stream: keeps its token listener and returns a future the test resolves."""

    def __init__(self) -> None:
        self.future: asyncio.Future[ChatResult] = asyncio.get_running_loop().create_future()
        self.on_token: TokenCallback | None = None

    def __call__(self, on_token: TokenCallback) -> asyncio.Future[ChatResult]:
        self.on_token = on_token
        return self.future

    def send(self, ids: list[int]) -> None:
        assert self.on_token is not None
        for t, token_id in enumerate(ids):
            self.on_token(SampledToken(choice=0, id=token_id, logprob=-0.5, last=t == len(ids) - 1))


def stream_of(tokenizer: Any, **overrides: Any) -> LiveStream:
    fields: dict[str, Any] = {
        "header": ResponseHeader("chatcmpl-live", 1, "smollm2", "policy-0"),
        "n": 1,
        "stop": ("STOP",),
        "stop_ids": frozenset({END}),
        "detokenizer": TokenizerDetokenizer(tokenizer),
        "logprobs": False,
        "include_usage": True,
    }
    return LiveStream(**{**fields, **overrides})


def data_lines(raw: bytes) -> list[Any]:
    events = raw.decode().split("\n\n")
    assert events[-1] == "" and all(e.startswith("data: ") for e in events[:-1])
    return [e.removeprefix("data: ") if e == "data: [DONE]" else json.loads(e[6:]) for e in events[:-1]]


async def test_a_live_stream_holds_back_text_and_ends_with_usage_and_done(tokenizer: Any) -> None:
    ids = list(tokenizer.encode("Hello world STOP", add_special_tokens=False))
    call = ManualCall()
    encoded = encode_events(live_events(call, stream_of(tokenizer)))
    call.send(ids)
    record = CallRecord(
        index=0,
        prompt_ids=[1, 2],
        completion_ids=ids,
        logprobs=[-0.5] * 4,
        finish_reason=FinishReason.STOP,
        text="Hello world ",
    )
    completion = Completion(
        ids=ids, logprobs=[-0.5] * 4, finish_reason=FinishReason.STOP, text="Hello world "
    )
    call.future.set_result(ChatResult([record], [completion], 2, "default", 0, 1.0))
    events = data_lines(b"".join([chunk async for chunk in encoded]))
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"].get("content") for e in events[1:-3]]
    assert deltas == ["He", "llo wo", "rld", " "]  # " ST" was held back, the record's text ends it
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 4
    assert events[-1] == "[DONE]"


async def test_a_failed_call_ends_the_stream_with_an_error_event(tokenizer: Any) -> None:
    call = ManualCall()
    encoded = encode_events(live_events(call, stream_of(tokenizer, logprobs=True)))
    call.send(list(tokenizer.encode("Hi", add_special_tokens=False)))
    call.future.set_exception(EpisodeStateError("ep-1", "episode ep-1 ended while this call was running"))
    events = data_lines(b"".join([chunk async for chunk in encoded]))
    assert events[1]["choices"][0]["logprobs"]["content"][0]["token"] == "Hi"
    assert events[-1] == {
        "error": {"type": "conflict", "message": "episode ep-1 ended while this call was running"}
    }


async def test_closing_the_stream_early_cancels_the_call(tokenizer: Any) -> None:
    call = ManualCall()
    encoded = encode_events(live_events(call, stream_of(tokenizer)))
    first = await anext(encoded)  # the role chunk; the call is still sampling
    assert b'"role":"assistant"' in first and not call.future.done()
    await encoded.aclose()  # the client went away
    assert call.future.cancelled()


def test_a_restarted_event_log_numbers_on_from_its_file(tmp_path: Path) -> None:
    """Found by a fresh user: every restart numbered events from 1 again, so ``events.jsonl`` held
    duplicate ``seq`` values and a follower resuming with ``since=`` missed a restarted server's events."""
    path = tmp_path / "events.jsonl"
    first = EventLog(path)
    assert [first.emit("a.b", "x").seq for _ in range(3)] == [1, 2, 3]
    first.close()
    with path.open("a", encoding="utf-8") as f:
        f.write('{"seq": 4, "torn')  # a kill in the middle of a write
    again = EventLog(path)
    assert again.emit("a.b", "after the restart").seq == 4
    assert [e.seq for e in again.recent(since=3)] == [4]
    again.close()
    assert json.loads(path.read_text(encoding="utf-8").splitlines()[-1])["seq"] == 4  # on a line of its own
    assert last_seq(tmp_path / "missing.jsonl") == 0
