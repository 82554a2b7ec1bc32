"""The direct weight path's buckets on the CPU: layout, packing with a dtype cast, views, the checksum that
proves the engine got the bytes, and the bounded wait (swarm/train/weight_buckets.py)."""

from __future__ import annotations

import time

import pytest
import torch

from swarm.train.weight_buckets import (
    ALIGN_BYTES,
    WeightSyncError,
    bounded,
    fingerprint,
    fingerprint_matches,
    pack,
    pack_stream,
    plan_buckets,
    receive_buckets,
    unpack,
)


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"embed": (50, 8), "q": (8, 8), "k": (4, 8), "norm": (8,), "head": (50, 8)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def specs(tensors: dict[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(t.shape)) for n, t in tensors.items()]


def test_buckets_keep_order_align_and_stay_under_the_size() -> None:
    w = weights()
    buckets = plan_buckets(specs(w), dtype=torch.float32, bucket_bytes=1024)
    names = [e.name for b in buckets for e in b.entries]
    assert names == list(w)  # every tensor once, in order
    for b in buckets:
        assert all(e.offset * 4 % ALIGN_BYTES == 0 for e in b.entries)
        assert b.nbytes <= 1024 or len(b.entries) == 1  # only a tensor larger than a bucket stands alone
        ends = [e.offset + e.numel for e in b.entries]
        assert all(end <= nxt.offset for end, nxt in zip(ends, b.entries[1:], strict=False))
        assert b.numel == ends[-1]
    assert [len(b.entries) for b in buckets] == [1, 3, 1]  # embed (1600 B) and head alone; q, k, norm share
    assert len(plan_buckets(specs(w), dtype=torch.float32, bucket_bytes=1 << 20)) == 1
    with pytest.raises(ValueError, match="twice"):
        plan_buckets([("a", (1,)), ("a", (2,))], dtype=torch.float32, bucket_bytes=64)
    with pytest.raises(ValueError, match="> 0"):
        plan_buckets([("a", (1,))], dtype=torch.float32, bucket_bytes=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pack_casts_and_unpack_gives_views_of_the_same_values(dtype: torch.dtype) -> None:
    w = weights()
    for bucket in plan_buckets(specs(w), dtype=dtype, bucket_bytes=2048):
        flat = pack(bucket, w)
        assert flat.dtype == dtype and flat.numel() == bucket.numel
        views = unpack(bucket, flat)
        for name, view in views:
            assert torch.equal(view, w[name].to(dtype))  # the cast a GPU does in place, here on the CPU
            assert view.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()  # no copy
        reused = pack(bucket, w, out=torch.full_like(flat, 7.0))
        assert torch.equal(reused, flat)  # padding zeroed on reuse
    with pytest.raises(ValueError, match="expected shape"):
        pack(plan_buckets([("q", (8, 8))], dtype=dtype, bucket_bytes=4096)[0], {"q": torch.zeros(4, 4)})
    with pytest.raises(ValueError, match="buffer of"):
        unpack(plan_buckets([("q", (8, 8))], dtype=dtype, bucket_bytes=4096)[0], torch.zeros(3, dtype=dtype))


def test_the_fingerprint_sees_changed_and_moved_values_but_not_equal_bytes() -> None:
    w = weights()
    (bucket,) = plan_buckets(specs(w), dtype=torch.float32, bucket_bytes=1 << 20)
    sent = fingerprint(pack(bucket, w))
    assert fingerprint_matches(sent, fingerprint(pack(bucket, {k: v.clone() for k, v in w.items()})))
    changed = dict(w, norm=w["norm"] + 1e-3)
    assert not fingerprint_matches(sent, fingerprint(pack(bucket, changed)))
    flat = pack(bucket, w)
    shifted = torch.roll(flat, 1)  # every value one place on: the plain sum is equal, the weighted one not
    assert fingerprint(shifted)[0] == pytest.approx(sent[0], rel=1e-12)
    assert not fingerprint_matches(sent, fingerprint(shifted))
    swapped = dict(w, embed=w["head"], head=w["embed"])  # two tensors of one shape exchanged
    assert not fingerprint_matches(sent, fingerprint(pack(bucket, swapped)))


def test_a_sync_that_hangs_fails_loudly_within_its_timeout() -> None:
    assert bounded(lambda: 42, timeout_s=5, what="push") == 42
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"push took longer than 0.2 s; the engine may hold a partial"):
        bounded(lambda: time.sleep(30), timeout_s=0.2, what="push")
    assert time.monotonic() - started < 5

    def broken() -> None:
        raise RuntimeError("NCCL error: unhandled system error")

    with pytest.raises(WeightSyncError, match="push failed: RuntimeError: NCCL error") as caught:
        bounded(broken, timeout_s=5, what="push")
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_streamed_packing_lays_out_what_the_plan_does_and_the_receiver_gets_it() -> None:
    w = weights()
    streamed = list(pack_stream(iter(w.items()), dtype=torch.bfloat16, bucket_bytes=1024))
    planned = plan_buckets(specs(w), dtype=torch.bfloat16, bucket_bytes=1024)
    assert [b for b, _ in streamed] == planned
    received: dict[str, torch.Tensor] = {}
    prints = receive_buckets(
        [(b, flat) for b, flat in streamed],
        rebuild=lambda handle: handle,  # the CPU transport: the buffer itself (vLLM: a CUDA IPC handle)
        load=lambda views: received.update({n: v.clone() for n, v in views}),
    )
    assert prints == [fingerprint(flat) for _, flat in streamed]
    assert all(torch.equal(received[n], t.to(torch.bfloat16)) for n, t in w.items())


def test_the_fingerprint_is_the_same_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    import swarm.train.weight_buckets as wb

    flat = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    whole = fingerprint(flat)
    monkeypatch.setattr(wb, "FINGERPRINT_CHUNK", 7)  # chunks that cut the position period anywhere
    assert fingerprint_matches(whole, fingerprint(flat), rtol=1e-12)
