"""Methods added to every vLLM GPU worker (``worker_extension_cls``): receive new policy weights.

vLLM mixes this class into its worker in the engine-core process, so the methods run there, next to
the served model, and `swarm.engine.vllm.VLLMEngine` calls them with ``AsyncLLM.collective_rpc``.
The trainer's tensors stay on the GPU: the server sends CUDA IPC handles
(`torch.multiprocessing.reductions.reduce_tensor`), the worker maps the same device memory
(``rebuild_cuda_tensor``) and copies it into the served parameters with the model's own
``load_weights`` (which knows how Hugging Face names map onto vLLM's fused layers, e.g. q/k/v → qkv).

This module is imported by vLLM's worker, never by the server; it must not import vLLM at import time
beyond what a worker already has.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor

DEVICE_INDEX_ARG = 6
"""Position of the device index in ``reduce_tensor``'s rebuild arguments (rewritten to the worker's)."""


class WeightReceiver:
    """Mixed into vLLM's worker; ``self.device`` and ``self.model_runner`` are the worker's."""

    device: torch.device
    model_runner: Any

    def swarm_load_ipc_weights(self, payload: bytes) -> int:
        """Load ``(name, rebuild args)`` pairs pickled by the server (same host, same GPU).

        Args:
            payload: ``pickle.dumps(list[tuple[str, tuple]])``; each tuple is what
                ``reduce_tensor(t)[1]`` returned for a CUDA tensor of the trainer's model. The payload
                comes from the server that started this engine process, over vLLM's local IPC socket.

        Returns:
            The number of tensors loaded.
        """
        items: list[tuple[str, tuple[Any, ...]]] = pickle.loads(payload)
        weights = [(name, self._rebuild(args)) for name, args in items]
        self.model_runner.model.load_weights(weights=weights)
        torch.cuda.synchronize(self.device)
        return len(weights)

    def swarm_load_ipc_buckets(self, payload: bytes) -> list[tuple[float, float]]:
        """Load flat weight buckets sent by verl's actor rank 0 on this GPU (the direct weight path).

        Args:
            payload: ``pickle.dumps(list[tuple[Bucket, tuple]])``: each bucket's layout
                (`swarm.train.weight_buckets.Bucket`) and ``reduce_tensor(flat)[1]`` of its CUDA buffer,
                which the actor keeps alive until this returns. From the server that started this engine
                process, over vLLM's local IPC socket.

        Returns:
            Each buffer's fingerprint as read here, for the sender to compare with its own.
        """
        from swarm.train.weight_buckets import receive_buckets

        items = pickle.loads(payload)
        prints = receive_buckets(
            items, self._rebuild, lambda views: self.model_runner.model.load_weights(weights=views)
        )
        torch.cuda.synchronize(self.device)
        return prints

    def _rebuild(self, args: Any) -> torch.Tensor:
        """The sender's CUDA tensor mapped into this process (its device index rewritten to ours)."""
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        rebuilt = list(args)
        rebuilt[DEVICE_INDEX_ARG] = index
        tensor: torch.Tensor = rebuild_cuda_tensor(*rebuilt)
        return tensor
