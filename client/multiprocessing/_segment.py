"""Shared-memory segments: the one place that creates, maps, hands over and frees them.

A :class:`Segment` is a mapping of shared memory (a ctypes byte array placed on memory mapped
with ``mmap(2)``; Python's ``mmap`` module is not used because it keeps a duplicate of the
descriptor open for the mapping's lifetime); NumPy arrays built with :meth:`Segment.ndarray`
keep it mapped, and :func:`segment_of` finds the segment behind any such
array (or a view of one). Two kinds exist:

``file_descriptor`` (anonymous)
    ``memfd_create`` (or ``shm_open`` + immediate ``shm_unlink``): nothing ever appears in
    ``/dev/shm`` and the kernel frees the memory with the last mapping, whatever kills the
    processes. The creator keeps one descriptor so it can hand the segment over; a receiver maps
    the descriptor and closes it at once, so receiving any number of segments costs no descriptors.
``file_system`` (named)
    ``/dev/shm/gradwire_fs_<manager>_<id>`` with a 64-byte header holding a reference count
    (changed under ``flock``): one per mapping, plus one per handle in flight. The name is removed
    when the count reaches zero. The manager (``_shm_manager``) gives back the counts of
    processes that die holding them and removes whatever is left when the job ends.

Handing a segment to another process: :meth:`Segment.export` returns a :class:`NamedHandle`
(plain data: send it any way you like, then :meth:`NamedHandle.attach` on the other side) or a
:class:`FdHandle` (a descriptor the transport must pass with SCM_RIGHTS, then :func:`attach_fd`).
Pickling a Segment with ``multiprocessing.reduction.ForkingPickler`` does either automatically.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import secrets
import threading
import weakref
from dataclasses import dataclass
from multiprocessing import reduction, util
from typing import Any

import numpy as np

from . import _posix, _shm_client
from ._strategy import FILE_DESCRIPTOR, FILE_SYSTEM, get_sharing_strategy

__all__ = [
    "Segment",
    "NamedHandle",
    "FdHandle",
    "create",
    "attach_fd",
    "segment_of",
    "Lease",
    "live_segments",
    "mapped",
]

log = logging.getLogger(__name__)

_lock = threading.RLock()
_live: weakref.WeakValueDictionary[str, Segment] = weakref.WeakValueDictionary()


def _reset_lock_after_fork() -> None:  # a thread of the parent may have held it while forking
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_reset_lock_after_fork)


def _release_all_at_exit() -> None:
    """Give back this process' counts on named segments before it exits.

    Child processes of ``multiprocessing`` leave through ``os._exit``, which skips ``atexit``
    (and so ``weakref.finalize``); they do run multiprocessing's own exit finalizers, where
    this is registered. Mappings stay in place: only counts and descriptors are released.
    """
    with _lock:
        segments = list(_live.values())
    for seg in segments:
        finalizer = getattr(seg, "_finalizer", None)
        if finalizer is not None:
            finalizer()


class _ExitHook:
    """Installs :func:`_release_all_at_exit`, again in every child (``_bootstrap`` clears them)."""

    def install(self) -> None:
        # Priority -10: after the Queue feeder threads (-5) flushed, so their pickling is done.
        util.Finalize(None, _release_all_at_exit, exitpriority=-10)


_exit_hook = _ExitHook()
_exit_hook.install()
util.register_after_fork(_exit_hook, _ExitHook.install)


class Segment:
    """A shared-memory block mapped into this process (build with :func:`create` or attach).

    Instances are ctypes byte arrays over the mapping (a per-length subclass mixes this class
    in), so they export the buffer protocol and NumPy views keep them alive; the memory is
    unmapped when the last reference goes.

    Attributes:
        seg_id: a name unique across processes; the same memory has the same id everywhere.
        size: payload bytes, starting at ``offset`` inside the mapping.
        kind: ``"file_descriptor"`` or ``"file_system"``.
        name: the ``/dev/shm`` name (``file_system`` only).
    """

    seg_id: str
    size: int
    kind: str
    name: str | None
    offset: int
    _fd: int | None
    _addr: int
    _length: int

    @property
    def address(self) -> int:
        """The address of the first payload byte in this process."""
        return ctypes.addressof(self) + self.offset  # type: ignore[arg-type]

    def ndarray(
        self,
        dtype: Any,
        shape: tuple[int, ...],
        strides: tuple[int, ...] | None = None,
        offset: int = 0,
    ) -> np.ndarray:
        """A NumPy array over the payload (no copy); it keeps the segment mapped.

        Args:
            dtype: element type.
            shape: array shape.
            strides: byte strides (C order when None).
            offset: byte offset of the first element from the start of the payload.

        Returns:
            A writable ndarray whose writes every process mapping the segment sees.

        Example:
            >>> seg = create(80)
            >>> seg.ndarray(np.float64, (10,))[:] = 1.0
        """
        buffer: Any = self
        return np.ndarray(shape, dtype, buffer=buffer, offset=self.offset + offset, strides=strides)

    def export(self) -> NamedHandle | FdHandle:
        """A handle another process can attach to.

        For ``file_system`` segments the handle holds a reference (so the segment outlives this
        process' mapping while the handle is in flight) until it is attached or discarded. For
        ``file_descriptor`` segments the handle carries a fresh duplicate descriptor that the
        caller owns (pass it with SCM_RIGHTS, then close it).

        Returns:
            A :class:`NamedHandle` or a :class:`FdHandle`.

        Raises:
            RuntimeError: if the segment can no longer be handed over
                (see :meth:`fileno_for_export`).
        """
        if self.kind == FILE_SYSTEM:
            assert self.name is not None
            _posix.adjust_count(self.name, +1)
            return NamedHandle(self.seg_id, self.name, self.size)
        return FdHandle(self.seg_id, self.size, os.dup(self.fileno_for_export()))

    def fileno_for_export(self) -> int:
        """The descriptor of a ``file_descriptor`` segment, reopened if a receiver closed it.

        Raises:
            RuntimeError: if the descriptor was closed after mapping and Linux refuses to reopen
                it through ``/proc/self/map_files`` (needs CAP_SYS_ADMIN or
                CAP_CHECKPOINT_RESTORE).
        """
        if self._fd is None:
            start = self.address - self.offset
            end = start + -(-len(self) // mmap.PAGESIZE) * mmap.PAGESIZE  # type: ignore[arg-type]
            try:
                self._fd = os.open(
                    f"/proc/self/map_files/{start:x}-{end:x}", os.O_RDWR | os.O_CLOEXEC
                )
            except OSError as exc:
                raise RuntimeError(
                    "cannot send on a tensor this process received with the 'file_descriptor' "
                    "sharing strategy: its descriptor was closed after mapping and this system "
                    f"does not allow reopening it ({exc}). Send a copy (t.clone()) or call "
                    "gradwire.multiprocessing.set_sharing_strategy('file_system') in every process"
                ) from exc
            _rearm_finalizer(self)
        return self._fd

    def users(self) -> int | None:
        """How many mappings and in-flight handles hold a ``file_system`` segment (else None).

        A sender that keeps a segment for reuse can check ``users() == 1`` (only its own
        mapping) before overwriting it.

        Example:
            >>> seg = create(8, "file_system")
            >>> seg.users()
            1
        """
        if self.kind != FILE_SYSTEM:
            return None
        return int(np.frombuffer(self, np.int64, count=1)[0])  # type: ignore[call-overload]

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self.kind == FILE_SYSTEM:
            return (NamedHandle.attach, (self.export(),))
        return (_attach_dupfd, (self.seg_id, self.size, reduction.DupFd(self.fileno_for_export())))

    def __repr__(self) -> str:
        return f"<Segment {self.kind} id={self.seg_id} size={self.size}>"


@dataclass(frozen=True)
class NamedHandle:
    """A reference to a ``file_system`` segment in flight: attach it or discard it, once."""

    seg_id: str
    name: str
    size: int

    def attach(self) -> Segment:
        """Map the segment here, taking over the reference the handle held.

        Returns:
            The mapped :class:`Segment` (the one already mapped here, when there is one).

        Raises:
            FileNotFoundError: if the segment is gone (its creator and every process mapping it
                died, and the manager removed it).

        Example:
            >>> seg = NamedHandle(seg_id, name, size).attach()   # fields received from the sender
            >>> arr = seg.ndarray(np.float32, (1024,))
        """
        with _lock:
            seg = _live.get(self.seg_id)
            if seg is not None:
                _posix.adjust_count(
                    self.name, -1
                )  # already mapped: the mapping holds its own count
                return seg
            token = _shm_client.token_of(self.name)
            if token is not None:
                _shm_client.join(token)  # report to the manager that owns the segment
            try:
                fd = _posix.shm_open(self.name, os.O_RDWR)
            except FileNotFoundError as exc:
                raise FileNotFoundError(
                    f"shared-memory segment {self.name} is gone: the process that sent it and "
                    "every process mapping it exited before it was received"
                ) from exc
            try:
                seg = _map(fd, self.seg_id, self.size, FILE_SYSTEM, self.name, keep_fd=False)
            finally:
                os.close(fd)
            return seg

    def discard(self) -> None:
        """Release the handle's reference without attaching (the receiver will not come).

        Example:
            >>> handle = seg.export()
            >>> handle.discard()   # e.g. the RPC carrying it failed
        """
        _posix.adjust_count(self.name, -1, missing_ok=True)


@dataclass(frozen=True)
class FdHandle:
    """A ``file_descriptor`` segment in flight: ``fd`` must travel with SCM_RIGHTS."""

    seg_id: str
    size: int
    fd: int


def create(size: int, strategy: str | None = None) -> Segment:
    """Allocate a zero-filled shared segment of ``size`` payload bytes and map it.

    Args:
        size: payload bytes (0 is allowed).
        strategy: ``"file_descriptor"`` or ``"file_system"``; the current sharing strategy when
            None.

    Returns:
        The mapped :class:`Segment`.

    Raises:
        ValueError: for a negative size or an unknown strategy.
        OSError: if the system is out of shared memory or descriptors.

    Example:
        >>> seg = create(1 << 20, "file_system")
        >>> handle = seg.export()   # send handle to another process; there: handle.attach()
    """
    if size < 0:
        raise ValueError(f"segment size must be >= 0, got {size}")
    strategy = strategy or get_sharing_strategy()
    seg_id = secrets.token_hex(8)
    if strategy == FILE_DESCRIPTOR:
        fd = _posix.anonymous_fd(seg_id)
        try:
            os.ftruncate(fd, max(size, 1))
            return _map(fd, seg_id, size, FILE_DESCRIPTOR, None, keep_fd=True)
        except BaseException:
            os.close(fd)
            raise
    if strategy != FILE_SYSTEM:
        raise ValueError(f"unknown sharing strategy {strategy!r}")
    name = _shm_client.segment_prefix(_shm_client.connect()) + seg_id
    fd = _posix.shm_open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        os.ftruncate(fd, _posix.HEADER + max(size, 1))
        _posix.init_count(fd)
        return _map(fd, seg_id, size, FILE_SYSTEM, name, keep_fd=False)
    except BaseException:
        _posix.shm_unlink(name)
        raise
    finally:
        os.close(fd)


def attach_fd(fd: int, seg_id: str, size: int) -> Segment:
    """Map a ``file_descriptor`` segment received from another process; always closes ``fd``.

    Args:
        fd: the received descriptor (this call owns it).
        seg_id: the sender's ``Segment.seg_id``.
        size: the sender's ``Segment.size``.

    Returns:
        The mapped segment (the one already mapped here when ``seg_id`` is known).

    Example:
        >>> _, fds, _, _ = socket.recv_fds(sock, 16, 1)
        >>> seg = attach_fd(fds[0], seg_id, size)
    """
    try:
        with _lock:
            seg = _live.get(seg_id)
            if seg is None:
                seg = _map(fd, seg_id, size, FILE_DESCRIPTOR, None, keep_fd=False)
            return seg
    finally:
        os.close(fd)


class Lease:
    """The base of an ndarray over part of a segment that runs ``on_release`` once the last
    array (or view) using it is gone; it keeps the segment mapped meanwhile.

    Args:
        seg: the mapped segment.
        dtype, shape: the array.
        offset: byte offset of the first element from the start of the payload.
        on_release: called with no arguments when the lease is collected (any thread).

    Example:
        >>> arr = np.asarray(Lease(seg, np.float32, (4,), 64, lambda: None))
    """

    __slots__ = ("segment", "__array_interface__", "__weakref__")

    def __init__(
        self,
        seg: Segment,
        dtype: Any,
        shape: tuple[int, ...],
        offset: int,
        on_release: Any,
    ) -> None:
        self.segment = seg
        self.__array_interface__ = {
            "shape": shape,
            "typestr": np.dtype(dtype).str,
            "data": (seg.address + offset, False),
            "version": 3,
        }
        weakref.finalize(self, on_release)


def segment_of(arr: Any) -> Segment | None:
    """The segment an ndarray (or a view of one) lives in, or None.

    Example:
        >>> seg = create(8)
        >>> segment_of(seg.ndarray(np.int64, (1,))[0:]) is seg
        True
    """
    obj = arr
    while isinstance(obj, np.ndarray):
        obj = obj.base
    if isinstance(obj, Lease):
        return obj.segment
    return obj if isinstance(obj, Segment) else None


def mapped(seg_id: str) -> Segment | None:
    """The segment ``seg_id`` if it is mapped in this process."""
    with _lock:
        return _live.get(seg_id)


def live_segments() -> list[Segment]:
    """The segments mapped in this process (for tests and debugging)."""
    with _lock:
        return list(_live.values())


def _attach_dupfd(seg_id: str, size: int, dupfd: Any) -> Segment:
    try:
        fd = dupfd.detach()
    except (OSError, EOFError) as exc:
        raise RuntimeError(
            f"could not receive shared-memory segment {seg_id}: the sending process exited (or "
            "closed its descriptor server) before the receiver unpickled the tensor. With the "
            "'file_descriptor' strategy keep the sender alive until its tensors are received "
            "(for example wait on an Event), or use set_sharing_strategy('file_system')"
        ) from exc
    return attach_fd(fd, seg_id, size)


@functools.lru_cache(maxsize=4096)
def _segment_class(length: int) -> type[Segment]:
    return type("Segment", (Segment, ctypes.c_ubyte * length), {"__slots__": ()})


def _map(fd: int, seg_id: str, size: int, kind: str, name: str | None, keep_fd: bool) -> Segment:
    offset = _posix.HEADER if kind == FILE_SYSTEM else 0
    length = offset + max(size, 1)
    if name is not None:
        # Tell the manager first: a process killed while mapping (MAP_POPULATE makes that take
        # a while for a large segment) must still have its count given back.
        _shm_client.notify(name, took=True)
    try:
        addr = _posix.map_shared(fd, length, seg_id)
    except BaseException:
        if name is not None:
            _shm_client.notify(name, took=False)
        raise
    seg = _segment_class(length).from_address(addr)  # type: ignore[attr-defined]
    seg.seg_id, seg.size, seg.kind, seg.name, seg.offset = seg_id, size, kind, name, offset
    seg._fd = fd if keep_fd else None  # keep_fd: the segment now owns fd
    seg._addr, seg._length = addr, length
    # Unmapping at interpreter exit could pull memory from under arrays still in use by other
    # exit handlers, so only the count/descriptor release runs then.
    unmap = weakref.finalize(seg, _posix.unmap, addr, length)
    unmap.atexit = False
    _rearm_finalizer(seg)
    with _lock:
        _live[seg_id] = seg
    return seg


def _rearm_finalizer(seg: Segment) -> None:
    old = getattr(seg, "_finalizer", None)
    if old is not None:
        old.detach()
    seg._finalizer = weakref.finalize(  # type: ignore[attr-defined]
        seg, _release, os.getpid(), seg.kind, seg._fd, seg.name
    )


def _release(pid: int, kind: str, fd: int | None, name: str | None) -> None:
    if os.getpid() != pid:  # an inherited copy after fork holds no count and no descriptor
        return
    if fd is not None:
        os.close(fd)
    if kind == FILE_SYSTEM and name is not None:
        # Tell the manager first: dying between the two leaks a count until the job ends,
        # the other order could give it back twice.
        _shm_client.notify(name, took=False)
        _posix.adjust_count(name, -1, missing_ok=True)
