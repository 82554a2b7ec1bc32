"""The parts of the ``vllm`` engine that run without vLLM or a GPU: its one-line refusal, the weights it
pushes after a step (LoRA merged exactly like peft's own merge), and the backstop that ends an engine-core
process shutdown left alive."""

from __future__ import annotations

import importlib.util
import multiprocessing
import signal
import time
from typing import Any

import pytest
import torch

from swarm.engine.model_loading import ModelSource
from swarm.engine.vllm import (
    EngineUnavailable,
    check_vllm_available,
    end_engine_core_processes,
    served_weights,
)
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


def _deaf_sleeper(deaf: Any) -> None:  # a child that ignores SIGTERM, as a wedged engine core can
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deaf.set()
    time.sleep(600)


def _sleeper() -> None:
    time.sleep(600)


def test_engine_core_children_are_ended_and_other_children_are_left_alone() -> None:
    """An engine core that outlives ``AsyncLLM.shutdown`` holds its GPU share until killed: the backstop
    ends children named ``EngineCore*`` (SIGTERM, then SIGKILL for one that ignores it) and no other."""
    spawn = multiprocessing.get_context("spawn")
    is_deaf = spawn.Event()
    deaf = spawn.Process(target=_deaf_sleeper, args=(is_deaf,), name="EngineCore_DP0", daemon=True)
    plain = spawn.Process(target=_sleeper, name="EngineCore", daemon=True)
    other = spawn.Process(target=_sleeper, name="tokenizer-pool", daemon=True)
    for child in (deaf, plain, other):
        child.start()
    assert is_deaf.wait(60), "the child did not start"
    try:
        started = time.monotonic()
        ended = end_engine_core_processes(timeout_s=1.0)
        assert sorted(ended) == sorted([deaf.pid, plain.pid])
        assert not deaf.is_alive() and deaf.exitcode == -signal.SIGKILL
        assert not plain.is_alive() and plain.exitcode == -signal.SIGTERM
        assert other.is_alive()
        assert time.monotonic() - started < 10
        assert end_engine_core_processes(timeout_s=1.0) == []  # nothing left: a second call ends nothing
    finally:
        for child in (deaf, plain, other):
            if child.is_alive():
                child.kill()
            child.join(5)
