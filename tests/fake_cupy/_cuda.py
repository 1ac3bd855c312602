"""The ``cupy.cuda`` part of the test-only CuPy stand-in: devices, streams, events, memory, IPC.

Devices are numbers in ``range(device_count())``; the current one is per thread, as in CUDA.
Streams and events do nothing (NumPy work is finished when the call returns). Memory that can
be exported (``Memory``) lives in a POSIX shared-memory segment, so an "IPC handle" is the
segment's name and another process can open it; pointers are real addresses in this process.
"""

from __future__ import annotations

import ctypes
import os
import threading
import types
from multiprocessing import shared_memory
from typing import Any

__all__ = [
    "Device",
    "Event",
    "Stream",
    "Memory",
    "UnownedMemory",
    "MemoryPointer",
    "get_current_stream",
    "device_count",
    "current_device",
    "runtime",
    "memory",
]

_tls = threading.local()


def device_count() -> int:
    """How many devices the stand-in pretends to have (``GRADWIRE_FAKE_CUPY_DEVICES``, default 2)."""
    return int(os.environ.get("GRADWIRE_FAKE_CUPY_DEVICES", "2"))


def current_device() -> int:
    return int(getattr(_tls, "device", 0))


def check_current(device_id: int) -> None:
    """A kernel runs on the current device; like CuPy without peer access, an array of another
    device is refused (so gradwire must make a tensor's device current before computing)."""
    current = current_device()
    if device_id != current:
        raise ValueError(
            f"The device where the array resides ({device_id}) is different from the current "
            f"device ({current}). Peer access is unavailable."
        )


def check_device(device_id: int) -> int:
    if not 0 <= int(device_id) < device_count():
        raise RuntimeError(
            f"fake CuPy: invalid device ordinal {device_id} (stand-in has {device_count()})"
        )
    return int(device_id)


class Device:
    """``cupy.cuda.Device(i)``: a context manager that makes device ``i`` current."""

    def __init__(self, device: Any = None) -> None:
        self.id = current_device() if device is None else check_device(int(device))
        self._saved: list[int] = []

    def __enter__(self) -> Device:
        self._saved.append(current_device())
        _tls.device = self.id
        return self

    def __exit__(self, *exc: object) -> None:
        _tls.device = self._saved.pop()

    def use(self) -> None:
        _tls.device = self.id

    def synchronize(self) -> None:
        """Nothing is ever pending in the stand-in."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


class Stream:
    """A no-op stream (``ptr`` 0 is CUDA's legacy default stream)."""

    null: Stream

    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = 0

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


Stream.null = Stream()


def get_current_stream(device_id: int | None = None) -> Stream:
    return Stream.null


_events = iter(range(1, 1 << 62))


class Event:
    """A no-op event with a fake pointer (an IPC event handle is its number)."""

    def __init__(
        self, block: bool = False, disable_timing: bool = False, interprocess: bool = False
    ) -> None:
        self.ptr = next(_events)
        self.done = True

    def record(self, stream: Stream | None = None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class Memory:
    """``cupy.cuda.memory.Memory``: one exportable allocation, here a shared-memory segment."""

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.device_id = current_device()
        self._shm = shared_memory.SharedMemory(create=True, size=max(self.size, 1))
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self._shm.buf))
        assert _exportable is not None
        _exportable[self.ptr] = self

    def __del__(self) -> None:
        if _exportable is not None:  # None at interpreter shutdown
            _exportable.pop(getattr(self, "ptr", None), None)
        shm = getattr(self, "_shm", None)
        if shm is not None:
            try:
                shm.close()
                shm.unlink()
            except (BufferError, FileNotFoundError, OSError):
                pass  # a live view still maps it; the segment goes with the process


class UnownedMemory:
    """Memory owned by someone else (``owner`` keeps it alive), as in CuPy."""

    def __init__(self, ptr: int, size: int, owner: Any, device_id: int = -1) -> None:
        self.ptr, self.size, self.owner = int(ptr), int(size), owner
        self.device_id = current_device() if device_id < 0 else device_id


class HostMemory:
    """The stand-in's view of a plain array's buffer (what ``ndarray.data.mem`` returns)."""

    def __init__(self, ptr: int, size: int, device_id: int, owner: Any) -> None:
        self.ptr, self.size, self.device_id, self.owner = ptr, size, device_id, owner


class MemoryPointer:
    """``cupy.cuda.MemoryPointer(mem, offset)``: an address inside ``mem``."""

    def __init__(self, mem: Any, offset: int) -> None:
        self.mem, self.offset = mem, int(offset)
        self.ptr = mem.ptr + self.offset
        self.device_id = mem.device_id


_exportable: dict[int, Memory] | None = {}
_opened: dict[int, shared_memory.SharedMemory] = {}
_lock = threading.Lock()


def _ipc_get_mem_handle(ptr: int) -> bytes:
    assert _exportable is not None
    mem = _exportable.get(int(ptr))
    if mem is None:
        raise RuntimeError("fake CuPy: ipcGetMemHandle needs the start of a Memory allocation")
    return mem._shm.name.encode().ljust(64, b"\0")


def _ipc_open_mem_handle(handle: bytes, flags: int = 1) -> int:
    name = bytes(handle).rstrip(b"\0").decode()
    assert _exportable is not None
    with _lock:
        for mem in _exportable.values():
            if mem._shm.name == name:  # CUDA refuses to open a handle in its own process
                raise RuntimeError("fake CuPy: cudaErrorInvalidContext (own IPC handle)")
        shm = shared_memory.SharedMemory(name=name)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(shm.buf))
        _opened[ptr] = shm
    return ptr


def _ipc_close_mem_handle(ptr: int) -> None:
    with _lock:
        shm = _opened.pop(int(ptr), None)
    if shm is not None:
        try:
            shm.close()
        except BufferError:
            pass  # an array still maps it: the mapping goes with the process


def _memcpy(dst: int, src: int, size: int, kind: int = 0, stream: int = 0) -> None:
    ctypes.memmove(int(dst), int(src), int(size))


def open_ipc_count() -> int:
    """How many IPC mappings this process holds open (tests check they get closed)."""
    with _lock:
        return len(_opened)


runtime = types.SimpleNamespace(
    getDeviceCount=device_count,
    getDevice=current_device,
    ipcGetMemHandle=_ipc_get_mem_handle,
    ipcOpenMemHandle=_ipc_open_mem_handle,
    ipcCloseMemHandle=_ipc_close_mem_handle,
    ipcGetEventHandle=lambda ptr: int(ptr).to_bytes(8, "little").ljust(64, b"\0"),
    ipcOpenEventHandle=lambda handle: int.from_bytes(bytes(handle)[:8], "little"),
    streamWaitEvent=lambda stream, event, flags=0: None,
    eventDestroy=lambda event: None,
    memcpy=_memcpy,
    memcpyAsync=_memcpy,
    memcpyDeviceToDevice=3,
    memcpyHostToDevice=1,
    memcpyDeviceToHost=2,
    cudaIpcMemLazyEnablePeerAccess=1,
    deviceSynchronize=lambda: None,
)
memory = types.SimpleNamespace(
    Memory=Memory, UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer
)
