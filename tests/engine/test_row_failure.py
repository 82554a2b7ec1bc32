"""The hf engine confines an engine error to the request that causes it: the other requests of its static
batch are answered as if the bad one had never been there."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from swarm.engine import HFEngine
from swarm.engine.base import SamplingParams

PROMPTS = ([1, 2, 3, 4], [5, 6, 7])
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, n=2)


@pytest.fixture
def engine(tiny_model: Any, tokenizer: Any) -> Iterator[HFEngine]:
    """A long batch window: requests submitted together certainly share one batch."""
    engine = HFEngine(tiny_model, tokenizer, "tiny-smollm2", batch_window_s=0.5)
    yield engine
    engine.close()


def test_a_request_that_fails_fails_alone(engine: HFEngine) -> None:
    alone = [[c.ids for c in engine.submit(p, GREEDY).result()] for p in PROMPTS]
    beyond_vocab = [1, 2, engine.model.config.vocab_size + 7]  # the embedding lookup raises for this row
    good_first = engine.submit(PROMPTS[0], GREEDY)
    bad = engine.submit(beyond_vocab, GREEDY)
    good_last = engine.submit(PROMPTS[1], GREEDY)
    with pytest.raises(IndexError):
        bad.result(timeout=60)
    answers = [[c.ids for c in future.result(timeout=60)] for future in (good_first, good_last)]
    assert answers == alone  # greedy: the same tokens as when each ran alone
    again = engine.submit(PROMPTS[0], GREEDY).result(timeout=60)  # the engine keeps serving
    assert [c.ids for c in again] == alone[0]
