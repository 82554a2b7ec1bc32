"""The broadcast weight path on the CPU (swarm/train/weight_transport.py): the transport's choice, and the
whole protocol between verl's actor rank 0 (this process) and vLLM's worker code in a real second process
(tests/train/weight_receiver_process.py) over a gloo group on loopback, where the GPU path uses NCCL:
the buckets arrive cast and whole, fingerprints equal; a corrupted bucket, a silent receiver and a peer
that never joins each end in a WeightSyncError within the timeout (no hang)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from swarm.train.weight_buckets import (
    Bucket,
    WeightSyncError,
    bounded_all,
    check_fingerprints,
    fingerprint,
    pack_stream,
    plan_buckets,
)
from swarm.train.weight_transport import (
    BroadcastGroup,
    BroadcastTransport,
    DeviceIdentity,
    GroupAddress,
    choose_transport,
    free_port,
    open_broadcast_group,
    send_broadcast,
)
from tests.train.weight_receiver_process import ProcessEngine

TIMEOUT_S = 4.0
CPU = torch.device("cpu")


def gpu(host: str, uuid: str) -> DeviceIdentity:
    return DeviceIdentity(host=host, address="10.0.0.1", device="cuda", uuid=uuid)


def test_ipc_on_the_actors_gpu_broadcast_elsewhere() -> None:
    actor = gpu("node-a", "GPU-0")
    assert choose_transport(actor, [gpu("node-a", "GPU-0")]) == "ipc"
    assert choose_transport(actor, [gpu("node-a", "GPU-1")]) == "broadcast"  # another GPU of the node
    assert choose_transport(actor, [gpu("node-b", "GPU-0")]) == "broadcast"  # another node
    cpu = DeviceIdentity(host="node-a", address="127.0.0.1", device="cpu", uuid=None)
    assert choose_transport(cpu, [cpu]) == "broadcast"  # CUDA IPC needs a GPU; the CPU tests broadcast
    with pytest.raises(WeightSyncError, match="some of the engine's workers share"):
        choose_transport(actor, [gpu("node-a", "GPU-0"), gpu("node-a", "GPU-1")])
    with pytest.raises(WeightSyncError, match="no worker"):
        choose_transport(actor, [])


def test_both_ends_are_bounded_and_the_first_failure_ends_the_wait() -> None:
    assert bounded_all({"a": lambda: 1, "b": lambda: 2}, timeout_s=5) == {"a": 1, "b": 2}
    release = threading.Event()  # the hung peer, released when the test is done with it

    def broken() -> None:
        raise RuntimeError("connection closed by peer")

    started = time.monotonic()
    try:
        with pytest.raises(WeightSyncError, match="send failed: RuntimeError: connection closed"):
            bounded_all({"send": broken, "receive": lambda: release.wait(30)}, timeout_s=20)
        assert time.monotonic() - started < 5  # not the receiver's 30 s, nor the 20 s timeout
        with pytest.raises(WeightSyncError, match=r"^weight sync: receive took longer than 0.3 s"):
            bounded_all({"send": lambda: None, "receive": lambda: release.wait(30)}, timeout_s=0.3)
    finally:
        release.set()
    check_fingerprints([(1.0, 2.0)], [(1.0, 2.0)])
    with pytest.raises(WeightSyncError, match=r"other bytes than the actor sent in bucket\(s\) \[1\] of 2"):
        check_fingerprints([(1.0, 2.0), (3.0, 4.0)], [(1.0, 2.0), (3.0, 4.5)])
    with pytest.raises(WeightSyncError, match="2 bucket"):
        check_fingerprints([(1.0, 2.0), (3.0, 4.0)], [(1.0, 2.0)])


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed": (300, 16), "q": (16, 16), "k": (8, 16), "norm": (16,), "head": (300, 16)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


class LocalSender:
    """Rank 0 in this process, with what verl's worker group does on rank 0 (`BroadcastSender`): opens
    the group as its root, broadcasts the buckets packed last."""

    def __init__(self) -> None:
        self.group: BroadcastGroup | None = None
        self.flats: list[torch.Tensor] = []

    def join_weight_group(self, address: GroupAddress) -> None:
        self.group = open_broadcast_group(address, 0, CPU)

    def broadcast_weight_buckets(self) -> None:
        assert self.group is not None
        send_broadcast(self.group, self.flats, timeout_s=TIMEOUT_S)


def form_group(engine: ProcessEngine) -> tuple[LocalSender, BroadcastTransport]:
    """Rank 0 here and the child's worker at rank 1 join one gloo group at once (`BroadcastTransport`,
    as `VerlTrainer` forms it)."""
    sender = LocalSender()
    address = GroupAddress("127.0.0.1", free_port(), 2, "gloo", TIMEOUT_S)
    return sender, BroadcastTransport(sender, engine, address)


def sync(
    joined: tuple[LocalSender, BroadcastTransport], tensors: dict[str, torch.Tensor], version: int
) -> list[tuple[Bucket, torch.Tensor]]:
    """One sync as `VerlTrainer.push_weights` runs it: pack (cast to bfloat16), deliver (the broadcast
    while the engine receives), compare fingerprints. Returns the packed buckets."""
    sender, transport = joined
    packed = list(pack_stream(iter(tensors.items()), dtype=torch.bfloat16, bucket_bytes=4096))
    sender.flats = [flat for _, flat in packed]
    received = transport.deliver([{"bucket": bucket, "handle": None} for bucket, _ in packed], version)
    check_fingerprints([fingerprint(flat) for _, flat in packed], received)
    return packed


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[ProcessEngine]:
    process = ProcessEngine(getattr(request, "param", "ok"))
    try:
        yield process
    finally:
        process.close()
        # calls a failed sync abandoned end once their peer is gone (gloo's own timeout at the latest):
        # wait for them, so none is still inside gloo when the interpreter exits
        for thread in threading.enumerate():
            if thread.name.startswith("weight-sync"):
                thread.join(TIMEOUT_S + 5)


def test_buckets_reach_a_second_process_over_the_group_cast_and_checked(engine: ProcessEngine) -> None:
    (identity,) = engine.weight_sync_devices()
    assert identity.device == "cpu" and identity.uuid is None
    joined = form_group(engine)
    for version, seed in ((1, 0), (2, 1)):  # the group serves every sync
        tensors = weights(seed)
        packed = sync(joined, tensors, version)
        assert len(packed) >= 3  # several buckets, broadcast in order
        got = engine.weights()
        assert sorted(got) == sorted(tensors)
        for name, t in tensors.items():
            assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], t.to(torch.bfloat16))
        assert engine.policy_version == version


@pytest.mark.parametrize("engine", ["corrupt"], indirect=True)
def test_a_corrupted_bucket_fails_the_fingerprint_check(engine: ProcessEngine) -> None:
    joined = form_group(engine)
    with pytest.raises(
        WeightSyncError, match=r"the engine received other bytes than the actor sent in bucket"
    ):
        sync(joined, weights(0), 1)


@pytest.mark.parametrize("engine", ["silent"], indirect=True)
def test_a_silent_receiver_fails_within_the_timeout(engine: ProcessEngine) -> None:
    joined = form_group(engine)
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"took longer than 4 s|the actor's broadcast failed"):
        sync(joined, weights(0), 1)
    assert time.monotonic() - started < TIMEOUT_S + 3


@pytest.mark.parametrize("engine", ["absent"], indirect=True)
def test_a_peer_that_never_joins_fails_within_the_timeout(engine: ProcessEngine) -> None:
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"joining"):
        form_group(engine)
    assert time.monotonic() - started < TIMEOUT_S + 3


def test_a_worker_whose_sender_is_silent_gives_up_on_its_own_within_the_timeout(
    engine: ProcessEngine,
) -> None:
    """vLLM's worker bounds its own wait (its engine core is not held for ever by a dead trainer): the
    actor packs nothing and sends nothing, the worker's receive returns an error after the group's timeout."""
    joined = form_group(engine)  # alive and silent (a group dropped here closes: the worker fails at once)
    (bucket,) = plan_buckets([("q", (16, 16))], dtype=torch.bfloat16, bucket_bytes=1 << 20)
    started = time.monotonic()
    with pytest.raises(
        RuntimeError, match=r"WeightSyncError: weight sync: the engine's receive took longer than 4 s"
    ):
        engine.receive_weight_buckets([bucket], 1)
    assert time.monotonic() - started < TIMEOUT_S + 3
    del joined
