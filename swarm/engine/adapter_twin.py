"""A sampling twin of a multi-adapter peft model: the same frozen base weights, its own adapter tensors.

With LoRA tenants on the ``hf`` engine (docs/ARCHITECTURE.md §LoRA tenants) the trainer trains one
tenant's adapter in the peft model that holds every tenant's adapter (the *training tree*). If the engine
sampled that very module, sampling would have to pause during every tenant's step: the step changes the
adapter being sampled, and the engine's per-batch state (`swarm.engine.lora_rows` hooks, peft's disabled
adapters) lives on the modules the trainer runs. :func:`sampling_twin` builds a second module tree (the
*sampling tree*) whose base parameters are the training tree's own ``Parameter`` objects (no copy of the
base: the base is frozen, both trees only read it) and whose LoRA tensors are copies. The engine samples
every tenant on the twin while a tenant's step trains on the training tree; after the step
:func:`copy_adapter` copies that tenant's new tensors into the twin (under the engine's lock, between
batches), so every row is sampled by exactly the adapter version its record names.

Memory: the adapters (A and B of every LoRA layer) are held twice; the base once. Module objects and
buffers (a few kB: rotary frequencies) are copied.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

__all__ = ["copy_adapter", "drop_twin_adapter", "sampling_twin"]


def _is_adapter(name: str) -> bool:
    """Whether a parameter name is a LoRA tensor (``…lora_A.<adapter>.weight``, ``lora_embedding_B`` …)."""
    return "lora_" in name


def sampling_twin(model: nn.Module) -> nn.Module:
    """A copy of the peft model ``model`` sharing its base parameters, with copies of its adapters.

    Every parameter whose name is not a LoRA tensor is the same ``Parameter`` object in both trees
    (same storage); every LoRA tensor is a fresh copy, detached and frozen (``requires_grad`` false).
    Call it while nothing runs ``model`` (a forward hook registered during a forward would be copied).

    Raises:
        ValueError: ``model`` has no LoRA tensor (not a peft model with an adapter).
    """
    params = dict(model.named_parameters())
    if not any(_is_adapter(n) for n in params):
        raise ValueError("a sampling twin needs a peft model with at least one LoRA adapter")
    memo: dict[int, Any] = {id(p): p for n, p in params.items() if not _is_adapter(n)}
    twin = copy.deepcopy(model, memo)
    for param in twin.parameters():
        param.requires_grad_(False)
    return twin.eval()


@torch.no_grad()
def copy_adapter(source: nn.Module, twin: nn.Module, name: str) -> None:
    """Copy adapter ``name``'s tensors of ``source`` (the training tree) into ``twin`` in place; a new
    adapter is first added to ``twin`` with ``source``'s LoRA config.

    Raises:
        KeyError: ``source`` has no adapter ``name``.
    """
    configs: dict[str, Any] = source.peft_config  # type: ignore[assignment]
    twin_configs: dict[str, Any] = twin.peft_config  # type: ignore[assignment]
    if name not in twin_configs:
        twin.add_adapter(name, copy.deepcopy(configs[name]))  # type: ignore[operator]
    marker = f".{name}."
    targets = {n: p for n, p in twin.named_parameters() if _is_adapter(n) and marker in n}
    sources = {n: p for n, p in source.named_parameters() if _is_adapter(n) and marker in n}
    if sources.keys() != targets.keys():
        raise KeyError(f"adapter {name!r}: the twin's tensors do not match the training tree's")
    for key, param in sources.items():
        target = targets[key]
        target.requires_grad_(False)
        target.copy_(param)


def drop_twin_adapter(twin: nn.Module, name: str) -> None:
    """Delete adapter ``name`` from ``twin`` (its copies are freed); nothing if it has none."""
    configs: dict[str, Any] = twin.peft_config  # type: ignore[assignment]
    if name in configs:
        twin.delete_adapter(name)  # type: ignore[operator]
