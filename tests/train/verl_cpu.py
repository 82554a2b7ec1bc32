"""verl's real FSDP actor on the CPU, in one process: the harness of tests/train/test_verl_cpu.py.

verl 0.9.1 has no CPU platform and its worker group is Ray's, which places workers on GPUs. This module
registers a CPU platform through verl's own plugin registry (``PlatformRegistry``, ``VERL_PLATFORM``),
starts a one-rank gloo process group, and builds ``SwarmActorWorker`` (our subclass of verl's
``ActorRolloutRefWorker``) in this process: FSDP2, the optimizer, ``update_actor`` and verl's loss are
verl's code, unchanged; only Ray's dispatch is replaced by :class:`LocalWorkerGroup` (a direct call; a
``ONE_TO_ALL`` method's result wrapped in a one-rank list, as Ray's group returns it).

Process-global (the platform is resolved once, the process group is global): run it in a subprocess,
``python -m tests.train.verl_cpu SCENARIO DIR``; it prints one JSON line ``RESULT {...}`` that the test
reads. Scenarios: ``resume`` (and ``resume-lora``): AdamW continued across a checkpoint; ``lora``: the
actor's adapters reach the served copy; ``async``: a live server with ``--trainer verl`` and
``max_staleness = 1``; ``stale``: a batch with episodes one policy version stale, verl against the torch
trainer; ``snapshots``: two checkpoints by one actor, with this torch's DCP stager and torch 2.11.0's.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

CPU_ENV = {
    "VERL_PLATFORM": "cpu",  # our platform below, not verl's auto-detection (which falls back to CUDA)
    "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda/npu only; it runs on ours
    "RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_RANK": "0",
}


class _CpuDeviceModule(ModuleType):
    """``torch.cpu`` plus the CUDA-module calls verl makes for memory logging and cache clearing."""

    def __getattr__(self, name: str) -> Any:
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name == "get_device_name":
            return lambda *a, **k: "CPU"
        if name == "mem_get_info":
            return lambda *a, **k: (0, 0)
        if name.startswith(("memory", "max_memory", "reset_")) or name in ("empty_cache", "ipc_collect"):
            return lambda *a, **k: 0
        raise AttributeError(name)


def install_cpu_platform(port: int) -> None:
    """Register the CPU platform with verl and start the one-rank gloo group (before any verl call)."""
    os.environ.update(CPU_ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    device = _CpuDeviceModule("verl_cpu_device")

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):  # type: ignore[misc]
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = device

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:  # verl moves tensors `.to(current_device())`
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index: int | None = None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    torch.distributed.init_process_group("gloo", rank=0, world_size=1, init_method="env://")


class LocalWorkerGroup:
    """One in-process worker called as Ray's worker group would call it (``ONE_TO_ALL``: a list)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def __getattr__(self, name: str) -> Any:
        from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch

        method = getattr(self.worker, name)
        if getattr(method, MAGIC_ATTR, {}).get("dispatch_mode") is Dispatch.ONE_TO_ALL:
            return lambda *args, **kwargs: [method(*args, **kwargs)]
        return method


def cpu_worker_group(node: Any, role: str) -> LocalWorkerGroup:
    """`VerlTrainer`'s ``worker_group``: our verl worker built and initialised in this process."""
    from swarm.train.verl_backend import _worker_class

    worker = _worker_class()(node, role)
    worker.init_model()
    return LocalWorkerGroup(worker)


def save_tiny_model(directory: Path, seed: int = 0) -> None:
    """A random 2-layer Llama with SmolLM2's tokenizer (verl's actor loads both) saved to ``directory``."""
    from transformers import AutoTokenizer

    from swarm.engine import resolve_model
    from tests.conftest import build_tiny_model

    source = resolve_model(None)
    build_tiny_model(source, seed=seed).save_pretrained(directory)
    AutoTokenizer.from_pretrained(str(source.directory), local_files_only=True).save_pretrained(directory)


def main() -> None:
    from tests.train import verl_cpu_scenarios

    scenario, folder = sys.argv[1], Path(sys.argv[2])
    install_cpu_platform(int(sys.argv[3]))
    result = verl_cpu_scenarios.SCENARIOS[scenario](folder)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
