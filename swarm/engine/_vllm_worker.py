"""Methods added to every vLLM GPU worker (``worker_extension_cls``): receive new policy weights.

vLLM mixes this class into its worker in the engine-core process, so the methods run there, next to
the served model, and `swarm.engine.vllm.VLLMEngine` calls them with ``AsyncLLM.collective_rpc``.
The trainer's tensors stay on the GPU: the server sends CUDA IPC handles
(`torch.multiprocessing.reductions.reduce_tensor`), the worker maps the same device memory
(``rebuild_cuda_tensor``) and copies it into the served parameters with the model's own
``load_weights`` (which knows how Hugging Face names map onto vLLM's fused layers, e.g. q/k/v → qkv).

When verl's actor runs on other GPUs (or nodes) the worker joins a broadcast group with the actor's rank 0
instead (`swarm_join_weight_group`) and receives each bucket from it (`swarm_receive_broadcast_buckets`,
`swarm.train.weight_transport`). The CPU tests run these methods on a plain instance of this class in a
second process, over gloo, as vLLM runs them over NCCL.

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
    _swarm_group: Any = None
    """The broadcast group of `swarm_join_weight_group` (a `BroadcastGroup`) and its timeout, once joined."""
    _swarm_group_timeout_s: float = 0.0

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

    def swarm_device_identity(self) -> dict[str, str | None]:
        """Where this worker runs, for the trainer to choose CUDA IPC or a broadcast group: the fields of
        `swarm.train.weight_transport.DeviceIdentity` (host, address, device, GPU UUID) as a plain dict,
        which vLLM's RPC carries as it is (msgpack; a dataclass would come back as a dict anyway)."""
        import dataclasses

        from swarm.train.weight_transport import local_identity

        return dataclasses.asdict(local_identity(self.device))

    def swarm_join_weight_group(self, payload: bytes) -> int:
        """Join the broadcast group of verl's actor rank 0 (other GPUs or nodes), bounded by its timeout.

        Args:
            payload: ``pickle.dumps((GroupAddress, rank_offset))``; this worker's rank in the group is
                ``rank_offset`` + its rank in vLLM (0 without tensor parallelism).

        Returns:
            This worker's rank in the group.

        Raises:
            WeightSyncError: the group did not form within its timeout, or failed to.
        """
        from swarm.train.weight_buckets import bounded
        from swarm.train.weight_transport import open_broadcast_group

        address, rank_offset = pickle.loads(payload)
        rank = rank_offset + int(getattr(self, "rank", 0))
        self._swarm_group = bounded(
            lambda: open_broadcast_group(address, rank, self.device),
            timeout_s=address.timeout_s,
            what="the engine joining the weight group",
        )
        self._swarm_group_timeout_s = address.timeout_s
        return rank

    def swarm_receive_broadcast_buckets(self, payload: bytes) -> list[tuple[float, float]]:
        """Receive the actor's buckets over the group of `swarm_join_weight_group` and load them.

        Args:
            payload: ``pickle.dumps(list[Bucket])``: the layouts, in the order rank 0 broadcasts them.

        Returns:
            Each buffer's fingerprint as received here, for the sender to compare with its own.

        Raises:
            RuntimeError: no group joined yet.
            WeightSyncError: a broadcast failed or the sync took longer than the group's timeout.
        """
        from swarm.train.weight_transport import receive_broadcast

        if self._swarm_group is None:
            raise RuntimeError("this worker has joined no weight group (swarm_join_weight_group first)")
        return receive_broadcast(
            self._swarm_group,
            pickle.loads(payload),
            lambda views: self.model_runner.model.load_weights(weights=views),
            timeout_s=self._swarm_group_timeout_s,
        )

    def _rebuild(self, args: Any) -> torch.Tensor:
        """The sender's CUDA tensor mapped into this process (its device index rewritten to ours)."""
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        rebuilt = list(args)
        rebuilt[DEVICE_INDEX_ARG] = index
        tensor: torch.Tensor = rebuild_cuda_tensor(*rebuilt)
        return tensor
