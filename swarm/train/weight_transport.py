"""How weight buckets travel from verl's actor rank 0 to the engine's workers: CUDA IPC or a broadcast group.

The buckets (`swarm.train.weight_buckets`: layout, packing with the cast to the engine's dtype on the
sender's device, fingerprints) are the same on every path; only their transport differs:

- ``ipc``: the sender and the engine's worker share one GPU. The worker maps each buffer through a CUDA
  IPC handle (a few hundred bytes through Ray and vLLM's RPC; the bytes never move).
- ``broadcast``: they do not (other GPUs, other nodes). Rank 0 of the actor and every engine worker form
  one group of their own, rank 0 the root, and each bucket is broadcast into a buffer the worker
  allocates from the layout it was sent. The group is NCCL on GPUs, made the way vLLM's own weight
  transfer makes it (``StatelessProcessGroup`` + ``PyNcclCommunicator``: a TCP store and an NCCL
  communicator, never ``torch.distributed``'s default group, which FSDP holds in the actor); on the CPU
  it is gloo over a TCP store on loopback (a bare ``ProcessGroupGloo``, also outside the default group),
  which is how the CPU tests run the whole protocol.

Each is a :class:`BucketTransport` (:class:`IpcTransport`, :class:`BroadcastTransport`): what the packer
returns per bucket (``handle``) and how packed buckets are delivered (``deliver``); verl's trainer packs,
delivers and compares fingerprints the same way for both. :func:`choose_transport` picks one from where
the two ends run (:class:`DeviceIdentity`). Every call
that waits on the other end is bounded (:func:`~swarm.train.weight_buckets.bounded_all`; the group's own
timeout is the same), so a silent peer ends a sync in a :class:`~swarm.train.weight_buckets.WeightSyncError`
instead of a hang.

Pure torch at import (vLLM is imported only when an NCCL group is opened).
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import torch
import torch.distributed

from swarm.train.weight_buckets import Bucket, WeightSyncError, bounded, bounded_all, receive_buckets

__all__ = [
    "BroadcastGroup",
    "BroadcastSender",
    "BroadcastTransport",
    "BucketTransport",
    "DeviceIdentity",
    "GroupAddress",
    "IpcTransport",
    "Transport",
    "choose_transport",
    "free_port",
    "local_identity",
    "open_broadcast_group",
    "receive_broadcast",
    "send_broadcast",
]

Transport = Literal["ipc", "broadcast"]
"""How buckets reach the engine: CUDA IPC handles (one GPU) or a broadcast group (other GPUs or nodes)."""

Fingerprints = list[tuple[float, float]]
"""One :func:`~swarm.train.weight_buckets.fingerprint` per bucket, in order."""


@dataclass(frozen=True)
class DeviceIdentity:
    """Where one end of the weight path runs."""

    host: str
    """Host name (``socket.gethostname()``)."""
    address: str
    """An address the other end can reach this host at (the node's IP; the broadcast group's store)."""
    device: str
    """``"cuda"`` or ``"cpu"``."""
    uuid: str | None
    """The GPU's UUID (``torch.cuda.get_device_properties(i).uuid``); ``None`` on the CPU."""


def local_identity(device: torch.device) -> DeviceIdentity:
    """This process's :class:`DeviceIdentity` for ``device`` (the address: Ray's node IP where Ray runs,
    else the host name's)."""
    uuid = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    host = socket.gethostname()
    try:
        import ray

        address = ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostbyname(host)
    except (ImportError, OSError):
        address = "127.0.0.1"
    return DeviceIdentity(host=host, address=address, device=device.type, uuid=uuid)


def choose_transport(sender: DeviceIdentity, receivers: Sequence[DeviceIdentity]) -> Transport:
    """``ipc`` when every receiver is on the sender's GPU (same host, same GPU UUID), ``broadcast`` when
    none is (NCCL cannot place two ranks of one group on one GPU, CUDA IPC cannot cross hosts).

    Raises:
        WeightSyncError: no receiver, or some on the sender's GPU and some elsewhere (neither transport
            reaches both).
    """
    if not receivers:
        raise WeightSyncError("weight sync: the engine reports no worker to send the weights to")
    shared = [r.device == "cuda" and r.host == sender.host and r.uuid == sender.uuid for r in receivers]
    if all(shared):
        return "ipc"
    if not any(shared):
        return "broadcast"
    raise WeightSyncError(
        "weight sync: some of the engine's workers share the actor's rank-0 GPU and some do not; neither "
        "CUDA IPC nor a broadcast group reaches both (put vLLM on the actor's GPU 0 or on other GPUs)"
    )


@dataclass(frozen=True)
class GroupAddress:
    """Where and how the broadcast group meets: rank 0 (the actor's) hosts the TCP store."""

    host: str
    port: int
    world_size: int
    """1 (the actor's rank 0) + the engine's workers."""
    backend: Literal["nccl", "gloo"]
    timeout_s: float
    """Most seconds to meet, and for one collective (gloo's own timeout; NCCL's is the caller's bound)."""


