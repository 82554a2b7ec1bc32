"""The hf engine's sampler at the edges of its parameters."""

from __future__ import annotations

import threading
import time

from swarm.engine import HFEngine, SampledToken
from swarm.engine.base import SamplingParams

PROMPT = [1, 2, 3, 4]


def test_a_vanishing_temperature_samples_like_greedy(tiny_engine: HFEngine) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    (expected,) = tiny_engine.submit(PROMPT, greedy).result(30)
    for temperature in (1e-300, 1e-40, 1e-12):  # below float32's range, subnormal, tiny
        params = SamplingParams(temperature=temperature, max_tokens=8, seed=0)
        (completion,) = tiny_engine.submit(PROMPT, params).result(30)
        assert completion.ids == expected.ids, temperature


def test_a_short_answer_returns_before_the_long_one_it_is_batched_with(tiny_engine: HFEngine) -> None:
    hold, seen = threading.Event(), []

    def long_listener(token: SampledToken) -> None:
        seen.append(token)
        if len(seen) == 20:  # keep the batch running until the test has looked
            hold.wait(30)

    before = tiny_engine.batches
    with tiny_engine.lock:  # both requests are queued before the worker can start a batch
        short = tiny_engine.submit(PROMPT, SamplingParams(temperature=0.0, max_tokens=3))
        long = tiny_engine.submit(
            PROMPT, SamplingParams(temperature=1.0, max_tokens=40, seed=1), long_listener
        )
        time.sleep(0.1)
    (answer,) = short.result(30)
    assert not long.done() and tiny_engine.batches == before  # the batch still runs
    assert len(answer.ids) == 3 and answer.batch_size == 2
    hold.set()
    (rest,) = long.result(30)
    assert tiny_engine.batches == before + 1 and rest.generate_s > answer.generate_s
