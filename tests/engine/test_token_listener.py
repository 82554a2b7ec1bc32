"""The hf engine hands every token to a listener as it is sampled (what streaming responses forward)."""

from __future__ import annotations

import threading
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

    (completion,) = tiny_engine.submit(PROMPT, SamplingParams(temperature=0.0, max_tokens=6), broken).result(30)
    assert len(calls) == 1 and len(completion.ids) == 6