def free_port() -> int:
    """A TCP port free on this host now (for the group's store, which rank 0 opens)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class BroadcastGroup:
    """One weight-sync group: rank 0 broadcasts, the others receive. Not ``torch.distributed``'s default
    group: FSDP keeps that one in the actor's processes, and vLLM its own in its workers.

    Build with :func:`open_broadcast_group`.
    """

    def __init__(
        self, rank: int, device: torch.device, broadcast: Callable[[torch.Tensor], None], *keep: object
    ) -> None:
        self.rank = rank
        self.device = device
        self._broadcast = broadcast
        self._keep = keep
        """The store and communicator behind ``broadcast`` (rank 0 serves the store: kept alive here)."""

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every rank's ``tensor`` (same numel and dtype everywhere), in place.
        On CUDA it is enqueued on the current stream: synchronise before reading the result."""
        self._broadcast(tensor)


def open_broadcast_group(address: GroupAddress, rank: int, device: torch.device) -> BroadcastGroup:
    """Join the group at ``address`` as ``rank``; blocks until every rank has joined (bound it: a rank
    that never comes is waited for up to the store's timeout, an NCCL init for ever).

    ``nccl``: vLLM's ``StatelessProcessGroup.create`` (rank 0 hosts the store) and ``PyNcclCommunicator``
    on ``device``, as vLLM's NCCL weight transfer and TRL's ``init_communicator`` do. ``gloo``: a
    ``TCPStore`` and a bare ``ProcessGroupGloo`` with ``address.timeout_s`` as its timeout.

    Raises:
        ValueError: an NCCL group on a non-CUDA device.
        ImportError: ``nccl`` without vLLM.
    """
    if address.backend == "nccl":
        if device.type != "cuda":
            raise ValueError(f"an NCCL weight group needs a CUDA device, got {device}")
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        with torch.cuda.device(device):
            store = StatelessProcessGroup.create(
                host=address.host,
                port=address.port,
                rank=rank,
                world_size=address.world_size,
                store_timeout=max(1, int(address.timeout_s)),
            )
            nccl = PyNcclCommunicator(store, device=device)
        stream = torch.cuda.Stream(device=device)  # a hung broadcast blocks this stream, not the default one

        def broadcast_nccl(tensor: torch.Tensor) -> None:
            stream.wait_stream(torch.cuda.current_stream(device))
            nccl.broadcast(tensor, src=0, stream=stream)
            torch.cuda.current_stream(device).wait_stream(stream)

        return BroadcastGroup(rank, device, broadcast_nccl, store, nccl)
    dist: Any = torch.distributed  # TCPStore, PrefixStore, ProcessGroupGloo.broadcast: C bindings, not stubs
    timeout = datetime.timedelta(seconds=address.timeout_s)
    tcp = dist.TCPStore(address.host, address.port, address.world_size, is_master=rank == 0, timeout=timeout)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("swarm-weights", tcp), rank, address.world_size, timeout)
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0

    def broadcast_gloo(tensor: torch.Tensor) -> None:
        gloo.broadcast([tensor], options).wait()

    return BroadcastGroup(rank, device, broadcast_gloo, tcp, gloo)


def send_broadcast(group: BroadcastGroup, flats: Sequence[torch.Tensor], *, timeout_s: float) -> None:
    """Rank 0's side of one sync: each packed bucket broadcast in order, then waited for (on CUDA the
    broadcasts are asynchronous: the wait is where a silent receiver shows).

    Raises:
        WeightSyncError: a broadcast failed, or the whole took longer than ``timeout_s``.
    """

    def send() -> None:
        with _on(group.device):
            for flat in flats:
                group.broadcast(flat)
            if group.device.type == "cuda":
                torch.cuda.synchronize(group.device)

    bounded(send, timeout_s=timeout_s, what="the actor's broadcast")


