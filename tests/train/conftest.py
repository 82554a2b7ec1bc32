"""Shared fixtures: a tiny random Llama (real transformers model, built from a small LlamaConfig) and samples."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from swarm.tracking.records import Sample

from .factories import PAD, VOCAB, make_sample


@pytest.fixture(scope="session")
def tiny_llama_template() -> LlamaForCausalLM:
    """One tiny random Llama built once; tests take deep copies via ``make_model``."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=PAD,
    )
    model = LlamaForCausalLM(config)
    model.eval()  # type: ignore[no-untyped-call]
    return model


@pytest.fixture
def make_model(tiny_llama_template: LlamaForCausalLM) -> Callable[[], LlamaForCausalLM]:
    def make() -> LlamaForCausalLM:
        return copy.deepcopy(tiny_llama_template)

    return make


@pytest.fixture
def samples() -> list[Sample]:
    """Six samples of different lengths (so micro-batches need padding), one episode split in two."""
    return [
        make_sample("e0", 12, 5, seed=0),
        make_sample("e1", 9, 3, seed=1),
        make_sample("e2", 17, 6, seed=2),
        make_sample("e3", 7, 2, seed=3),
        make_sample("e4", 14, 4, seed=4, weight=0.5),
        make_sample("e4", 10, 7, seed=5, weight=0.5),
    ]
