"""Fixtures of the a3r tests: a trainable tiny-model swarm server of our own (in a thread, loopback)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.conftest import LiveServer, make_server


@pytest.fixture(scope="session")
def trainable_server(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, tiny_model: Any
) -> Iterator[LiveServer]:
    """A training-enabled server over a private copy of the tiny model (training mutates weights, so the
    shared ``tiny_engine`` of other tests is never used)."""
    from swarm.engine import HFEngine

    torch.manual_seed(0)
    engine = HFEngine(copy.deepcopy(tiny_model), tokenizer, "tiny-a3r")
    live = make_server(tmp_path_factory.mktemp("a3r-server"), engine)
    yield live
    live.stop()
    engine.close()
