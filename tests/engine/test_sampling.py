"""The hf engine's sampler at the edges of its parameters."""

from __future__ import annotations

from swarm.engine import HFEngine
from swarm.engine.base import SamplingParams

PROMPT = [1, 2, 3, 4]


def test_a_vanishing_temperature_samples_like_greedy(tiny_engine: HFEngine) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    (expected,) = tiny_engine.submit(PROMPT, greedy).result(30)
    for temperature in (1e-300, 1e-40, 1e-12):  # below float32's range, subnormal, tiny
        params = SamplingParams(temperature=temperature, max_tokens=8, seed=0)
        (completion,) = tiny_engine.submit(PROMPT, params).result(30)
        assert completion.ids == expected.ids, temperature