def receive_broadcast(
    group: BroadcastGroup,
    buckets: Sequence[Bucket],
    load: Callable[[list[tuple[str, torch.Tensor]]], object],
    *,
    timeout_s: float,
) -> list[tuple[float, float]]:
    """A receiver's side of one sync (what vLLM's worker runs, `swarm.engine._vllm_worker`): for each
    bucket in order, a buffer of its layout allocated on the group's device and filled by the broadcast,
    its fingerprint taken, its tensors loaded (`receive_buckets`, the CUDA IPC path's code). Only the
    waits on the broadcast leave the caller's thread (bounded, ``timeout_s`` for the whole sync); the
    model's ``load`` runs in it, as on the IPC path.

    Returns:
        The fingerprints, in order, for the sender to compare with its own.

    Raises:
        WeightSyncError: a broadcast failed, or the whole took longer than ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s

    def fill(bucket: object) -> torch.Tensor:
        assert isinstance(bucket, Bucket)
        flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=group.device)

        def wait() -> None:
            with _on(group.device):
                group.broadcast(flat)
                if group.device.type == "cuda":
                    torch.cuda.synchronize(group.device)

        try:
            bounded(wait, timeout_s=max(0.0, deadline - time.monotonic()), what="the engine's receive")
        except WeightSyncError as exc:
            if exc.__cause__ is not None:  # the broadcast failed
                raise
            raise WeightSyncError(  # the sync's deadline, not this bucket's share of it
                f"weight sync: the engine's receive took longer than {timeout_s:g} s; "
                "the engine may hold a partial update"
            ) from None
        return flat

    return receive_buckets([(b, b) for b in buckets], fill, load)


def _on(device: torch.device) -> Any:
    """``torch.cuda.device(device)`` for a CUDA device (a new thread starts on GPU 0), else nothing."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class BucketTransport(ABC):
    """How packed buckets reach the engine. The sender packs with :attr:`handle` (what it returns per
    bucket besides the layout and fingerprint), then :meth:`deliver` hands them over and returns the
    engine's fingerprints, which the caller compares with its own."""

    name: ClassVar[Transport]
    engine: Any
    """The engine it delivers to."""
    handle: str
    """``"cuda_ipc"`` (CUDA IPC rebuild args), ``"tensor"`` (the buffer itself: a CPU receiver in this
    process's tests) or ``"none"`` (nothing: the buffers stay with the sender)."""
    breaks_on_failure: ClassVar[bool] = False
    """Whether a failed delivery leaves the transport unusable (a collective that hung cannot be undone)."""

    @abstractmethod
    def deliver(self, packed: Sequence[Mapping[str, Any]], policy_version: int) -> Fingerprints:
        """Hand the packed buckets (``bucket``, ``handle`` per bucket, in order) to the engine as
        ``policy_version``; returns the fingerprints it read.

        Raises:
            WeightSyncError: a part failed or took longer than the timeout.
        """


class IpcTransport(BucketTransport):
    """The engine maps each buffer: ``engine.load_weight_buckets([(bucket, handle)], version)`` (vLLM by
    CUDA IPC; an engine whose ``bucket_transport`` is ``"tensor"`` takes the buffers themselves)."""

    name = "ipc"

    def __init__(self, engine: Any, timeout_s: float) -> None:
        self.engine, self.timeout_s = engine, timeout_s
        self.handle = (
            "cuda_ipc" if getattr(engine, "bucket_transport", "cuda_ipc") == "cuda_ipc" else "tensor"
        )

    def deliver(self, packed: Sequence[Mapping[str, Any]], policy_version: int) -> Fingerprints:
        items = [(p["bucket"], p["handle"]) for p in packed]
        prints: Fingerprints = bounded(
            lambda: self.engine.load_weight_buckets(items, policy_version),
            timeout_s=self.timeout_s,
            what="the engine's load",
        )
        return prints


class BroadcastSender(Protocol):
    """The root's side of a broadcast group (verl's worker group: rank 0 acts, the others return)."""

    def join_weight_group(self, address: GroupAddress) -> object:
        """Open the group at ``address`` as rank 0; returns once every rank has joined."""

    def broadcast_weight_buckets(self) -> object:
        """Broadcast the packed buckets, in order, and wait until they are sent."""


class BroadcastTransport(BucketTransport):
    """The sender broadcasts each bucket to the engine's workers over a group of their own, formed here:
    the sender (rank 0, hosting the store) and the engine (``engine.join_weight_group(address, 1)``,
    worker ``i`` as rank ``1 + i``) join at once, bounded by ``address.timeout_s``.

    Raises:
        WeightSyncError: the group did not form in time, or failed to.
    """

    name = "broadcast"
    handle = "none"
    breaks_on_failure = True

    def __init__(self, sender: BroadcastSender, engine: Any, address: GroupAddress) -> None:
        self.sender, self.engine, self.address = sender, engine, address
        bounded_all(
            {
                "the actor joining the weight group": lambda: sender.join_weight_group(address),
                "the engine joining the weight group": lambda: engine.join_weight_group(address, 1),
            },
            timeout_s=address.timeout_s,
        )

    def deliver(self, packed: Sequence[Mapping[str, Any]], policy_version: int) -> Fingerprints:
        """The sender's broadcast and ``engine.receive_weight_buckets(layouts, version)`` at once."""
        layouts = [p["bucket"] for p in packed]
        receive = "the engine's receive"
        prints: Fingerprints = bounded_all(
            {
                "the actor's broadcast": self.sender.broadcast_weight_buckets,
                receive: lambda: self.engine.receive_weight_buckets(layouts, policy_version),
            },
            timeout_s=self.address.timeout_s,
        )[receive]
        return prints
