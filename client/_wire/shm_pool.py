"""Reusable shared-memory segments for the tensors one worker sends to one same-host peer.

Creating a segment and writing into its fresh pages runs at about 1 GB/s here, writing into a
segment that was used before at about 18 GB/s; so each destination peer gets a
:class:`SegmentPool` whose segments are reused once the receiver is done with them.

A segment's payload starts with three 8-byte words (padded to :data:`DATA_OFFSET`), then the
tensor's bytes:

* the *ticket* (:data:`TICKET`): the pool writes a fresh positive ticket before copying a tensor
  in; the receiver replaces it, in one store, with :data:`LEASED` while arrays of that transfer
  are alive in its process, and with 0 when the last one is gone;
* *cached* (:data:`CACHED`): 1 while the receiver keeps its mapping of the segment for the next
  transfer (that mapping holds one reference, so ``users()`` counts it);
* *retired* (:data:`RETIRED`): set by the pool when it drops the segment, so that a receiver's
  cache lets go of it too.

A segment is handed out again only when its ticket word is 0 (no transfer waits to be taken,
and the receiver holds no array of the last one) and ``Segment.users() == 1 + cached``: no
mapping but the pool's and the receiver's cache, so nobody else (say a child process the
receiver shared the tensor with) still looks at it. That is what keeps transfers by value (see
:mod:`gradwire._wire.shm`). A ticket that stays set longer than ``stale_seconds`` (the receiver
died, or the message was never delivered) retires the segment: the pool drops its mapping and
never writes it again; the memory goes when the last mapping does, and the segment manager of
:mod:`gradwire.multiprocessing` gives back the mappings of dead processes.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._proto import worker_pb2 as pb

__all__ = [
    "SegmentPool",
    "DATA_OFFSET",
    "capacity_for",
    "header_words",
    "TICKET",
    "CACHED",
    "RETIRED",
    "LEASED",
]

log = logging.getLogger(__name__)

#: Bytes before the tensor data in a pooled segment (three words, cache-line padded).
DATA_OFFSET = 64
#: Indices of the header words (int64) at the start of a pooled segment's payload.
TICKET, CACHED, RETIRED = 0, 1, 2
#: Ticket value while the receiver holds arrays of the transfer.
LEASED = -1
#: Smallest capacity step; capacities are rounded so that slightly different sizes share segments.
_MIN_STEP = 64 << 10


def capacity_for(nbytes: int) -> int:
    """Data capacity of a new segment for ``nbytes``: rounded up to 1/8 of its power of two.

    Example:
        >>> capacity_for(100 << 20) == 104 << 20
        True
    """
    step = max(_MIN_STEP, (1 << max(0, nbytes.bit_length() - 1)) // 8)
    return -(-nbytes // step) * step


def header_words(seg: Any) -> np.ndarray:
    """The int64 header words (:data:`TICKET`, :data:`CACHED`, :data:`RETIRED`) of a pooled
    segment, as an array over the segment."""
    return seg.ndarray(np.int64, (3,))


@dataclass
class _Entry:
    seg: Any  # gradwire.multiprocessing._segment.Segment
    capacity: int
    words: np.ndarray  # int64[3] over the segment's header words
    sent_at: float = 0.0
    last_used: float = 0.0

    def in_flight(self) -> bool:
        """A ticket is set and the receiver has not taken it yet."""
        return int(self.words[TICKET]) > 0

    def free(self) -> bool:
        return int(self.words[TICKET]) == 0 and self.seg.users() == 1 + int(self.words[CACHED] != 0)


class SegmentPool:
    """The segments that carry tensors from this worker to one peer.

    Args:
        peer: destination worker name (for logs).
        threshold: tensors smaller than this many bytes are not offered (they stream).
        max_bytes: data capacity the pool may hold; beyond it a tensor streams instead.
        stale_seconds: a segment whose ticket is still set after this long is retired.
        idle_seconds: a free segment unused for this long is retired at the next send, so a
            burst of large tensors does not pin its memory for the life of the worker.
    """

    def __init__(
        self,
        peer: str,
        threshold: int,
        max_bytes: int,
        stale_seconds: float,
        idle_seconds: float = 60.0,
    ) -> None:
        self.peer = peer
        self.threshold = threshold
        self.max_bytes = max_bytes
        self.stale_seconds = stale_seconds
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._bytes = 0
        self._closed = False
        self.created = self.reused = self.retired = self.full = 0
        # Tickets only tell transfers apart (a late receiver must not take a later transfer's
        # data): a PRNG seeded from the OS once is enough, and costs no syscall per send.
        self._tickets = random.Random(secrets.randbits(64))

    def put(self, arr: np.ndarray) -> pb.SharedMemoryRef | None:
        """Copy ``arr`` into a free segment and return the reference the receiver needs.

        Args:
            arr: a host array of an allowed dtype, any strides.

        Returns:
            The ``SharedMemoryRef`` for ``TensorMeta.shm``, or None when the pool is closed or
            full (the caller then streams the tensor).

        Raises:
            OSError: the system is out of shared memory.
        """
        ticket = self._tickets.getrandbits(62) | 1
        entry = self._acquire(arr.nbytes, ticket)
        if entry is None:
            return None
        try:
            dest = entry.seg.ndarray(arr.dtype, arr.shape, offset=DATA_OFFSET)
            np.copyto(dest, arr, casting="no")
        except BaseException:
            self.cancel(entry.seg.seg_id, ticket)
            raise
        return pb.SharedMemoryRef(
            name=entry.seg.name,
            offset=DATA_OFFSET,
            size=entry.seg.size,
            seg_id=entry.seg.seg_id,
            ticket=ticket,
        )

    def cancel(self, seg_id: str, ticket: int) -> bool:
        """Take back a segment whose message was never sent; True if it was this pool's."""
        with self._lock:
            entry = self._entries.get(seg_id)
            if entry is None or int(entry.words[TICKET]) != ticket:
                return False
            entry.words[TICKET] = 0
            return True

    def close(self) -> None:
        """Drop every segment (receivers that still map one keep it alive)."""
        with self._lock:
            self._closed = True
            for entry in self._entries.values():
                entry.words[RETIRED] = 1
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> dict[str, int]:
        """Segments held, bytes held, segments in flight (ticket not yet taken), and the
        created/reused/retired/full counters."""
        with self._lock:
            return {
                "segments": len(self._entries),
                "in_flight": sum(e.in_flight() for e in self._entries.values()),
                "bytes": self._bytes,
                "created": self.created,
                "reused": self.reused,
                "retired": self.retired,
                "full": self.full,
            }

    def _acquire(self, nbytes: int, ticket: int) -> _Entry | None:
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return None
            best: _Entry | None = None
            for seg_id, entry in list(self._entries.items()):
                if entry.in_flight():
                    if now - entry.sent_at > self.stale_seconds:
                        log.warning(
                            "shared-memory segment %s to %s was never taken; retiring it",
                            seg_id,
                            self.peer,
                        )
                        self._retire(seg_id)
                    continue
                if not entry.free():
                    continue
                if now - entry.last_used > self.idle_seconds:
                    self._retire(seg_id)
                    continue
                fits = nbytes <= entry.capacity <= 2 * nbytes + _MIN_STEP
                if fits and (best is None or entry.capacity < best.capacity):
                    best = entry
            if best is not None:
                self.reused += 1
            else:
                best = self._create_locked(nbytes)
                if best is None:
                    self.full += 1
                    return None
            # Set before the copy, under the lock: no other sender can take it from here on.
            best.words[TICKET] = ticket
            best.sent_at = best.last_used = now
            return best

    def _create_locked(self, nbytes: int) -> _Entry | None:
        from ..multiprocessing import _segment

        capacity = capacity_for(nbytes)
        if capacity > self.max_bytes:
            return None
        if self._bytes + capacity > self.max_bytes:
            # Make room: drop free segments, least recently used first.
            for entry in sorted(self._entries.values(), key=lambda e: e.last_used):
                if self._bytes + capacity <= self.max_bytes:
                    break
                if entry.free():
                    self._retire(entry.seg.seg_id)
            if self._bytes + capacity > self.max_bytes:
                return None
        seg = _segment.create(DATA_OFFSET + capacity, "file_system")
        if not _reserve(seg):
            log.warning(
                "no room in /dev/shm for a %d-byte segment to %s; sending through the stream",
                capacity,
                self.peer,
            )
            return None
        entry = _Entry(seg, capacity, header_words(seg))
        self._entries[seg.seg_id] = entry
        self._bytes += capacity
        self.created += 1
        return entry

    def _retire(self, seg_id: str) -> None:
        entry = self._entries.pop(seg_id)
        entry.words[RETIRED] = 1  # a receiver that caches its mapping lets go of it
        self._bytes -= entry.capacity
        self.retired += 1


def _reserve(seg: Any) -> bool:
    """Allocate the segment's pages now: a full /dev/shm (Docker's default is 64 MB) then means
    False here instead of SIGBUS in the middle of a copy. Costs no more than faulting them in."""
    from ..multiprocessing import _posix

    fd = _posix.shm_open(seg.name, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, _posix.HEADER + seg.size)
    except OSError as exc:
        return exc.errno != errno.ENOSPC  # a file system without fallocate: go ahead
    finally:
        os.close(fd)
    return True
