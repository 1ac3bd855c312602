"""Reference counts that keep a producer's CUDA memory alive while consumers use it.

CUDA IPC maps the producer's allocation into the consumer; if the producer frees (and the pool
reuses) it while a consumer still reads, the consumer sees garbage. So each send of a CUDA
tensor takes a *slot*: a counter in a small ``file_system`` shared segment (a *block*) that the
producer owns. The producer sets the counter to 1 and keeps a strong reference to the memory;
the consumer decrements it when its array is garbage collected; the producer drops its
reference for every slot that reached zero whenever it sends again (or on :meth:`collect`).

Counters change under ``flock`` on the block's name, so neither side needs atomics. If a
consumer dies from a fatal signal its counter never reaches zero and the producer keeps that
memory until it exits (the caveat PyTorch documents too). This module needs no GPU.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
from dataclasses import dataclass
from typing import Any

from . import _posix, _segment
from ._strategy import FILE_SYSTEM

__all__ = ["SlotRef", "ProducerRegistry", "release_slot", "registry"]

log = logging.getLogger(__name__)
_SLOTS = 1024
_COUNTER = struct.Struct("=q")


@dataclass(frozen=True)
class SlotRef:
    """Which counter a consumer must decrement: block name, slot index, producer pid."""

    block: str
    slot: int
    producer_pid: int


def _update(name: str, slot: int, delta: int | None, value: int | None = None) -> int:
    """Add ``delta`` to (or set ``value`` in) one counter under flock; return the new value."""
    fd = _posix.shm_open(name, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        at = _posix.HEADER + slot * _COUNTER.size
        (count,) = _COUNTER.unpack(os.pread(fd, _COUNTER.size, at))
        count = value if value is not None else count + (delta or 0)
        os.pwrite(fd, _COUNTER.pack(count), at)
        return count
    finally:
        os.close(fd)


def release_slot(ref: SlotRef) -> None:
    """Consumer side: this process no longer uses the memory behind ``ref``.

    Safe to call after the producer exited (its blocks are gone then; nothing to do).

    Example:
        >>> release_slot(ref)  # from the finalizer of the received array
    """
    try:
        _update(ref.block, ref.slot, -1)
    except FileNotFoundError:
        log.debug("producer %d is gone; nothing to release for %s", ref.producer_pid, ref)


class ProducerRegistry:
    """Producer side: the memory of every CUDA tensor sent and not yet released."""

    def __init__(self, slots_per_block: int = _SLOTS) -> None:
        self._slots_per_block = slots_per_block
        self._lock = threading.Lock()
        self._blocks: list[_segment.Segment] = []
        self._free: list[tuple[int, int]] = []  # (block index, slot)
        self._held: dict[tuple[int, int], Any] = {}

    def register(self, memory: Any) -> SlotRef:
        """Hold ``memory`` for one consumer and return the slot that consumer will release.

        Args:
            memory: whatever keeps the device allocation alive (a CuPy memory object).

        Returns:
            The :class:`SlotRef` to send along with the IPC handle.
        """
        with self._lock:
            self._collect_locked()
            if not self._free:
                self._add_block()
            b, slot = self._free.pop()
            block = self._blocks[b]
            assert block.name is not None
            _update(block.name, slot, None, value=1)
            self._held[(b, slot)] = memory
            return SlotRef(block.name, slot, os.getpid())

    def local(self, ref: SlotRef) -> Any:
        """The memory behind a slot of this process (a tensor received by its own producer)."""
        with self._lock:
            for b, block in enumerate(self._blocks):
                if block.name == ref.block:
                    return self._held.get((b, ref.slot))
        return None

    def collect(self) -> int:
        """Drop the memory of every slot whose consumer released it; return how many.

        Example:
            >>> registry().collect()
            0
        """
        with self._lock:
            return self._collect_locked()

    def held(self) -> int:
        """How many sends are still held for their consumers."""
        with self._lock:
            return len(self._held)

    def _collect_locked(self) -> int:
        freed = 0
        for key in list(self._held):
            b, slot = key
            counters = self._blocks[b].ndarray("=i8", (self._slots_per_block,))
            if counters[slot] <= 0:
                del self._held[key]
                self._free.append(key)
                freed += 1
        if freed and not self._held:
            self._release_blocks_locked()
        return freed

    def _release_blocks_locked(self) -> None:
        # Nothing is held: give the counter blocks back, so an idle producer leaves nothing
        # in /dev/shm (the next send makes a new block).
        for block in self._blocks:
            finalizer = getattr(block, "_finalizer", None)
            if finalizer is not None:
                finalizer()
        self._blocks.clear()
        self._free.clear()

    def _add_block(self) -> None:
        block = _segment.create(self._slots_per_block * _COUNTER.size, FILE_SYSTEM)
        b = len(self._blocks)
        self._blocks.append(block)
        self._free.extend((b, s) for s in reversed(range(self._slots_per_block)))


_registry: ProducerRegistry | None = None
_registry_pid = -1
_registry_lock = threading.Lock()


def registry() -> ProducerRegistry:
    """This process' producer registry (a fresh one after fork: slots are per process)."""
    global _registry, _registry_pid
    with _registry_lock:
        if _registry is None or _registry_pid != os.getpid():
            _registry, _registry_pid = ProducerRegistry(), os.getpid()
        return _registry
