"""Tensor.share_memory_() and Tensor.is_shared(): move a CPU tensor's memory into a segment."""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

import numpy as np

from . import _segment

__all__ = ["share_memory_", "is_shared", "sparse_parts"]

log = logging.getLogger(__name__)
_move_lock = threading.RLock()  # a Queue feeder thread may share while the caller does too


def on_gpu(tensor: Any) -> bool:
    """True when the tensor's memory is a CUDA array (CuPy), not host memory."""
    return hasattr(tensor._data, "__cuda_array_interface__")


def _bounds(arr: np.ndarray) -> tuple[int, int]:
    lo, hi = np.lib.array_utils.byte_bounds(arr)
    return int(lo), int(hi)


def _follow_base(view: Any, seg: _segment.Segment) -> None:
    """Re-point a view taken before its base moved into ``seg`` at the same bytes inside it."""
    arr = view._data
    lo, hi = _bounds(arr)
    origin = getattr(seg, "origin", None)
    if origin is not None and origin[0] <= lo and hi <= origin[1]:
        view._data = seg.ndarray(arr.dtype, arr.shape, arr.strides, arr.ctypes.data - origin[0])
        view._shared = seg
        return
    log.warning(
        "a view's base is in shared memory but the view does not lie inside it; the view gets "
        "its own segment and no longer aliases its base"
    )
    view._base = None
    share_memory_(view)


def is_shared(tensor: Any) -> bool:
    """True when the tensor's memory lives in a shared segment (CUDA tensors: always True).

    Views taken of a shared tensor are shared too: the answer follows the array's memory, not a
    flag.

    Args:
        tensor: a gradwire Tensor.

    Returns:
        Whether other processes can map the same memory.

    Example:
        >>> t = gradwire.zeros(3)
        >>> is_shared(t), is_shared(share_memory_(t))
        (False, True)
    """
    parts = sparse_parts(tensor)
    if parts is not None:
        return all(is_shared(p) for p in parts)
    if on_gpu(tensor):
        return True  # CUDA memory is shared through IPC handles, as in torch
    return _segment.segment_of(tensor._data) is not None


def sparse_parts(tensor: Any) -> tuple[Any, Any] | None:
    """A sparse tensor's indices and values as two tensors over its arrays (None if dense)."""
    from .._sparse_coo import SparseCOO
    from .._tensor import Tensor

    coo = tensor._data
    if type(coo) is not SparseCOO:
        return None
    return Tensor._wrap(coo.indices), Tensor._wrap(coo.values)


def _share_sparse(tensor: Any, parts: tuple[Any, Any]) -> None:
    """Move a sparse tensor's indices and values into shared memory (each its own segment)."""
    for p in parts:
        share_memory_(p)
    coo = tensor._data
    tensor._data = type(coo)(parts[0]._data, parts[1]._data, coo.shape, coo.coalesced)
    tensor._shared = (parts[0]._shared, parts[1]._shared)  # keeps both segments mapped


def share_memory_(tensor: Any) -> Any:
    """Move a CPU tensor's memory (and its base's, for a view) into shared memory, in place.

    The data is copied once into a new segment of the current sharing strategy and the tensor
    (and its base) then point into it; later sends of the tensor reuse that segment. A view of
    an already shared base is re-pointed into the base's segment when it is shared or sent
    (NumPy cannot redirect it earlier: writes made through such a view between the base's move
    and its own are not carried over, so share the base before taking views). A no-op for
    tensors already shared and for CUDA tensors.

    Args:
        tensor: a gradwire Tensor.

    Returns:
        ``tensor`` itself.

    Raises:
        OSError: if shared memory or descriptors run out.

    Example:
        >>> t = gradwire.ones(4).share_memory_()
        >>> t.is_shared()
        True
    """
    parts = sparse_parts(tensor)
    if parts is not None:
        if not on_gpu(parts[1]):
            _share_sparse(tensor, parts)
        return tensor
    if on_gpu(tensor) or is_shared(tensor):
        return tensor
    with _move_lock:
        if not is_shared(tensor):
            _move(tensor)
    return tensor


def _move(tensor: Any) -> None:
    for t in (tensor, tensor._base):
        if t is not None and not isinstance(t._data, np.ndarray):
            t._data = np.asarray(t._data)  # a NumPy scalar becomes a 0-d array
    base = tensor._base if tensor._base is not None else tensor
    base_seg = _segment.segment_of(base._data) if base is not tensor else None
    if base_seg is not None:
        _follow_base(tensor, base_seg)
        return
    group = [base] if base is tensor else [base, tensor]
    arrays = [t._data for t in group]
    bounds = [_bounds(a) for a in arrays]
    lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
    seg = _segment.create(hi - lo)
    if hi > lo:
        ctypes.memmove(seg.address, lo, hi - lo)
    seg.origin = (lo, hi)  # type: ignore[attr-defined]
    for t, arr in zip(group, arrays):
        t._data = seg.ndarray(arr.dtype, arr.shape, arr.strides, arr.ctypes.data - lo)
        t._shared = seg
