"""CuPy tensors across processes: CUDA IPC memory and event handles plus producer refcounts.

Sending (``reduce_cuda_tensor``): the tensor's memory is moved, once, into its own
``cudaMalloc`` allocation (a pooled sub-allocation cannot be exported alone), like
``share_memory_`` does for CPU tensors, so later sends reuse it and both sides see each other's
writes. The pickle carries the IPC memory handle, the layout, an IPC event recorded after the
producer's pending work, and a refcount slot (``_cuda_refcount``) that keeps the producer's
memory alive until the consumer's array is garbage collected.

Receiving (``rebuild_cuda_tensor``): open the handle (once per process and allocation), make
the current stream wait on the producer's event, wrap the memory in a CuPy array whose
finalizer closes the handle and releases the slot. A tensor that comes back to its producer is
rebuilt from the producer's own memory (opening one's own IPC handle fails).

Tested without a GPU against a CuPy stand-in (tests/fake_cupy: IPC handles are shared-memory
segments there) and, on a GPU, by the ``gpu``-marked test; the bookkeeping lives in
``_cuda_refcount`` and needs no GPU at all (docs/gpu.md).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

from .._backend import cuda_unavailable_reason, cupy_or_none
from ._cuda_refcount import SlotRef, registry, release_slot

__all__ = ["reduce_cuda_tensor", "rebuild_cuda_tensor"]

log = logging.getLogger(__name__)
_opened: weakref.WeakValueDictionary[tuple[int, bytes], _OpenedIpcMemory] = (
    weakref.WeakValueDictionary()
)
_opened_lock = threading.Lock()
_exports: weakref.WeakValueDictionary[int, _ExportedMemory] = weakref.WeakValueDictionary()
_exports_lock = threading.Lock()


def _cupy() -> Any:
    cp = cupy_or_none()
    if cp is None:
        raise RuntimeError(
            "sharing a CUDA tensor between processes needs CuPy and a visible CUDA device: "
            f"{cuda_unavailable_reason()}; or move it to the CPU first (tensor.to('cpu'))"
        )
    return cp


class _ExportedMemory:
    """Producer side: a dedicated allocation that can be exported, and its IPC handle."""

    def __init__(self, cp: Any, nbytes: int) -> None:
        self.memory = cp.cuda.memory.Memory(max(nbytes, 1))  # plain cudaMalloc, not pooled
        self.handle = bytes(cp.cuda.runtime.ipcGetMemHandle(self.memory.ptr))


class _OpenedIpcMemory:
    """Consumer side: an opened IPC allocation; closing and releasing happen on collection."""

    def __init__(self, cp: Any, device: int, handle: bytes, slot: SlotRef) -> None:
        with cp.cuda.Device(device):
            self.ptr = cp.cuda.runtime.ipcOpenMemHandle(
                handle, cp.cuda.runtime.cudaIpcMemLazyEnablePeerAccess
            )
        self.slots = [slot]
        weakref.finalize(self, _close, cp, device, self.ptr, self.slots)


def _close(cp: Any, device: int, ptr: int, slots: list[SlotRef]) -> None:
    try:
        with cp.cuda.Device(device):
            cp.cuda.runtime.ipcCloseMemHandle(ptr)
    except Exception:  # interpreter shutdown or a lost context: the driver cleans up
        log.debug("could not close CUDA IPC mapping %#x", ptr, exc_info=True)
    for slot in slots:
        release_slot(slot)


def _byte_bounds(a: Any) -> tuple[int, int]:
    lo = hi = int(a.data.ptr)
    if a.size == 0:
        return lo, lo
    for n, st in zip(a.shape, a.strides):
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi + a.itemsize


def _export(cp: Any, tensor: Any) -> _ExportedMemory:
    arr = tensor._data
    with _exports_lock:
        known = _exports.get(arr.data.mem.ptr)
    if known is not None:
        return known
    base = tensor._base if tensor._base is not None else tensor
    group = [base] if base is tensor else [base, tensor]
    arrays = [t._data for t in group]
    bounds = [_byte_bounds(a) for a in arrays]
    lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
    device = arr.device.id
    with cp.cuda.Device(device):
        exported = _ExportedMemory(cp, hi - lo)
        # Arrays hold the UnownedMemory, whose owner keeps the exported allocation alive.
        wrapper = cp.cuda.UnownedMemory(
            exported.memory.ptr, exported.memory.size, exported, device_id=device
        )
        if hi > lo:  # byte-for-byte, so views keep their offsets and strides
            cp.cuda.runtime.memcpyAsync(
                exported.memory.ptr,
                lo,
                hi - lo,
                cp.cuda.runtime.memcpyDeviceToDevice,
                cp.cuda.get_current_stream().ptr,
            )
        for t, a in zip(group, arrays):
            ptr = cp.cuda.MemoryPointer(wrapper, a.data.ptr - lo)
            t._data = cp.ndarray(a.shape, a.dtype, ptr, a.strides)
    with _exports_lock:
        _exports[exported.memory.ptr] = exported
    return exported


def reduce_cuda_tensor(tensor: Any) -> tuple[Any, tuple[Any, ...]]:
    """ForkingPickler reduction of a CuPy-backed tensor (see the module docstring).

    Raises:
        RuntimeError: without CuPy/CUDA, or for a tensor this process received over IPC
            (re-sending it is not supported: send ``tensor.clone()``).
    """
    cp = _cupy()
    arr = tensor._data
    with _opened_lock:
        received = any(o.ptr == arr.data.mem.ptr for o in _opened.values())
    if received:
        raise RuntimeError(
            "cannot send a CUDA tensor this process received from another process: its memory "
            "belongs to the producer. Send a process-local copy instead (tensor.clone())"
        )
    exported = _export(cp, tensor)
    arr = tensor._data
    device = arr.device.id
    with cp.cuda.Device(device):
        event = cp.cuda.Event(block=False, disable_timing=True, interprocess=True)
        event.record()
        event_handle = bytes(cp.cuda.runtime.ipcGetEventHandle(event.ptr))
    slot = registry().register((exported, event))
    layout = (
        arr.dtype.str,
        tuple(arr.shape),
        tuple(arr.strides),
        arr.data.ptr - exported.memory.ptr,
    )
    return (
        rebuild_cuda_tensor,
        (
            type(tensor),
            device,
            exported.handle,
            exported.memory.size,
            layout,
            event_handle,
            slot,
            tensor.requires_grad,
        ),
    )


def rebuild_cuda_tensor(
    cls: Any,
    device: int,
    handle: bytes,
    alloc_size: int,
    layout: tuple[str, tuple[int, ...], tuple[int, ...], int],
    event_handle: bytes,
    slot: SlotRef,
    requires_grad: bool,
) -> Any:
    """Rebuild a CUDA tensor in the consumer; see :func:`reduce_cuda_tensor`."""
    cp = _cupy()
    dtype, shape, strides, offset = layout
    if slot.producer_pid == os.getpid():  # back home: use the memory itself, release the slot
        held = registry().local(slot)
        release_slot(slot)
        if held is None:
            raise RuntimeError("a CUDA tensor came back to its producer after being released")
        memory = held[0].memory
    else:
        with _opened_lock:
            opened = _opened.get((device, handle))
            if opened is None:
                opened = _OpenedIpcMemory(cp, device, handle, slot)
                _opened[(device, handle)] = opened
            else:
                opened.slots.append(slot)
        memory = cp.cuda.UnownedMemory(opened.ptr, alloc_size, opened, device_id=device)
        with cp.cuda.Device(device):
            event_ptr = cp.cuda.runtime.ipcOpenEventHandle(event_handle)
            cp.cuda.runtime.streamWaitEvent(cp.cuda.get_current_stream().ptr, event_ptr)
            cp.cuda.runtime.eventDestroy(event_ptr)
    arr = cp.ndarray(shape, cp.dtype(dtype), cp.cuda.MemoryPointer(memory, offset), strides)
    return cls._wrap(arr, requires_grad)
