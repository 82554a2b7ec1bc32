"""``bench/weight_delta.py`` at a tiny size: real sampling and GRPO steps on the tiny model, every
column filled, decode equal to the new cast, the summary and ``--json`` payload consistent."""

from __future__ import annotations

import json
from typing import Any

import torch
import weight_delta
from rich.console import Console

from tests.conftest import build_tiny_model


def test_a_tiny_run_fills_every_column(embedded_source: Any, tokenizer: Any, torch_threads: None) -> None:
    settings = weight_delta.Settings(
        steps=2,
        tasks=2,
        group=2,
        max_tokens=4,
        threads=1,
        repeats=1,
        arms=(weight_delta.Arm("full", 1e-3), weight_delta.Arm("lora", 1e-2, lora_rank=4)),
    )
    model = build_tiny_model(embedded_source)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    rows = weight_delta.run(model, tokenizer, settings)
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())  # arms train copies
    assert [(r.arm, r.step, r.dtype) for r in rows] == [
        (arm, step, dtype)
        for arm in ("full", "lora")
        for step in (1, 2)
        for dtype in ("bf16", "fp16", "fp32")
    ]
    for r in rows:
        size = 4 if r.dtype == "fp32" else 2
        assert 0 < r.elements_changed <= r.elements and r.dense_bytes == size * r.elements
        assert r.sparse_index_bytes == (4 + size) * r.elements_changed
        assert r.fp8_delta_bytes > r.elements and 0.0 <= r.fp8_exact_changed <= r.fp8_exact <= 1.0
        assert (r.encode_index_s is not None) == (r.dtype == "bf16")
        assert (r.adapter_elements is not None) == (r.arm == "lora")
    lora = [r for r in rows if r.arm == "lora"]
    assert all(r.tensors_changed < r.tensors for r in lora)  # embeddings and norms are not adapted
    console = Console(record=True, width=240)
    result = weight_delta.report(rows, settings, console)
    text = console.export_text()
    assert "break-even" in text and "ASSUMED" in text and "100 GbE" in text
    arms = {a["arm"]: a for a in json.loads(json.dumps(result))["arms"]}
    assert arms["lora"]["ratio_changed_tensors"] < arms["full"]["ratio_changed_tensors"]
    assert 0 < arms["lora"]["ratio_adapters"] < 1
    assert len(arms["full"]["links_1p5b"]) == len(weight_delta.LINKS)


def test_the_encodings_round_trip() -> None:
    g = torch.Generator().manual_seed(0)
    prev = torch.randn(1000, generator=g).to(torch.bfloat16)
    new = prev.clone()
    new[::7] = (new[::7].float() * 1.01).to(torch.bfloat16)
    index, values = weight_delta.encode_index(prev, new)
    assert index.dtype == torch.int32 and values.dtype == torch.bfloat16
    for encode, decode in (
        (weight_delta.encode_index, weight_delta.decode_index),
        (weight_delta.encode_bitmap, weight_delta.decode_bitmap),
    ):
        engine = prev.clone()
        decode(engine, *encode(prev, new))
        assert torch.equal(engine, new)
    assert weight_delta.fp8_delta_exact(prev, prev) == 1000
