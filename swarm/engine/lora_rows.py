"""Rows of several LoRA adapters in one forward pass: the base once over every row, each adapter's term on
its own rows only.

The ``hf`` engine samples the rows of different LoRA tenants in one batch
(docs/ARCHITECTURE.md §LoRA tenants). peft can do this itself (``adapter_names``, one name per row), but for every LoRA layer and every
adapter in the batch it gathers that adapter's rows by index, runs them through ``lora_A`` and ``lora_B``,
scales the result and scatters it back: about seven small ops per adapter and layer per forward, and a
decode step is one forward. On 2 CPU cores (SmolLM2-135M, LoRA r8 on every projection, 8 adapters, 32
rows × 16 new tokens, one torch thread) that made a mixed batch cost 1.65× the same batch through plain
weights (9.07 s against 5.50 s of CPU).

:func:`adapter_rows` computes the same thing with rows sorted by adapter, so each adapter's rows are one
contiguous span: the model runs with its adapters disabled (peft's ``disable_adapter``: the base layers
only), and a forward hook on each LoRA linear layer adds, for each span, ``(α/r)·B·A·x`` of the span's
adapter to the span's rows of the output in place: two matrix products per adapter and layer, on views
(no gather, no scatter). The same batch then costs 1.17× the plain one (6.44 s). The sum is the one peft
forms (LoRA, Hu et al. 2021, eq. 3); float rounding may differ in the last bits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["Span", "adapter_rows", "spans_of", "supports_adapter_rows"]


@dataclass(frozen=True)
class Span:
    """Rows ``start:end`` (of dimension 0) of a batch sample with adapter ``name``."""

    name: str
    start: int
    end: int


def spans_of(adapters: Sequence[str | None]) -> list[Span]:
    """The spans of consecutive equal adapter names (``None``: the base, no span).

    Args:
        adapters: one adapter name per row, rows of one adapter adjacent (sort them first).

    Raises:
        ValueError: an adapter's rows are not adjacent.
    """
    spans: list[Span] = []
    start = 0
    for i in range(1, len(adapters) + 1):
        if i < len(adapters) and adapters[i] == adapters[start]:
            continue
        name = adapters[start]
        if name is not None:
            if any(s.name == name for s in spans):
                raise ValueError(f"the rows of adapter {name!r} are not adjacent")
            spans.append(Span(name, start, i))
        start = i
    return spans


def _lora_layers(model: nn.Module) -> list[Any]:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def supports_adapter_rows(model: nn.Module) -> bool:
    """Whether :func:`adapter_rows` can serve ``model``: a peft model whose LoRA layers are all plain
    unmerged linear LoRA (no DoRA or other variant, no LoRA bias, no ``fan_in_fan_out``). Otherwise use
    peft's ``adapter_names``."""
    from peft import PeftModel
    from peft.tuners.lora import Linear as LoraLinear

    if not isinstance(model, PeftModel):
        return False
    for layer in _lora_layers(model):
        if type(layer) is not LoraLinear or layer.fan_in_fan_out or layer.merged or layer.lora_variant:
            return False
        if any(b.bias is not None for b in layer.lora_B.values()):
            return False
    return True


def _add_spans(layer: Any, spans: Sequence[Span], x: torch.Tensor, out: torch.Tensor) -> None:
    """Add each span's adapter term to ``out`` (the base layer's output for input ``x``) in place.

    Shapes: ``x`` (B, …, d_in), ``out`` (B, …, d_out); a span selects rows of dimension 0.
    """
    for span in spans:
        if span.name not in layer.lora_A:
            continue  # this layer is not one of the adapter's targets
        a_RD = layer.lora_A[span.name].weight
        b_OR = layer.lora_B[span.name].weight
        scale = float(layer.scaling[span.name])
        x_span, out_span = x[span.start : span.end], out[span.start : span.end]
        if out_span.is_contiguous() and x_span.dtype == out_span.dtype == a_RD.dtype == b_OR.dtype:
            x_TD = x_span.reshape(-1, x_span.shape[-1])
            out_span.view(-1, out_span.shape[-1]).addmm_(x_TD @ a_RD.t(), b_OR.t(), alpha=scale)
        else:  # autocast, mixed dtypes: peft's own order of operations
            delta = F.linear(F.linear(x_span.to(a_RD.dtype), a_RD), b_OR) * scale
            out_span.add_(delta.to(out_span.dtype))


@contextlib.contextmanager
def adapter_rows(model: nn.Module, spans: Sequence[Span]) -> Iterator[None]:
    """Within the block, a forward of ``model`` (a peft model, `supports_adapter_rows`) applies to the
    rows of each span that span's adapter only, and to every other row the base alone.

    Not thread-safe: no other forward of ``model`` may run meanwhile (the ``hf`` engine holds its lock;
    a tenant's training step takes the same lock). The adapters are enabled again on exit.
    """
    if not spans:
        with model.disable_adapter():  # type: ignore[operator]
            yield
        return
    handles = []
    for layer in _lora_layers(model):

        def hook(module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
            _add_spans(module, spans, args[0], output)
            return output

        handles.append(layer.register_forward_hook(hook))
    try:
        with model.disable_adapter():  # type: ignore[operator]
            yield
    finally:
        for handle in handles:
            handle.remove()
