"""The hf engine hands every token to a listener as it is sampled (what streaming responses forward)."""

from __future__ import annotations

import threading
import time
from typing import Any

from swarm.engine import HFEngine, SampledToken
from swarm.engine.base import SamplingParams

PROMPT = [1, 2, 3, 4]


def test_tokens_reach_the_listener_before_the_completion_is_done(tiny_engine: HFEngine) -> None:
    seen: list[SampledToken] = []
    first, resume = threading.Event(), threading.Event()

    def listener(token: SampledToken) -> None:
        seen.append(token)
        if len(seen) == 1:  # hold the batch after its first token
            first.set()
            resume.wait(30)

    params = SamplingParams(temperature=1.0, max_tokens=12, seed=3, n=2, top_logprobs=2)
    future = tiny_engine.submit(PROMPT, params, listener)
    assert first.wait(30)
    assert not future.done()  # the first token is out while the batch is still sampling
    resume.set()
    completions = future.result(30)
    for choice, completion in enumerate(completions):
        mine = [t for t in seen if t.choice == choice]
        assert [t.id for t in mine] == completion.ids
        assert [t.logprob for t in mine] == completion.logprobs
        assert [list(t.top_logprobs) for t in mine] == completion.top_logprobs
        assert [t.last for t in mine] == [False] * (len(mine) - 1) + [True]


def test_a_failing_listener_is_dropped_and_the_completion_still_comes(tiny_engine: HFEngine) -> None:
    calls: list[Any] = []

    def broken(token: SampledToken) -> None:
        calls.append(token)
        raise RuntimeError("event loop is closed")

    (completion,) = tiny_engine.submit(PROMPT, SamplingParams(temperature=0.0, max_tokens=6), broken).result(
        30
    )
    assert len(calls) == 1 and len(completion.ids) == 6


def test_a_cancelled_request_stops_sampling_at_the_next_step(tiny_engine: HFEngine) -> None:
    seen: list[SampledToken] = []
    first, resume = threading.Event(), threading.Event()

    def listener(token: SampledToken) -> None:
        seen.append(token)
        first.set()
        resume.wait(30)

    before = tiny_engine.batches
    future = tiny_engine.submit(PROMPT, SamplingParams(temperature=1.0, max_tokens=2000, seed=1), listener)
    assert first.wait(30)
    assert future.cancel()  # its episode ended: nobody will record this call
    resume.set()
    deadline = time.monotonic() + 30
    while tiny_engine.batches == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tiny_engine.batches == before + 1
    assert len(seen) == 1  # not one more decode step
    # The engine goes on serving.
    (completion,) = tiny_engine.submit(PROMPT, SamplingParams(temperature=0.0, max_tokens=3)).result(30)
    assert len(completion.ids) == 3


def test_a_request_cancelled_while_waiting_for_the_engine_is_never_sampled(tiny_engine: HFEngine) -> None:
    seen: list[SampledToken] = []
    with tiny_engine.lock:  # hold the worker back (as a training step does)
        future = tiny_engine.submit(PROMPT, SamplingParams(max_tokens=5), seen.append)
        time.sleep(0.1)  # past the batch window: the worker has taken the request and waits for the lock
        assert future.cancel()
    (completion,) = tiny_engine.submit(PROMPT, SamplingParams(temperature=0.0, max_tokens=3)).result(30)
    assert len(completion.ids) == 3 and seen == []
