"""Mixed precision: where forward passes compute in bfloat16/float16 while weights keep their dtype.

The weights' storage dtype (``ServerConfig.dtype``) and the compute dtype are separate choices, as in
PyTorch AMP and 🤗 Accelerate's ``mixed_precision``: ``MixedPrecision.BF16`` runs every forward pass
(generation and training) under :func:`torch.autocast`, so matrix products use bfloat16 kernels
(AMX/AVX512-BF16 on recent Xeons, tensor cores on GPUs) while trainable parameters, their gradients and
AdamW states stay float32. Log-softmax and the losses are computed in float32 from the bf16 logits.

Measured on this project's CI machine (2 cores of a Sapphire Rapids Xeon with AMX, SmolLM2-135M,
``bench/precision.py``): sampling 2.2× faster with bf16 weights, GRPO updates 1.4-1.5× faster.

The price: logits carry bf16 rounding (relative error ~4e-3), so recorded sampler logprobs and the
trainer's recomputation differ by that noise instead of ~1e-6; the PPO ratio absorbs it (clip ε = 0.2).
Use ``MixedPrecision.NO`` (the ``swarm serve`` default) for float32-exact logprobs.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from enum import StrEnum

import torch

__all__ = [
    "MixedPrecision",
    "autocast",
    "fast_bf16",
    "require_resolved",
    "resolve_dtype",
    "resolve_mixed_precision",
]


class MixedPrecision(StrEnum):
    """Compute dtype of forward passes (weights keep their storage dtype)."""

    NO = "no"
    """Compute in the weights' dtype (float32 weights: exact logprobs)."""
    BF16 = "bf16"
    """``torch.autocast`` to bfloat16."""
    FP16 = "fp16"
    """``torch.autocast`` to float16 (GPUs without bfloat16; no loss scaling: prefer ``bf16``)."""
    AUTO = "auto"
    """``bf16`` where the device has fast bfloat16 kernels (see :func:`fast_bf16`), else ``no``."""


def fast_bf16(device: str | torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products faster than float32.

    CUDA: compute capability ≥ 8.0 (Ampere and later). CPU: AMX tiles or AVX512-BF16 (Sapphire Rapids
    and later Xeons, Zen 4); elsewhere bf16 on CPU is emulated and slower than float32.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(dev)[0] >= 8
    if dev.type == "cpu":
        probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # torch.cpu, torch >= 2.1
        return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)
    return False


def resolve_mixed_precision(precision: MixedPrecision | str, device: str | torch.device) -> MixedPrecision:
    """``AUTO`` resolved for ``device``; other values are returned unchanged.

    Raises:
        ValueError: Not a :class:`MixedPrecision` value.
    """
    value = MixedPrecision(precision)
    if value is MixedPrecision.AUTO:
        return MixedPrecision.BF16 if fast_bf16(device) else MixedPrecision.NO
    return value


def resolve_dtype(dtype: str, device: str | torch.device, *, full_finetuning: bool) -> str:
    """The weights' storage dtype: ``"auto"`` is ``"bfloat16"`` where bf16 is fast (:func:`fast_bf16`)
    and no full fine-tuning needs float32 master weights, else ``"float32"``; other values unchanged."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if fast_bf16(device) and not full_finetuning else "float32"


def require_resolved(precision: MixedPrecision) -> None:
    """Raises:
    ValueError: ``precision`` is ``AUTO`` (resolve it with :func:`resolve_mixed_precision` first)."""
    if precision is MixedPrecision.AUTO:
        raise ValueError("resolve MixedPrecision.AUTO with resolve_mixed_precision() before use")


def autocast(device: str | torch.device, precision: MixedPrecision) -> AbstractContextManager[object]:
    """The autocast context for ``precision`` on ``device`` (a no-op context for ``NO``).

    Raises:
        ValueError: ``AUTO`` (resolve it first with :func:`resolve_mixed_precision`).
    """
    require_resolved(precision)
    if precision is MixedPrecision.NO:
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision is MixedPrecision.BF16 else torch.float16
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)
