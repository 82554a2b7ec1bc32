"""vLLM's worker side of the broadcast weight path in a real second process, on the CPU.

:class:`ProcessEngine` starts a child process that holds a plain instance of vLLM's worker extension
(`swarm.engine._vllm_worker.WeightReceiver`, the class vLLM mixes into its GPU worker) with ``device =
cpu`` and a model whose ``load_weights`` keeps copies of what it is given; the parent calls the worker's
methods over a pipe with the payloads `VLLMEngine` sends through ``collective_rpc``. So the protocol
between verl's actor rank 0 and vLLM's workers (group forming, bucket order, buffers from the layouts,
fingerprints, timeouts) runs across two processes, over gloo on loopback where vLLM uses NCCL.

Modes of the child, for the failures a real transfer has: ``corrupt`` (each received buffer altered
before the worker reads it: the bytes that arrived are not the bytes sent), ``silent`` (joins the group,
then never receives), ``absent`` (never joins).
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from swarm.engine._vllm_worker import WeightReceiver

HANG_S = 3600.0
"""How long a ``silent`` or ``absent`` child sleeps instead of answering (the parent kills it first)."""


class _KeepingModel:
    """Stands in for vLLM's model: ``load_weights`` copies each view (vLLM copies into its parameters)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, view in weights:
            self.weights[name] = view.clone()


class _ModelRunner:
    def __init__(self) -> None:
        self.model = _KeepingModel()


def _serve(conn: Connection, mode: str) -> None:
    """The child: a `WeightReceiver` on the CPU answering ``(method, args)`` until the pipe closes."""
    torch.set_num_threads(1)
    worker = WeightReceiver()
    worker.device = torch.device("cpu")
    worker.model_runner = _ModelRunner()
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        if (mode == "absent" and method == "swarm_join_weight_group") or (
            mode == "silent" and method == "swarm_receive_broadcast_buckets"
        ):
            time.sleep(HANG_S)
        try:
            if method == "weights":
                result: Any = worker.model_runner.model.weights
            else:
                result = getattr(worker, method)(*args)
            if method == "swarm_join_weight_group" and mode == "corrupt":
                _corrupt(worker)
            conn.send(("ok", result))
        except Exception as exc:  # sent back as the RPC's error, as vLLM's collective_rpc does
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _corrupt(worker: WeightReceiver) -> None:
    """Alter the last element of every buffer the group fills (a transfer that delivers other bytes)."""
    group = worker._swarm_group
    receive = group._broadcast

    def altered(tensor: torch.Tensor) -> None:
        receive(tensor)
        tensor[-1] += 1.0

    group._broadcast = altered


class ProcessEngine:
    """The engine side of the broadcast path as `VLLMEngine` offers it (``weight_sync_devices``,
    ``join_weight_group``, ``receive_weight_buckets``), its one worker in a child process."""

    def __init__(self, mode: str = "ok") -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, mode), daemon=True)
        self._process.start()
        self.policy_version = 0

    def _rpc(self, method: str, *args: Any) -> Any:
        self._conn.send((method, args))
        status, result = self._conn.recv()
        if status == "error":
            raise RuntimeError(result)
        return result

    def weight_sync_devices(self) -> list[Any]:
        from swarm.train.weight_transport import DeviceIdentity

        return [DeviceIdentity(**self._rpc("swarm_device_identity"))]

    def join_weight_group(self, address: Any, rank_offset: int) -> None:
        self._rpc("swarm_join_weight_group", pickle.dumps((address, rank_offset)))

    def receive_weight_buckets(self, buckets: list[Any], policy_version: int) -> list[tuple[float, float]]:
        prints: list[tuple[float, float]] = self._rpc(
            "swarm_receive_broadcast_buckets", pickle.dumps(buckets)
        )
        self.policy_version = policy_version
        return prints

    def weights(self) -> dict[str, torch.Tensor]:
        """What the worker's model holds now (name → tensor)."""
        result: dict[str, torch.Tensor] = self._rpc("weights")
        return result

    def close(self) -> None:
        self._conn.close()
        self._process.kill()
        self._process.join(10)
