"""Freed heap memory goes back to the OS: after an idle CPU engine batch, and the helper itself."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from swarm.engine import HFEngine
from swarm.engine.base import SamplingParams
from swarm.heap import return_freed_memory


def _resident_kb() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim and /proc")
def test_return_freed_memory_gives_freed_pages_back() -> None:
    assert return_freed_memory() is True  # glibc here
    blocks = [bytearray(64 * 1024 - 64) for _ in range(4096)]  # ~256 MB below the mmap threshold
    grown = _resident_kb()
    del blocks[:-1]  # the newest block, on top of the heap, keeps it from shrinking by itself
    kept = _resident_kb()
    return_freed_memory()
    trimmed = _resident_kb()
    assert grown - trimmed > 150_000 and kept - trimmed > 150_000, (grown, kept, trimmed)


def test_an_idle_cpu_engine_trims_once_after_its_batches(tiny_model: Any, tokenizer: Any) -> None:
    engine = HFEngine(tiny_model, tokenizer, "tiny-smollm2", batch_window_s=0.001)
    engine.idle_trim_s = 0.2
    try:
        engine.submit([1, 2, 3, 4], SamplingParams(temperature=0.0, max_tokens=2, n=3)).result()
        engine.submit([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2)).result()
        deadline = time.monotonic() + 10
        while engine.trims == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.trims == 1
        time.sleep(0.5)
        assert engine.trims == 1  # nothing ran since: no trimming in a loop
    finally:
        engine.close()
