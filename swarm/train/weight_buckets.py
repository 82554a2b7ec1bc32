"""Weights in flat buckets: the unit of the direct weight path from verl's actor into vLLM's workers.

The direct path (docs/ARCHITECTURE.md §The verl trainer, "Direct weight path") sends the actor's full
tensors without a CPU or Ray object-store hop: rank 0 casts them to the engine's dtype on its GPU and packs
them into a few flat buffers (:func:`plan_buckets`, :func:`pack`), vLLM's worker maps each buffer through a
CUDA IPC handle, takes the tensors back as views (:func:`unpack`) and loads them. Each buffer's
:func:`fingerprint` is computed on both sides: a mismatch fails the sync loudly. Every call that waits on
the other side is bounded (:func:`bounded`), so a hung transfer ends in an error, not a silent stall.

Pure torch (no verl, no vLLM): the same code runs on the GPU and in the CPU tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from swarm.errors import SwarmError

__all__ = [
    "ALIGN_BYTES",
    "Bucket",
    "BucketEntry",
    "WeightSyncError",
    "bounded",
    "bounded_all",
    "check_fingerprints",
    "fingerprint",
    "fingerprint_matches",
    "pack",
    "pack_stream",
    "plan_buckets",
    "receive_buckets",
    "unpack",
]

ALIGN_BYTES = 256
"""Each tensor starts at a multiple of this many bytes of its bucket (CUDA's allocation alignment)."""

FINGERPRINT_PERIOD = 251
"""Period of the position weights of :func:`fingerprint` (a prime: a shift by less is seen)."""

FINGERPRINT_CHUNK = 1 << 22
"""Elements :func:`fingerprint` reduces at a time (its float64 scratch: 3 × 32 MiB)."""

T = TypeVar("T")


class WeightSyncError(SwarmError, RuntimeError):
    """A weight sync failed: timed out, or the engine received other bytes than the trainer sent."""

    status_code = 500
    error_type = "weight_sync_error"


@dataclass(frozen=True)
class BucketEntry:
    """One tensor's place in a bucket."""

    name: str
    """Hugging Face state-dict name."""
    shape: tuple[int, ...]
    offset: int
    """First element in the bucket's flat buffer (elements of the bucket's dtype)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Bucket:
    """A flat buffer's layout: tensors in order, each aligned to :data:`ALIGN_BYTES`."""

    entries: tuple[BucketEntry, ...]
    dtype: torch.dtype
    numel: int
    """Elements of the flat buffer (padding included)."""

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def plan_buckets(
    specs: Iterable[tuple[str, tuple[int, ...]]], *, dtype: torch.dtype, bucket_bytes: int
) -> list[Bucket]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` (a tensor larger than that gets
    a bucket of its own).

    Args:
        specs: ``(name, shape)`` of each tensor, in the order they are produced.
        dtype: The engine's dtype: tensors are cast to it when packed.
        bucket_bytes: Most bytes of one bucket (> 0).

    Raises:
        ValueError: ``bucket_bytes`` ≤ 0 or a repeated name.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    align = max(1, ALIGN_BYTES // dtype.itemsize)
    buckets: list[Bucket] = []
    entries: list[BucketEntry] = []
    size = 0
    seen: set[str] = set()
    for name, shape in specs:
        if name in seen:
            raise ValueError(f"tensor {name!r} appears twice")
        seen.add(name)
        start = -(-size // align) * align
        entry = BucketEntry(name, tuple(shape), start)
        if entries and (start + entry.numel) * dtype.itemsize > bucket_bytes:
            buckets.append(Bucket(tuple(entries), dtype, size))
            entries, start = [], 0
            entry = BucketEntry(name, tuple(shape), 0)
        entries.append(entry)
        size = start + entry.numel
    if entries:
        buckets.append(Bucket(tuple(entries), dtype, size))
    return buckets


def pack(
    bucket: Bucket, tensors: Mapping[str, torch.Tensor], out: torch.Tensor | None = None
) -> torch.Tensor:
    """The bucket's flat buffer with each tensor cast into its place (on the tensors' device: a GPU
    tensor is cast on the GPU). Padding elements are 0.

    Args:
        bucket: Its layout.
        tensors: At least the bucket's tensors, by name, of the entries' shapes.
        out: A buffer of ``bucket.numel`` elements of ``bucket.dtype`` to reuse.

    Raises:
        ValueError: a tensor missing or of another shape.
    """
    first = tensors.get(bucket.entries[0].name)
    device = first.device if first is not None else torch.device("cpu")
    flat = torch.zeros(bucket.numel, dtype=bucket.dtype, device=device) if out is None else out.zero_()
    for e in bucket.entries:
        t = tensors.get(e.name)
        if t is None or tuple(t.shape) != e.shape:
            got = None if t is None else tuple(t.shape)
            raise ValueError(f"bucket tensor {e.name!r}: expected shape {e.shape}, got {got}")
        flat[e.offset : e.offset + e.numel].copy_(t.detach().reshape(-1))
    return flat


def pack_stream(
    named: Iterable[tuple[str, torch.Tensor]], *, dtype: torch.dtype, bucket_bytes: int
) -> Iterator[tuple[Bucket, torch.Tensor]]:
    """Pack tensors as they come (a generator of gathered tensors) into the buckets :func:`plan_buckets`
    would lay out for them, yielding each ``(bucket, flat)`` as soon as it is full: only one bucket's
    source tensors are held at a time.

    Raises:
        ValueError: see :func:`plan_buckets`.
    """
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in named:
        plan = plan_buckets(
            [*((n, tuple(t.shape)) for n, t in pending.items()), (name, tuple(tensor.shape))],
            dtype=dtype,
            bucket_bytes=bucket_bytes,
        )
        if len(plan) > 1:  # the new tensor does not fit: the pending ones make a bucket
            yield plan[0], pack(plan[0], pending)
            pending = {}
        pending[name] = tensor
    if pending:
        (last,) = plan_buckets(
            [(n, tuple(t.shape)) for n, t in pending.items()], dtype=dtype, bucket_bytes=1 << 62
        )
        yield last, pack(last, pending)


def receive_buckets(
    items: Sequence[tuple[Bucket, object]],
    rebuild: Callable[[object], torch.Tensor],
    load: Callable[[list[tuple[str, torch.Tensor]]], object],
) -> list[tuple[float, float]]:
    """The receiving side: each bucket's buffer rebuilt (vLLM's worker: from its CUDA IPC handle), its
    :func:`fingerprint` taken, its tensors loaded (as views: ``load`` copies them into the model).

    Returns:
        The fingerprints, in order, for the sender to compare with its own.
    """
    prints = []
    for bucket, handle in items:
        flat = rebuild(handle)
        prints.append(fingerprint(flat))
        load(unpack(bucket, flat))
    return prints


def unpack(bucket: Bucket, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The bucket's tensors as views of ``flat`` (no copy), in order.

    Raises:
        ValueError: ``flat`` is not the bucket's size or dtype.
    """
    if flat.numel() != bucket.numel or flat.dtype != bucket.dtype:
        raise ValueError(
            f"buffer of {flat.numel()} {flat.dtype} for a bucket of {bucket.numel} {bucket.dtype}"
        )
    return [(e.name, flat[e.offset : e.offset + e.numel].view(e.shape)) for e in bucket.entries]


def fingerprint(flat: torch.Tensor) -> tuple[float, float]:
    """A cheap checksum of a buffer, computed where it lives: ``(Σ x_i, Σ w_i·x_i)`` in float64 with
    position weights ``w_i = 1 + (i mod 251)``. The plain sum sees changed values; the weighted one also
    sees moved ones (a shift, a swap of two tensors). Equal bytes give equal fingerprints on one device
    (the same reduction in the same order); compare across processes with :func:`fingerprint_matches`."""
    flat = flat.detach().reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    weighted = torch.zeros((), dtype=torch.float64, device=flat.device)
    w = _position_weights(flat.device)
    for start in range(0, flat.numel(), FINGERPRINT_CHUNK):  # bounded scratch memory on the GPU
        x = flat[start : start + FINGERPRINT_CHUNK].to(torch.float64)
        offset = start % FINGERPRINT_PERIOD
        total += x.sum()
        weighted += (x * w[offset : offset + x.numel()]).sum()
    return float(total), float(weighted)


_WEIGHTS: dict[torch.device, torch.Tensor] = {}
""":func:`_position_weights` by device."""


def _position_weights(device: torch.device) -> torch.Tensor:
    """``1 + (j mod FINGERPRINT_PERIOD)`` for ``j < FINGERPRINT_CHUNK + FINGERPRINT_PERIOD``, float64 on
    ``device``, made once per device (32 MiB): the weights of positions ``start … start + CHUNK`` are the
    slice from ``start mod PERIOD``, so a fingerprint no longer builds them (an int64 ``arange``, a
    modulo and a cast: about 40 of the ~90 bytes of memory traffic per element) for every chunk."""
    w = _WEIGHTS.get(device)
    if w is None:
        j = torch.arange(FINGERPRINT_CHUNK + FINGERPRINT_PERIOD, device=device, dtype=torch.int64)
        w = _WEIGHTS[device] = (j % FINGERPRINT_PERIOD + 1).to(torch.float64)
    return w


def fingerprint_matches(sent: tuple[float, float], received: tuple[float, float], rtol: float = 1e-9) -> bool:
    """Whether two :func:`fingerprint` s agree (relative ``rtol`` of each term's magnitude, float64
    summation order may differ between kernels)."""
    return all(abs(a - b) <= rtol * max(1.0, abs(a), abs(b)) for a, b in zip(sent, received, strict=True))


def bounded(call: Callable[[], T], *, timeout_s: float, what: str) -> T:
    """Run ``call`` and return its result, or raise once ``timeout_s`` seconds have passed.

    The call runs in a daemon thread: a hung collective cannot be interrupted from Python, so on timeout
    it is left behind and the error says the engine may hold a partial update (the caller fails the step
    loudly; the engine keeps the previous policy version's label until a sync succeeds).

    Raises:
        WeightSyncError: the timeout, or whatever ``call`` raised (as its cause).
    """
    result: T = bounded_all({what: call}, timeout_s=timeout_s)[what]
    return result


def bounded_all(calls: Mapping[str, Callable[[], Any]], *, timeout_s: float) -> dict[str, Any]:
    """Run the ``calls`` at once, each in a daemon thread (the two ends of one collective: the sender's
    broadcast and the receivers' load), and return their results by name once all have returned.

    The first call that raises ends the wait at once (its peer would wait for it until the timeout); a
    call still running after ``timeout_s`` seconds ends it too. Calls left running are abandoned (a hung
    collective cannot be interrupted from Python).

    Raises:
        WeightSyncError: ``weight sync: NAME failed: …`` (the error as its cause; a call's own
            WeightSyncError as it is) or ``weight sync: NAME took longer than … s`` naming the calls still
            running.
    """
    done = threading.Condition()
    results: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}

    def run(name: str, call: Callable[[], Any]) -> None:
        try:
            value = call()
        except BaseException as exc:  # handed to the caller's thread below
            with done:
                errors[name] = exc
                done.notify_all()
            return
        with done:
            results[name] = value
            done.notify_all()

    for name, call in calls.items():
        threading.Thread(target=run, args=(name, call), name=f"weight-sync: {name}", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    with done:
        while not errors and len(results) < len(calls):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done.wait(left)
        if errors:
            name, error = next(iter(errors.items()))
            if isinstance(error, WeightSyncError):  # already says what timed out or failed
                raise error
            raise WeightSyncError(f"weight sync: {name} failed: {type(error).__name__}: {error}") from error
        running = [name for name in calls if name not in results]
    if running:
        raise WeightSyncError(
            f"weight sync: {' and '.join(running)} took longer than {timeout_s:g} s; "
            "the engine may hold a partial update"
        )
    return results


def check_fingerprints(sent: Sequence[tuple[float, float]], received: Sequence[tuple[float, float]]) -> None:
    """Compare the sender's :func:`fingerprint` of each bucket with the receiver's.

    Raises:
        WeightSyncError: another number of buckets, or a bucket whose fingerprints differ (the engine
            received other bytes than were sent).
    """
    if len(sent) != len(received):
        raise WeightSyncError(f"weight sync: {len(sent)} bucket(s) sent, the engine read {len(received)}")
    bad = [i for i, (s, r) in enumerate(zip(sent, received, strict=True)) if not fingerprint_matches(s, r)]
    if bad:
        raise WeightSyncError(
            f"weight sync: the engine received other bytes than the actor sent in bucket(s) {bad} "
            f"of {len(sent)}"
        )
