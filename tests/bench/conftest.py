"""The bench scripts import their siblings as top-level modules (as ``python bench/x.py`` runs them), so
their folder goes on ``sys.path`` for these tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """Benches set the process's torch threads (``run_suite``, a server's ``torch_threads``); give the
    other tests theirs back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
