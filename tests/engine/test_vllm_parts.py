"""The parts of the ``vllm`` engine that run without vLLM or a GPU: its one-line refusal, and the
weights it pushes after a step (LoRA merged exactly like peft's own merge)."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from swarm.engine.model_loading import ModelSource
from swarm.engine.vllm import EngineUnavailable, check_vllm_available, served_weights
from swarm.errors import ModelLoadError
from tests.conftest import build_tiny_model


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_engine_is_refused_in_one_line() -> None:
    with pytest.raises(EngineUnavailable) as caught:
        check_vllm_available()
    message = str(caught.value)
    assert "\n" not in message
    assert "pip install 'a3r[vllm]'" in message
    assert isinstance(caught.value, ModelLoadError)  # swarm serve turns it into its one-line exit


def test_a_plain_model_is_served_as_its_state_dict(embedded_source: ModelSource) -> None:
    model = build_tiny_model(embedded_source)
    pushed = dict(served_weights(model))
    expected = model.state_dict()
    assert pushed.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(pushed[name], tensor)


def test_lora_weights_are_pushed_merged_under_the_base_names(embedded_source: ModelSource) -> None:
    from peft import LoraConfig, get_peft_model

    base = build_tiny_model(embedded_source, seed=1)
    names = set(base.state_dict())
    peft_model: Any = get_peft_model(
        build_tiny_model(embedded_source, seed=1),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    with torch.no_grad():  # adapters start as a no-op (B = 0): give them a real delta
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    pushed = dict(served_weights(peft_model))
    merged = peft_model.merge_and_unload().state_dict()
    assert pushed.keys() == names
    changed = 0
    for name, tensor in merged.items():
        torch.testing.assert_close(pushed[name], tensor, rtol=1e-5, atol=1e-6)
        changed += not torch.equal(tensor, base.state_dict()[name])
    assert changed == 2 * 2  # q_proj and v_proj of both layers carry the adapters' delta
