"""Rows of several LoRA adapters in one forward (`swarm.engine.lora_rows`): the same logits as peft's own
mixed-adapter batch (``adapter_names``), the base rows untouched, the model as it was afterwards.

A tiny random model of the embedded architecture (fp32, CPU); LoRA on every projection, B matrices made
non-zero so each adapter changes the output.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from swarm.engine import ModelSource
from swarm.engine.lora_rows import Span, adapter_rows, spans_of, supports_adapter_rows
from swarm.precision import MixedPrecision, autocast
from swarm.train.adapters import add_adapter
from swarm.train.config import LoraSettings
from tests.conftest import build_tiny_model

LORA = LoraSettings(r=4, alpha=8)
ADAPTERS = ["alpha", "beta", "gamma"]


@pytest.fixture()
def peft(embedded_source: ModelSource) -> Any:
    model: Any = build_tiny_model(embedded_source)
    for seed, name in enumerate(ADAPTERS, start=1):
        model = add_adapter(model, name, LORA, seed=seed)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for key, param in model.named_parameters():
            if "lora_B" in key:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor, list[str | None]]:
    """7 left-padded rows, sorted by adapter: base, alpha ×2, beta ×3, gamma."""
    generator = torch.Generator().manual_seed(3)
    ids_BL = torch.randint(5, 1000, (7, 9), generator=generator)
    attention_BL = torch.ones_like(ids_BL)
    attention_BL[2, :3] = 0
    attention_BL[5, :1] = 0
    names: list[str | None] = [None, "alpha", "alpha", "beta", "beta", "beta", "gamma"]
    return ids_BL, attention_BL, names


@torch.no_grad()
def _peft_logits(model: Any, ids: torch.Tensor, attention: torch.Tensor, names: list[str | None]) -> Any:
    names_kw = [n or "__base__" for n in names]
    return model(input_ids=ids, attention_mask=attention, adapter_names=names_kw).logits


@torch.no_grad()
def _rows_logits(model: Any, ids: torch.Tensor, attention: torch.Tensor, names: list[str | None]) -> Any:
    with adapter_rows(model, spans_of(names)):
        return model(input_ids=ids, attention_mask=attention).logits


def test_a_mixed_batch_equals_peft_s_mixed_batch(peft: Any) -> None:
    ids, attention, names = _batch()
    assert supports_adapter_rows(peft)
    expected = _peft_logits(peft, ids, attention, names)
    got = _rows_logits(peft, ids, attention, names)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # each adapter changed its rows (the comparison is not between two base forwards)
    base = _peft_logits(peft, ids, attention, [None] * len(names))
    assert torch.equal(got[0], base[0])
    for b in range(1, len(names)):
        assert (got[b] - base[b]).abs().max() > 1e-3, b


def test_the_model_is_as_before_after_the_block(peft: Any) -> None:
    ids, attention, names = _batch()
    peft.set_adapter("beta")
    with torch.no_grad():
        before = peft(input_ids=ids, attention_mask=attention).logits
    _rows_logits(peft, ids, attention, names)
    with torch.no_grad():
        after = peft(input_ids=ids, attention_mask=attention).logits
    assert torch.equal(before, after)  # adapters enabled again, the active one unchanged
    hooks = sum(len(m._forward_hooks) for m in peft.modules())
    assert hooks == 0


def test_a_mixed_batch_under_bf16_autocast_follows_peft(peft: Any) -> None:
    ids, attention, names = _batch()
    with autocast(torch.device("cpu"), MixedPrecision.BF16):
        expected = _peft_logits(peft, ids, attention, names).float()
        got = _rows_logits(peft, ids, attention, names).float()
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


def test_spans_group_adjacent_rows_and_skip_the_base() -> None:
    assert spans_of([None, "a", "a", "b", None]) == [Span("a", 1, 3), Span("b", 3, 4)]
    assert spans_of([]) == []
    assert spans_of([None, None]) == []
    with pytest.raises(ValueError, match="not adjacent"):
        spans_of(["a", "b", "a"])


def test_models_it_cannot_serve_are_refused(embedded_source: ModelSource) -> None:
    from peft import LoraConfig, get_peft_model

    plain = build_tiny_model(embedded_source)
    assert not supports_adapter_rows(plain)
    dora = get_peft_model(plain, LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    assert not supports_adapter_rows(dora)
