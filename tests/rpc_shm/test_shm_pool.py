"""The shared-memory pool and handoff inside one process: reuse, cancel, staleness, refusals."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from gradwire._proto import worker_pb2 as pb
from gradwire._wire import calls, framing, shm
from gradwire._wire.pickler import EncodeContext
from gradwire._wire.policy import CallablePolicy
from gradwire._wire.shm_pool import DATA_OFFSET, SegmentPool, capacity_for
from gradwire.errors import MessageTooLargeError, SerializationError
from gradwire.multiprocessing._shm_manager import SHM_DIR

MiB = 1 << 20


@pytest.fixture
def pool() -> Iterator[SegmentPool]:
    """A pool routed to for destination "peer" (threshold 1 KiB), the previous route restored."""
    p = SegmentPool("peer", threshold=1024, max_bytes=64 * MiB, stale_seconds=60.0)
    old = shm._route
    shm.set_route(lambda name: p if name == "peer" else None)
    try:
        yield p
    finally:
        shm.set_route(old)
        p.close()
        shm.forget(p)


def _roundtrip(body: Any, peer: str = "peer", max_bytes: int = 1 << 30) -> Any:
    ctx = EncodeContext(peer=peer)
    first, buffers = calls.encode_body(pb.FrameHeader(call=pb.CallHeader()), body, ctx)
    asm = framing.Assembler(max_bytes)
    for frame in framing.split(first, buffers, 1 << 20):
        asm.feed(frame)
    assert asm.message is not None and asm.complete
    out, _ = calls.decode_body(asm.message, {"policy": CallablePolicy(trust_everything=True)})
    return out, first


def test_capacity_rounds_to_an_eighth_of_the_power_of_two() -> None:
    assert capacity_for(1) == 64 << 10
    assert capacity_for(200 << 10) == 256 << 10
    assert capacity_for(100 * MiB) == 104 * MiB  # steps of 8 MiB between 64 and 128 MiB
    assert capacity_for(128 * MiB) == 128 * MiB
    assert capacity_for(128 * MiB + 1) == 144 * MiB


def test_roundtrip_in_one_process_copies_and_frees_the_segment(pool: SegmentPool) -> None:
    shm.reset_stats()
    x = np.arange(MiB // 8, dtype=np.float64)
    strided = np.arange(64 * 1024, dtype=np.int32).reshape(256, 256)[:, ::2]
    scalar = np.array(3.5)  # 8 bytes: below the threshold, streams
    (a, b, c), first = _roundtrip((x, strided, scalar))
    metas = first.payload.tensors
    assert [m.HasField("shm") for m in metas] == [True, True, False]
    assert metas[0].shm.offset == DATA_OFFSET
    assert np.array_equal(a, x) and np.array_equal(b, strided) and b.shape == (256, 128)
    assert c.shape == () and c == 3.5
    assert shm.stats()["received_local"] == 2  # our own segment: copied out, not shared
    x[:] = 0
    assert a[5] == 5.0  # by value
    (d,), _ = _roundtrip((x,))
    assert not d.any()
    stats = pool.stats()
    assert stats["reused"] >= 1 and stats["segments"] == 2


def test_segment_held_by_a_receiver_is_not_reused(pool: SegmentPool) -> None:
    from gradwire.multiprocessing import _posix

    ref = pool.put(np.ones(MiB // 8))
    assert ref is not None
    # Pretend a receiver in another process attached: one more reference, ticket cleared.
    _posix.adjust_count(ref.name, +1)
    word = next(e for e in pool._entries.values()).words
    word[0] = 0
    ref2 = pool.put(np.ones(MiB // 8))
    assert ref2 is not None and ref2.seg_id != ref.seg_id
    _posix.adjust_count(ref.name, -1)  # the receiver let go
    ref3 = pool.put(np.ones(MiB // 8))  # ref2 still in flight; ref's segment is free again
    assert ref3 is not None and ref3.seg_id == ref.seg_id


def test_failed_encoding_gives_the_segment_back(pool: SegmentPool) -> None:
    with pytest.raises(SerializationError):
        _roundtrip((np.ones(MiB // 8), lambda: None))
    assert pool.stats()["created"] == 1
    _roundtrip((np.ones(MiB // 8),))
    stats = pool.stats()
    assert stats["created"] == 1 and stats["reused"] == 1


def test_untaken_segment_is_retired_after_stale_seconds(pool: SegmentPool) -> None:
    pool.stale_seconds = 0.05
    ref = pool.put(np.ones(MiB // 8))  # never received
    assert ref is not None and os.path.exists(os.path.join(SHM_DIR, ref.name))
    time.sleep(0.1)
    assert pool.put(np.ones(MiB // 8)) is not None
    assert pool.stats()["retired"] == 1
    assert not os.path.exists(os.path.join(SHM_DIR, ref.name))


def test_full_pool_falls_back_to_the_stream(pool: SegmentPool) -> None:
    pool.max_bytes = 2 * MiB
    shm.reset_stats()
    (a, b, c), first = _roundtrip((np.ones(MiB // 8), np.ones(MiB // 8), np.ones(MiB // 8)))
    assert [m.HasField("shm") for m in first.payload.tensors] == [True, True, False]
    assert shm.stats()["fallback"] == 1
    assert a.sum() == b.sum() == c.sum() == MiB // 8


def test_other_peers_and_small_tensors_stream(pool: SegmentPool) -> None:
    _, first = _roundtrip((np.ones(MiB // 8),), peer="stranger")
    assert not first.payload.tensors[0].HasField("shm")
    _, first = _roundtrip((np.ones(100),))
    assert not first.payload.tensors[0].HasField("shm")


def test_shm_bytes_count_against_max_message_bytes(pool: SegmentPool) -> None:
    with pytest.raises(MessageTooLargeError):
        _roundtrip((np.ones(MiB // 8),), max_bytes=MiB // 2)


def _meta(**ref: Any) -> pb.TensorMeta:
    fields = {"name": "gradwire_fs_abc_0123", "offset": 64, "size": 1 << 20, "seg_id": "0123"}
    fields.update(ref)
    return pb.TensorMeta(
        dtype="float64", shape=[8], nbytes=64, shm=pb.SharedMemoryRef(**fields, ticket=1)
    )


@pytest.mark.parametrize(
    "ref",
    [
        {"name": "../etc/passwd"},
        {"name": "somebody_else"},
        {"offset": 0},
        {"offset": 65},
        {"size": 100},
    ],
)
def test_malformed_references_are_refused(ref: dict[str, Any]) -> None:
    with pytest.raises(SerializationError, match="malformed"):
        shm.receive(_meta(**ref))


def test_a_segment_that_is_gone_is_a_clear_error() -> None:
    with pytest.raises(SerializationError, match="is gone"):
        shm.receive(_meta())


def test_a_segment_smaller_than_announced_is_refused(pool: SegmentPool) -> None:
    ref = pool.put(np.ones(MiB // 8))
    assert ref is not None
    meta = pb.TensorMeta(dtype="float64", shape=[8], nbytes=64)
    meta.shm.CopyFrom(ref)
    meta.shm.size = 64 * MiB
    meta.shm.seg_id = "not-mapped-here"
    with pytest.raises(SerializationError, match="smaller than announced"):
        shm.receive(meta)


def test_a_reused_or_foreign_ticket_is_refused(pool: SegmentPool) -> None:
    ref = pool.put(np.ones(MiB // 8))
    assert ref is not None
    meta = pb.TensorMeta(dtype="float64", shape=[8], nbytes=64)
    meta.shm.CopyFrom(ref)
    meta.shm.ticket = ref.ticket + 2
    with pytest.raises(SerializationError, match="no longer holds"):
        shm.receive(meta)


def test_without_a_route_everything_streams() -> None:
    # Without a route nothing changes: the frames carry the bytes.
    old = shm._route
    shm.set_route(None)
    try:
        (a,), first = _roundtrip((np.ones(MiB // 8),))
    finally:
        shm.set_route(old)
    assert not first.payload.tensors[0].HasField("shm") and a.sum() == MiB // 8


def test_options_validate_shm_fields() -> None:
    from gradwire.distributed import rpc

    with pytest.raises(ValueError, match="shm_threshold_bytes"):
        rpc.GrpcRpcBackendOptions(shm_threshold_bytes=0)
    with pytest.raises(ValueError, match="shm_pool_bytes"):
        rpc.GrpcRpcBackendOptions(shm_pool_bytes=-1)
    opts = rpc.GrpcRpcBackendOptions()
    assert opts.shm_transfer is True and opts.shm_threshold_bytes == 128 << 10


def test_idle_free_segments_are_retired_at_the_next_send(pool: SegmentPool) -> None:
    pool.idle_seconds = 0.05
    first = pool.put(np.ones(MiB // 8))
    assert first is not None
    word = next(iter(pool._entries.values())).words
    word[0] = 0  # as a receiver that took it and let go
    del word  # (a view keeps the segment mapped)
    time.sleep(0.1)
    second = pool.put(np.ones(4 * MiB // 8))
    assert second is not None and second.seg_id != first.seg_id
    assert pool.stats()["segments"] == 1 and pool.stats()["retired"] == 1
    assert not os.path.exists(os.path.join(SHM_DIR, first.name))


def test_full_dev_shm_streams_instead_of_crashing(
    pool: SegmentPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from gradwire._wire import shm_pool

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm_pool.os, "posix_fallocate", no_space)
    before = set(os.listdir(SHM_DIR))
    (a,), first = _roundtrip((np.ones(MiB // 8),))
    assert not first.payload.tensors[0].HasField("shm") and a.sum() == MiB // 8
    assert pool.stats()["segments"] == 0 and pool.stats()["full"] == 1
    assert set(os.listdir(SHM_DIR)) - before == set()  # the unusable segment is gone


def test_a_retired_segment_leaves_the_receive_cache_at_the_next_mapping() -> None:
    """The receive cache (gradwire._wire.shm) drops what the sender's pool retired (RETIRED
    word) the next time it maps a segment, and everything at clear_cache()."""
    from gradwire._wire import shm

    shm.clear_cache()
    a, b = _FakeCached("gradwire_fs_1_1"), _FakeCached("gradwire_fs_1_2")
    with shm._cache_lock:
        shm._cache[a.name] = a
        shm._cache[b.name] = b
    a.words[2] = 1  # the pool retired a
    with shm._cache_lock:
        shm._make_room(MiB)
    assert shm.cache_info()["segments"] == 1 and a.words[1] == 0 and b.words[1] == 1
    with shm._cache_lock:  # b is the least recently used when the cache is full
        shm._make_room(shm.CACHE_MAX_BYTES)
    assert shm.cache_info()["segments"] == 0 and b.words[1] == 0
    with shm._cache_lock:
        shm._cache[b.name] = b
    b.words[1] = 1
    shm.clear_cache()
    assert shm.cache_info() == {"segments": 0, "bytes": 0} and b.words[1] == 0


class _FakeCached:
    """Stands for a mapped Segment in the receive cache: a name, a size and header words."""

    def __init__(self, name: str) -> None:
        self.name, self.size = name, MiB
        self.words = np.array([0, 1, 0], dtype=np.int64)

    def ndarray(self, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        return self.words[: shape[0]]


def test_a_reference_past_a_cached_mapping_is_refused() -> None:
    """A later message may not claim more of a cached segment than was mapped."""
    from gradwire._proto import worker_pb2 as pb
    from gradwire._wire import shm

    shm.clear_cache()
    fake = _FakeCached("gradwire_fs_1_3")
    with shm._cache_lock:
        shm._cache[fake.name] = fake
    meta = pb.TensorMeta(
        dtype="float64",
        shape=[MiB],  # 8 MiB from a 1 MiB mapping
        nbytes=8 * MiB,
        shm=pb.SharedMemoryRef(
            name=fake.name, offset=DATA_OFFSET, size=16 * MiB, seg_id="x", ticket=5
        ),
    )
    with pytest.raises(SerializationError, match="reaches past"):
        shm.receive(meta)
    shm.clear_cache()
