"""The system calls behind segments: shm_open/unlink, memfd, mmap/munmap, flock'd counters."""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import mmap
import os
import struct

from ._shm_manager import SHM_DIR

__all__ = [
    "HEADER",
    "adjust_count",
    "anonymous_fd",
    "map_shared",
    "shm_open",
    "shm_unlink",
    "unmap",
]

HEADER = 64  # named segments: int64 reference count, payload starts cache-line aligned
_COUNT = struct.Struct("=q")

try:
    import _posixshmem  # type: ignore[import-not-found]

    def shm_open(name: str, flags: int) -> int:
        """``shm_open(3)`` of ``/name`` with mode 0600."""
        return int(_posixshmem.shm_open("/" + name, flags, 0o600))

    def shm_unlink(name: str) -> None:
        """``shm_unlink(3)`` of ``/name``."""
        _posixshmem.shm_unlink("/" + name)

except ImportError:  # pragma: no cover - every POSIX CPython has it

    def shm_open(name: str, flags: int) -> int:
        """``shm_open(3)`` of ``/name`` with mode 0600 (through /dev/shm)."""
        return os.open(os.path.join(SHM_DIR, name), flags, 0o600)

    def shm_unlink(name: str) -> None:
        """``shm_unlink(3)`` of ``/name`` (through /dev/shm)."""
        os.unlink(os.path.join(SHM_DIR, name))


def anonymous_fd(tag: str) -> int:
    """A descriptor of fresh anonymous shared memory that never shows up in /dev/shm."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create(f"gradwire_{tag}", os.MFD_CLOEXEC)
    name = f"gradwire_fd_{os.getpid()}_{tag}"  # pragma: no cover - non-Linux
    fd = shm_open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    shm_unlink(name)
    return fd


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def map_shared(fd: int, length: int, what: str) -> int:
    """``mmap(2)`` ``length`` bytes of ``fd`` read-write and shared; return the address.

    Python's ``mmap`` module is not used because it keeps a duplicate of ``fd`` open for the
    mapping's lifetime, which would cost one descriptor per received segment.

    Raises:
        OSError: naming ``what`` when the kernel refuses.
    """
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    # MAP_POPULATE: fault the whole segment in with this one call (it is about to be read or
    # written in full) instead of one page fault per 4 KiB page on first touch.
    addr = _libc.mmap(None, length, prot, mmap.MAP_SHARED | _MAP_POPULATE, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of shared-memory segment {what} failed: {os.strerror(err)}")
    return int(addr)


def unmap(addr: int, length: int) -> None:
    """``munmap(2)``."""
    _libc.munmap(addr, length)


def adjust_count(name: str, delta: int, missing_ok: bool = False) -> int:
    """Change a named segment's reference count under flock; unlink it when it reaches zero.

    Returns:
        The new count (0 when the segment was already gone and ``missing_ok``).

    Raises:
        FileNotFoundError: if the segment is gone and not ``missing_ok``.
    """
    try:
        fd = shm_open(name, os.O_RDWR)
    except FileNotFoundError:
        if missing_ok:
            return 0
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (count,) = _COUNT.unpack(os.pread(fd, _COUNT.size, 0))
        count += delta
        os.pwrite(fd, _COUNT.pack(count), 0)
        if count <= 0:
            shm_unlink(name)
        return count
    finally:
        os.close(fd)  # also drops the lock


def init_count(fd: int) -> None:
    """Set a freshly created named segment's count to 1 (its creator's mapping)."""
    os.pwrite(fd, _COUNT.pack(1), 0)
