"""The same-host fast path: a large tensor travels through shared memory, its handle through gRPC.

When the sender and the receiver share a host, :func:`offer` (called by ``tensors.pack``) copies
a tensor of at least the threshold into a reused segment of the destination's
:class:`~gradwire._wire.shm_pool.SegmentPool` and returns a ``SharedMemoryRef`` for
``TensorMeta.shm``; the frame stream then carries no bytes for it. The receiver's
:class:`~gradwire._wire.framing.Assembler` calls :func:`receive`, which maps the segment and
returns an ndarray over it. The runtime decides which peers qualify (same ``host_id``, the
``shm_transfer`` option) by installing a route with :func:`set_route`; without one every tensor
streams. Calls, replies, RRef values and gradients all pass through ``pack`` and the Assembler, so
they all take this path.

By-value semantics, as with PyTorch RPC (neither side sees the other's later writes):

* The sender *copies* the tensor into the segment while encoding, so later writes to its own
  tensor do not reach the segment, and the sender never reads the segment again.
* The sender writes that segment again only when the receiver has zeroed the transfer's ticket
  (it holds its own mapping) *and* the segment's reference count says no mapping but the
  sender's is left (the receiver dropped its array). So the receiver owns the memory privately
  for as long as it uses it: its writes reach nobody, and nobody's writes reach it.
* A receiver in the sender's own process (a call to oneself) would share the sender's mapping,
  so it copies the data out instead.
* A received tensor sent on is copied into the forwarder's own pool, never re-exported.

No leaks: every reference on a segment belongs to a mapping registered with the segment manager
of :mod:`gradwire.multiprocessing` (the receiver adds its own before mapping), which gives back
the references of a process killed mid-transfer. The caller cancels (:func:`cancel`) the
segments of every call that ends: harmless for those the callee took (their tickets are already
cleared), and it frees those the callee never took; a receiver that arrives late finds another
ticket and refuses the data. A reply segment whose ticket is never taken is retired by the
callee's pool after ``stale_seconds``.
"""

from __future__ import annotations

import os
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .._proto import worker_pb2 as pb
from ..errors import SerializationError
from .shm_pool import CACHED, DATA_OFFSET, LEASED, RETIRED, TICKET, SegmentPool, header_words

__all__ = ["Route", "set_route", "takes", "offer", "receive", "cancel", "stats", "reset_stats"]

#: ``route(peer_name) -> pool or None``: the pool for a same-host peer, None to stream.
Route = Callable[[str], "SegmentPool | None"]

_route: Route | None = None
_pools: dict[str, SegmentPool] = {}  # seg_id -> pool, for cancel()
_counts: Counter[str] = Counter()
_lock = threading.Lock()
_NAME_RE = re.compile(r"^gradwire_fs_[0-9a-f]+_[0-9a-f]+$")
#: Peers' pooled segments this process keeps mapped between transfers (name -> Segment, least
#: recently used first): a transfer into a cached segment costs no mmap, munmap, reference
#: count update nor segment-manager message.
_cache: OrderedDict[str, Any] = OrderedDict()
_cache_lock = threading.Lock()
CACHE_MAX_SEGMENTS = 64
CACHE_MAX_BYTES = 512 << 20


def set_route(route: Route | None) -> None:
    """Install the function that maps a destination name to its pool (None: always stream)."""
    global _route
    _route = route


def takes(peer: str, nbytes: int) -> bool:
    """Whether a tensor of ``nbytes`` for ``peer`` would be offered to shared memory."""
    route = _route
    pool = route(peer) if route is not None and peer else None
    return pool is not None and nbytes >= pool.threshold


def offer(peer: str, arr: np.ndarray) -> pb.SharedMemoryRef | None:
    """Put ``arr`` in shared memory for ``peer`` if the route says so and it is large enough.

    Args:
        peer: destination worker name.
        arr: the host array to send (any strides; it is copied).

    Returns:
        The reference for ``TensorMeta.shm``, or None to stream the bytes.

    Raises:
        OSError: creating a segment failed (out of shared memory).
    """
    route = _route
    if route is None or not peer:
        return None
    pool = route(peer)
    if pool is None or arr.nbytes < pool.threshold:
        return None
    ref = pool.put(arr)
    with _lock:
        if ref is None:
            _counts["fallback"] += 1
            return None
        _pools[ref.seg_id] = pool
        _counts["sent"] += 1
        _counts["sent_bytes"] += arr.nbytes
    return ref


def cancel(metas: Iterable[pb.TensorMeta]) -> None:
    """Give back the segments of a message whose transfer is over or will not happen.

    Safe at any time: a segment is only freed if it still holds the message's ticket, and a
    receiver that maps it afterwards sees a different ticket and refuses it.
    """
    for meta in metas:
        if meta.HasField("shm"):
            with _lock:
                pool = _pools.get(meta.shm.seg_id)
            if pool is not None:
                pool.cancel(meta.shm.seg_id, meta.shm.ticket)


