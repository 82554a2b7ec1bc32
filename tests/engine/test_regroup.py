"""The hf engine's batch regrouping: clients that come back after their answer share a batch again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from swarm.engine import HFEngine
from swarm.engine.base import SamplingParams

PROMPT = [1, 2, 3, 4]


def _params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=2, n=n)


@pytest.fixture
def make_engine(tiny_model: Any, tokenizer: Any) -> Iterator[Any]:
    engines: list[HFEngine] = []

    def make(**kwargs: Any) -> HFEngine:
        engine = HFEngine(tiny_model, tokenizer, "tiny-smollm2", batch_window_s=0.001, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.mark.parametrize(("regroup_fraction", "batches"), [(1e6, 1), (0.0, 2)])
def test_returning_rows_share_one_batch(make_engine: Any, regroup_fraction: float, batches: int) -> None:
    engine = make_engine(regroup_fraction=regroup_fraction, regroup_max_s=10.0)
    engine.submit(PROMPT, _params(4)).result()  # a batch of 4 rows: 4 rows are expected back
    before = engine.batches
    early = engine.submit(PROMPT, _params(2))
    time.sleep(0.5)  # far beyond the 1 ms batch window
    late = engine.submit(PROMPT, _params(2))
    assert len(early.result()) == 2 and len(late.result()) == 2
    assert engine.batches - before == batches
    if batches == 1:
        assert early.result()[0].batch_size == 4


def test_regroup_wait_is_capped(make_engine: Any) -> None:
    engine = make_engine(regroup_fraction=1e6, regroup_max_s=0.3)
    engine.submit(PROMPT, _params(4)).result()
    started = time.monotonic()
    (completion,) = engine.submit(PROMPT, _params(1)).result()  # the other 3 rows never come back
    assert completion.batch_size == 1
    assert 0.25 <= time.monotonic() - started < 5.0


def test_a_lone_client_is_not_delayed(make_engine: Any) -> None:
    engine = make_engine(regroup_fraction=1e6, regroup_max_s=10.0)
    engine.submit(PROMPT, _params(1)).result()
    for _ in range(10):  # its answer comes before its batch ends: its next request is not an extra row
        started = time.monotonic()
        engine.submit(PROMPT, _params(1)).result()  # as many rows as the last batch: starts at once
        assert time.monotonic() - started < 5.0


def test_one_short_batch_does_not_lower_the_expected_rows(make_engine: Any) -> None:
    # 4 rows, then a batch where only 2 come back (e.g. the others wait at a barrier), then all 4
    # come back in two parts: they share one batch, as the first short batch keeps 4 expected.
    engine = make_engine(regroup_fraction=1e6, regroup_max_s=1.0)
    engine.submit(PROMPT, _params(4)).result()
    engine.submit(PROMPT, _params(2)).result()  # waits 1 s for the other 2, then runs alone
    before = engine.batches
    early = engine.submit(PROMPT, _params(2))
    time.sleep(0.3)
    late = engine.submit(PROMPT, _params(2))
    assert early.result()[0].batch_size == 4 and late.result()[0].batch_size == 4
    assert engine.batches - before == 1
