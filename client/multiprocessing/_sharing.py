"""Tensor.share_memory_() and Tensor.is_shared(): move a CPU tensor's memory into a segment."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import numpy as np

from . import _segment

__all__ = ["share_memory_", "is_shared"]

log = logging.getLogger(__name__)


def _bounds(arr: np.ndarray) -> tuple[int, int]:
    lo, hi = np.lib.array_utils.byte_bounds(arr)
    return int(lo), int(hi)


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
    if not isinstance(tensor._data, np.ndarray):
        return True  # CUDA memory is shared through IPC handles, as in torch
    return _segment.segment_of(tensor._data) is not None


def share_memory_(tensor: Any) -> Any:
    """Move a CPU tensor's memory (and its base's, for a view) into shared memory, in place.

    The data is copied once into a new segment of the current sharing strategy and the tensor
    (and its base) then point into it; later sends of the tensor reuse that segment. A no-op for
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
    if not isinstance(tensor._data, np.ndarray) or is_shared(tensor):
        return tensor
    base = tensor._base if tensor._base is not None else tensor
    group = [base] if base is tensor else [base, tensor]
    if base is not tensor and _segment.segment_of(base._data) is not None:
        # The base was shared after this view was taken: the view's old memory is unrelated now.
        log.warning(
            "sharing a view whose base was moved to shared memory after the view was made; the "
            "view gets its own segment and no longer aliases its base (call share_memory_() on "
            "the base before taking views)"
        )
        group = [tensor]
    arrays = [t._data for t in group]
    bounds = [_bounds(a) for a in arrays]
    lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
    seg = _segment.create(hi - lo)
    if hi > lo:
        ctypes.memmove(seg.address, lo, hi - lo)
    for t, arr in zip(group, arrays):
        t._data = seg.ndarray(arr.dtype, arr.shape, arr.strides, arr.ctypes.data - lo)
        t._shared = seg
    return tensor