def receive(meta: pb.TensorMeta) -> np.ndarray:
    """Map the segment ``meta.shm`` names and return the tensor's array (see the module doc).

    Args:
        meta: a TensorMeta whose dtype, shape and nbytes were already checked.

    Returns:
        A writable ndarray this process owns: a view of the segment, or a copy when the segment
        is this process' own.

    Raises:
        SerializationError: the reference is malformed, the segment is gone (its sender died),
            or it no longer holds this transfer.
    """
    from ..multiprocessing import _segment

    ref = meta.shm
    dtype, shape = np.dtype(meta.dtype), tuple(meta.shape)
    if (
        not _NAME_RE.match(ref.name)
        or ref.offset < DATA_OFFSET
        or ref.offset % max(1, dtype.alignment)
        or ref.offset + meta.nbytes > ref.size
    ):
        raise SerializationError(f"malformed shared-memory reference {ref.name!r}")
    with _cache_lock:
        seg = _cache.get(ref.name)
        if seg is not None:
            _cache.move_to_end(ref.name)
        else:
            own = _segment.mapped(ref.seg_id)
            if own is not None:  # our own segment (a call to oneself): copy, free the ticket
                words = header_words(own)
                _check_ticket(words, ref)
                out = np.array(own.ndarray(dtype, shape, offset=ref.offset))
                words[TICKET] = 0
                _count("received_local", meta.nbytes)
                return out
            seg = _map_and_cache(ref)
        if ref.offset + meta.nbytes > seg.size:  # the mapping is what the first message said
            raise SerializationError(
                f"shared-memory reference {ref.name!r} reaches past its {seg.size}-byte segment"
            )
        words = header_words(seg)
        _check_ticket(words, ref)  # under the lock: one transfer is taken once
        # The handoff, in one store: from now on the sender leaves the segment alone until
        # the last array of this transfer is gone here (the lease puts 0 back).
        words[TICKET] = LEASED
    arr = np.asarray(_segment.Lease(seg, dtype, shape, ref.offset, _unlease(words)))
    _count("received", meta.nbytes)
    return arr


def _map_and_cache(ref: pb.SharedMemoryRef) -> Any:
    # With _cache_lock held: map a peer's pooled segment, taking one reference that the cache
    # keeps (registered with the segment manager, so a killed process still gives it back).
    from ..multiprocessing import _posix, _segment
    from ..multiprocessing._shm_manager import SHM_DIR

    try:
        if os.stat(os.path.join(SHM_DIR, ref.name)).st_size < _posix.HEADER + ref.size:
            raise SerializationError(f"shared-memory segment {ref.name} is smaller than announced")
        _posix.adjust_count(ref.name, +1)  # our own reference; attach() takes it over
        seg = _segment.NamedHandle(ref.seg_id, ref.name, ref.size).attach()
    except FileNotFoundError as exc:
        raise SerializationError(
            f"shared-memory segment {ref.name} is gone: its sender exited or gave up on the "
            "transfer before it was received"
        ) from exc
    _make_room(seg.size)
    header_words(seg)[CACHED] = 1  # after our reference is taken: users() counts it
    _cache[ref.name] = seg
    _count("mapped", seg.size)
    return seg


def _make_room(size: int) -> None:
    # With _cache_lock held: drop what the senders retired (it will not come again), then the
    # least recently used mappings until one more of ``size`` bytes fits.
    for name in [n for n, s in _cache.items() if header_words(s)[RETIRED]]:
        _evict(name)
    while _cache and (
        len(_cache) >= CACHE_MAX_SEGMENTS
        or sum(s.size for s in _cache.values()) + size > CACHE_MAX_BYTES
    ):
        _evict(next(iter(_cache)))


def _evict(name: str) -> None:
    # With _cache_lock held. The mapping and its reference go when the Segment is collected,
    # i.e. once no array of it is left here.
    seg = _cache.pop(name)
    header_words(seg)[CACHED] = 0


def _unlease(words: np.ndarray) -> Callable[[], None]:
    def release() -> None:
        if int(words[TICKET]) == LEASED:
            words[TICKET] = 0

    return release


def clear_cache() -> None:
    """Let go of every cached mapping (at shutdown); mappings still used by arrays stay until
    those are gone."""
    with _cache_lock:
        for name in list(_cache):
            _evict(name)


def cache_info() -> dict[str, int]:
    """Mappings of peers' segments kept for the next transfer: how many, and their bytes."""
    with _cache_lock:
        return {"segments": len(_cache), "bytes": sum(s.size for s in _cache.values())}


def _check_ticket(words: np.ndarray, ref: pb.SharedMemoryRef) -> None:
    if int(words[TICKET]) != ref.ticket:
        raise SerializationError(
            f"shared-memory segment {ref.name} no longer holds this transfer (its sender gave "
            "up on it)"
        )


def _count(what: str, nbytes: int) -> None:
    with _lock:
        _counts[what] += 1
        _counts[what + "_bytes"] += nbytes


def stats() -> dict[str, int]:
    """This process' counters: tensors (and bytes) sent, received, received from itself
    (``received_local``), ``fallback`` (pool full, streamed instead) and ``mapped`` (peers'
    segments mapped here; a transfer into a cached one maps nothing)."""
    with _lock:
        return dict(_counts)


def reset_stats() -> None:
    """Zero the counters (tests)."""
    with _lock:
        _counts.clear()


def forget(pool: SegmentPool) -> None:
    """Drop ``pool`` from the cancel table (it was closed)."""
    with _lock:
        for seg_id in [k for k, p in _pools.items() if p is pool]:
            del _pools[seg_id]


__all__ += ["forget", "DATA_OFFSET", "clear_cache", "cache_info"]
