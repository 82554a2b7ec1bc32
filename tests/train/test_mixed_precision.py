"""Mixed precision: AUTO resolution, the autocast context, a bf16 engine and a bf16 trainer on tiny models,
and the config guard against full fine-tuning of low-precision weights."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from swarm.config import ServerConfig, TrainingConfig
from swarm.engine import HFEngine
from swarm.engine.base import SamplingParams
from swarm.precision import MixedPrecision, autocast, fast_bf16, resolve_mixed_precision
from swarm.train import LoraSettings, TorchTrainer, TrainerConfig

from .factories import ADVANTAGES, PAD, make_sample


def test_auto_resolves_by_device_and_explicit_values_pass_through() -> None:
    expected = MixedPrecision.BF16 if fast_bf16("cpu") else MixedPrecision.NO
    assert resolve_mixed_precision("auto", "cpu") is expected
    assert resolve_mixed_precision("bf16", "cpu") is MixedPrecision.BF16
    assert resolve_mixed_precision(MixedPrecision.NO, "cuda") is MixedPrecision.NO
    with pytest.raises(ValueError, match="bogus"):
        resolve_mixed_precision("bogus", "cpu")


def test_autocast_context_sets_the_compute_dtype() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    assert isinstance(autocast("cpu", MixedPrecision.NO), contextlib.nullcontext)
    with autocast("cpu", MixedPrecision.NO):
        assert (a @ b).dtype == torch.float32
    with autocast("cpu", MixedPrecision.BF16):
        assert (a @ b).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="resolve"):
        autocast("cpu", MixedPrecision.AUTO)


def test_bf16_engine_samples_close_to_float32(tiny_model: Any, tokenizer: Any) -> None:
    prompt = tokenizer("Name a fruit:")["input_ids"]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    exact = HFEngine(tiny_model, tokenizer, "tiny", batch_window_s=0.001)
    mixed = HFEngine(tiny_model, tokenizer, "tiny", batch_window_s=0.001, mixed_precision=MixedPrecision.BF16)
    try:
        (ref,) = exact.submit(prompt, params).result()
        (got,) = mixed.submit(prompt, params).result()
    finally:
        exact.close()
        mixed.close()
    assert len(got.ids) == len(got.logprobs) > 0
    assert all(lp <= 0.0 for lp in got.logprobs)
    # Greedy decoding agrees on the first token; its logprob differs by bf16 rounding only.
    assert got.ids[0] == ref.ids[0]
    assert got.logprobs[0] == pytest.approx(ref.logprobs[0], abs=0.1)
    assert got.logprobs[0] != ref.logprobs[0]  # bf16 really ran
    with pytest.raises(ValueError, match="resolve"):
        HFEngine(tiny_model, tokenizer, "tiny", mixed_precision=MixedPrecision.AUTO)


def test_bf16_trainer_keeps_float32_adapters_and_moves_them(make_model: Any) -> None:
    base = make_model().to(torch.bfloat16)
    trainer = TorchTrainer(
        base,
        TrainerConfig(lr=1e-2, micro_batch_size=2, lora=LoraSettings(r=4, alpha=8)),
        pad_token_id=PAD,
        mixed_precision=MixedPrecision.BF16,
    )
    samples = [make_sample(f"e{i}", 12, 4, seed=i) for i in range(len(ADVANTAGES))]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    first = trainer.step(samples, ADVANTAGES)
    trainer.step(samples, ADVANTAGES)
    assert {p.dtype for p in trainer.trainable_parameters} == {torch.float32}
    moved = [n for n, p in trainer.model.named_parameters() if "lora_" in n and not torch.equal(p, before[n])]
    assert sorted(moved) == sorted(before)
    assert torch.isfinite(torch.tensor(first.loss)) and first.grad_norm > 0


def test_full_finetuning_of_bf16_weights_is_refused() -> None:
    with pytest.raises(ValidationError, match="full fine-tuning of bfloat16 weights"):
        ServerConfig(dtype="bfloat16")
    lora = TrainingConfig(trainer=TrainerConfig(lora=LoraSettings(r=8, alpha=16)))
    assert ServerConfig(dtype="bfloat16", training=lora, mixed_precision="bf16").dtype == "bfloat16"
    assert ServerConfig(dtype="bfloat16", training=TrainingConfig(enabled=False)).dtype == "bfloat16"
    assert copy.deepcopy(ServerConfig(mixed_precision="auto")).mixed_precision is MixedPrecision.AUTO


def test_auto_weights_dtype_keeps_float32_for_full_finetuning() -> None:
    lora = TrainingConfig(trainer=TrainerConfig(lora=LoraSettings(r=8, alpha=16)))
    fast = "bfloat16" if fast_bf16("cpu") else "float32"
    assert ServerConfig(dtype="auto").weights_dtype == "float32"  # full fine-tuning: float32 masters
    assert ServerConfig(dtype="auto", training=lora).weights_dtype == fast
    assert ServerConfig(dtype="auto", training=TrainingConfig(enabled=False)).weights_dtype == fast
    assert ServerConfig(dtype="float16", training=lora).weights_dtype == "float16"
