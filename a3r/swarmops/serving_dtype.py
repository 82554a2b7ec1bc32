"""The weights dtype every server of a study serves, and whether its runs can be LoRA tenants in it.

One rule for all of a thread's servers (the preflight, a stage's tenant server, a run's own server and
the held-out evaluation on it), so the runs a study compares are served alike: the user's
``--serve-option dtype=…``, else ``auto`` (`study_dtype`). ``swarm serve`` resolves ``auto``
(`swarm.config.ServerConfig.weights_dtype`): bfloat16 where the device has fast bf16 kernels (CUDA
compute capability ≥ 8.0, AMX CPUs) unless full fine-tuning needs float32 master weights, else float32.
So on the H200 every LoRA and serve-only server of a study holds bfloat16 weights, and a full
fine-tuning run (``lora_rank`` 0, its own server) float32.

vLLM serves LoRA tenants in bfloat16 or float16 only (its LoRA kernels take no float32; a server without
tenants merges the adapter and pushes full weights, which float32 allows): on the vLLM engine a float32
the user asked keeps one server per run (`tenant_dtype_clash`), and the dry run says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["STUDY_DTYPE", "VLLM_TENANT_DTYPES", "study_dtype", "tenant_dtype_clash"]

STUDY_DTYPE = "auto"
"""The ``swarm serve --dtype`` of a thread's servers when the user gives none (bf16 where fast: 2-3×
faster rollouts and updates on AMX CPUs and GPUs; float32 elsewhere)."""

VLLM_TENANT_DTYPES = frozenset({"bfloat16", "float16", "auto"})
"""The ``--dtype`` values a vLLM tenant server accepts (``auto``: bfloat16 on Ampere or later GPUs)."""


def study_dtype(server_options: Mapping[str, Any]) -> str:
    """The ``swarm serve --dtype`` of every server a thread starts: the user's ``dtype`` server option
    (``server_options``), else `STUDY_DTYPE`."""
    return str(server_options.get("dtype") or STUDY_DTYPE)


def tenant_dtype_clash(server_options: Mapping[str, Any]) -> str | None:
    """Why a thread's runs cannot be LoRA tenants in its dtype (one line, for the dry run), or ``None``:
    on the vLLM engine (``engine=vllm``) a dtype its LoRA kernels cannot serve (``dtype=float32``)."""
    dtype = study_dtype(server_options)
    if str(server_options.get("engine", "hf")) != "vllm" or dtype in VLLM_TENANT_DTYPES:
        return None
    return f"vLLM serves LoRA tenants in bf16/fp16 only; dtype={dtype} asked"
