"""Several named LoRA adapters over one frozen base model (peft), one of them seen as a plain LoRA model.

A server with LoRA tenants (``swarm serve --tenants N``, `swarm.server.tenants`) holds one peft model
whose LoRA layers carry one adapter per tenant, named by the tenant id. :func:`add_adapter` injects a new
one (the first wraps the base model), :func:`remove_adapter` deletes one, and :class:`NamedAdapter` is one
adapter as the checkpoint code sees a single-adapter peft model: its :meth:`NamedAdapter.state_dict` holds
its LoRA tensors under the names a single-adapter checkpoint uses, and :meth:`NamedAdapter.save_pretrained`
writes ``adapter_model.safetensors`` + ``adapter_config.json`` at the folder's root, so every tenant
checkpoint loads with ``PeftModel.from_pretrained(base, folder)`` like a one-policy LoRA run's.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from swarm.train.config import LoraSettings

__all__ = ["NamedAdapter", "adapter_parameters", "add_adapter", "remove_adapter"]


def _peft_config(lora: LoraSettings) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


_PEFT_PROBE = r"`is_gradient_checkpointing` is deprecated"
"""transformers' FutureWarning raised when peft's ``PeftModel.__init__`` reads the base model's deprecated
``is_gradient_checkpointing`` (peft's call, not ours: printed on every tenants server's first adapter)."""


def _quiet_peft_probe() -> None:
    """Ignore that one warning (`_PEFT_PROBE`, from transformers, as a FutureWarning) and nothing else.
    A filter rather than ``warnings.catch_warnings``, which is not thread-safe; adding the same filter
    again replaces it, so calling this before each wrap is idempotent."""
    warnings.filterwarnings("ignore", message=_PEFT_PROBE, category=FutureWarning, module=r"transformers\.")


def add_adapter(model: nn.Module, name: str, lora: LoraSettings, *, seed: int | None = None) -> nn.Module:
    """Inject a new LoRA adapter ``name`` (peft's init: A Kaiming-uniform, B zero, so it starts as the
    base); returns the peft model holding it. Its config's ``base_model_name_or_path`` is the base's
    ``config.name_or_path`` (the folder ``from_pretrained`` loaded), so its checkpoints name their base.

    Args:
        model: the base model (the first adapter wraps it with ``get_peft_model``, in place) or the peft
            model of the earlier adapters.
        name: the adapter's name (a tenant id); must not be in use.
        lora: rank, alpha, dropout and target modules.
        seed: seeds the A matrices' initialisation (``None``: torch's global generator).

    Raises:
        ValueError: ``name`` is already an adapter of ``model``.
    """
    from peft import PeftModel, get_peft_model

    with torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext():
        if seed is not None:
            torch.manual_seed(seed)
        if isinstance(model, PeftModel):
            if name in model.peft_config:
                raise ValueError(f"adapter {name!r} exists already")
            model.add_adapter(name, _peft_config(lora))
            peft = model
        else:
            _quiet_peft_probe()
            peft = get_peft_model(model, _peft_config(lora), adapter_name=name)  # type: ignore[arg-type, unused-ignore]
    if peft.active_adapter not in peft.peft_config:
        # every earlier adapter was deleted: peft's delete_adapter leaves the last one named active, and
        # whatever reads the active adapter's config (get_base_model, save_pretrained) would raise KeyError
        peft.set_adapter(name)
    config = peft.peft_config[name]
    if not config.base_model_name_or_path:  # peft reads it from the model's __dict__, which lacks it now
        # the served model's folder (from_pretrained's path), so its checkpoint names its base
        config.base_model_name_or_path = (
            getattr(getattr(peft.base_model.model, "config", None), "name_or_path", None) or None
        )
    for param_name, param in peft.named_parameters():  # the base is frozen; each step unfreezes its adapter
        if f".{name}." in param_name:
            param.requires_grad_(False)
    peft.eval()
    return peft


def remove_adapter(model: nn.Module, name: str) -> None:
    """Delete adapter ``name`` from the peft model ``model`` (its tensors are freed)."""
    model.delete_adapter(name)  # type: ignore[operator]


def adapter_parameters(model: nn.Module, name: str) -> list[nn.Parameter]:
    """The LoRA parameters of adapter ``name`` (``…lora_A.<name>.weight`` and ``…lora_B.<name>.weight``)."""
    return [p for n, p in model.named_parameters() if "lora_" in n and f".{name}." in n]


class NamedAdapter:
    """Adapter ``name`` of a multi-adapter peft model, shaped like a single-adapter peft model for the
    checkpoint code (`swarm.server.checkpoints`): ``peft_config``, :meth:`state_dict`,
    :meth:`save_pretrained` and :meth:`load_adapter_weights`.

    Args:
        model: the peft model holding the adapter.
        name: the adapter's name.
    """

    def __init__(self, model: nn.Module, name: str) -> None:
        self.model = model
        self.name = name

    @property
    def peft_config(self) -> dict[str, Any]:
        """``{"default": its LoraConfig}`` (a single-adapter model's)."""
        configs: dict[str, Any] = self.model.peft_config  # type: ignore[assignment]
        return {"default": configs[self.name]}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Its LoRA tensors (live, detached) under single-adapter checkpoint names (no adapter name)."""
        from peft import get_peft_model_state_dict

        out: dict[str, torch.Tensor] = get_peft_model_state_dict(self.model, adapter_name=self.name)
        return out

    def save_pretrained(
        self, path: Path | str, *, safe_serialization: bool = True, state_dict: dict[str, Any] | None = None
    ) -> None:
        """Write ``adapter_model.safetensors`` and ``adapter_config.json`` into ``path`` (a LoRA checkpoint
        ``PeftModel.from_pretrained`` loads); ``state_dict`` (a snapshot) replaces the live tensors."""
        from safetensors.torch import save_file

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        weights = self.state_dict() if state_dict is None else state_dict
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in weights.items()},
            str(folder / "adapter_model.safetensors"),
        )
        config = self.peft_config["default"]
        config.save_pretrained(str(folder))

    def load_adapter_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Load a checkpoint's ``adapter_model.safetensors`` tensors into this adapter, in place.

        Raises:
            ValueError: the tensors do not match the adapter (a checkpoint of another rank or targets).
        """
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, weights, adapter_name=self.name)
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if unexpected:
            raise ValueError(f"adapter {self.name!r}: the checkpoint has unexpected tensors {unexpected[:5]}")
