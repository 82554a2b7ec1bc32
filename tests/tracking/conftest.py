"""Fixtures of the tracker tests: the real SmolLM2 tokenizer and chat templates of several families
applied with it (see ``tracking_sim.py`` for the request simulator)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from chat_templates_for_tests import GEMMA_SPECIAL, GEMMA_STYLE, LLAMA3_SPECIAL, LLAMA3_STYLE, QWEN3_STYLE
from tracking_sim import TemplateSetup


@pytest.fixture(scope="session")
def smol_tokenizer(tokenizer: Any) -> Any:
    """SmolLM2-135M-Instruct's real tokenizer as the server loads it (the root ``tokenizer`` fixture:
    the embedded GGUF converted once to its safetensors cache by ``swarm.engine.model_loading``)."""
    return tokenizer


def _with_special(tokenizer: Any, tokens: list[str]) -> Any:
    extended = copy.deepcopy(tokenizer)
    extended.add_special_tokens({"additional_special_tokens": tokens})
    return extended


@pytest.fixture(scope="session")
def setups(smol_tokenizer: Any) -> dict[str, TemplateSetup]:
    """The embedded model's template plus Llama-3-, Gemma- and Qwen3-style templates."""
    return {
        "smollm2": TemplateSetup("smollm2", smol_tokenizer, None, "<|im_end|>"),
        "llama3": TemplateSetup(
            "llama3", _with_special(smol_tokenizer, LLAMA3_SPECIAL), LLAMA3_STYLE, "<|eot_id|>"
        ),
        "gemma": TemplateSetup(
            "gemma", _with_special(smol_tokenizer, GEMMA_SPECIAL), GEMMA_STYLE, "<end_of_turn>"
        ),
        "qwen3": TemplateSetup("qwen3", smol_tokenizer, QWEN3_STYLE, "<|im_end|>"),
    }
