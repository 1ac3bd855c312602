"""How tensors cross process boundaries: ForkingPickler reductions into shared memory.

Sending a CPU tensor through a gradwire.multiprocessing Queue, Pipe, Pool or as a Process
argument moves it into shared memory (``share_memory_``) and pickles only its segment handle and
layout; the receiver maps the same memory, so writes on either side are seen by the other. CUDA
tensors travel as CUDA IPC handles (``_cuda_ipc``).
"""

from __future__ import annotations

import logging
import threading
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np

from . import _segment
from ._sharing import on_gpu, share_memory_, sparse_parts

__all__ = ["init_reductions", "reduce_tensor", "rebuild_cpu_tensor", "rebuild_sparse_tensor"]

log = logging.getLogger(__name__)
_Layout = tuple[str, tuple[int, ...], tuple[int, ...], int]  # dtype, shape, strides, offset
_bases: weakref.WeakValueDictionary[tuple[str, _Layout], Any] = weakref.WeakValueDictionary()
_bases_lock = threading.Lock()
_registered: set[type] = set()


def _layout(arr: np.ndarray, seg: _segment.Segment) -> _Layout:
    return (arr.dtype.str, tuple(arr.shape), tuple(arr.strides), arr.ctypes.data - seg.address)


def reduce_tensor(tensor: Any) -> tuple[Any, tuple[Any, ...]]:
    """The ForkingPickler reduction of a gradwire Tensor (moves it to shared memory first).

    Args:
        tensor: the tensor being pickled.

    Returns:
        ``(rebuild, args)`` as ``__reduce__`` does.

    Raises:
        RuntimeError: for a non-leaf tensor that requires grad (its graph cannot follow it).

    Example:
        >>> data = ForkingPickler.dumps(t)   # t is now in shared memory
        >>> again = pickle.loads(data)        # a view of the same memory
    """
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "cannot send a non-leaf tensor that requires grad to another process: its autograd "
            "graph stays in this process. Send tensor.detach() (a leaf sharing the same memory), "
            "or tensor.detach().requires_grad_() if the receiver needs a leaf that requires grad"
        )
    parts = sparse_parts(tensor)
    if parts is not None:
        share_memory_(tensor)  # its indices and values, each then sent as a shared tensor
        indices, values = sparse_parts(tensor) or parts
        coo = tensor._data
        return (
            rebuild_sparse_tensor,
            (type(tensor), indices, values, coo.shape, coo.coalesced, tensor.requires_grad),
        )
    if on_gpu(tensor):
        from . import _cuda_ipc

        return _cuda_ipc.reduce_cuda_tensor(tensor)
    share_memory_(tensor)
    seg = _segment.segment_of(tensor._data)
    assert seg is not None
    base = tensor._base
    base_layout = None
    if base is not None and _segment.segment_of(base._data) is seg:
        base_layout = _layout(base._data, seg)
    return (
        rebuild_cpu_tensor,
        (type(tensor), seg, _layout(tensor._data, seg), base_layout, tensor.requires_grad),
    )


def rebuild_sparse_tensor(
    cls: Any,
    indices: Any,
    values: Any,
    shape: tuple[int, ...],
    coalesced: bool,
    requires_grad: bool,
) -> Any:
    """The receiving side of a sparse tensor: its shared indices and values, as one tensor."""
    from .._sparse_coo import SparseCOO

    t = cls._wrap(SparseCOO(indices._data, values._data, shape, coalesced))
    t._shared = (indices._shared, values._shared)
    if requires_grad:
        t.requires_grad_(True)
    return t


def rebuild_cpu_tensor(
    cls: Any,
    seg: _segment.Segment,
    layout: _Layout,
    base_layout: _Layout | None,
    requires_grad: bool,
) -> Any:
    """Rebuild a tensor (a view into ``seg``) in the receiver; see :func:`reduce_tensor`."""
    dtype, shape, strides, offset = layout
    tensor = cls._wrap(seg.ndarray(np.dtype(dtype), shape, strides, offset), requires_grad)
    tensor._shared = seg
    if base_layout is not None:
        tensor._base = _base_for(seg, base_layout)
    else:
        # A base sent beside its views: make it the object the views' _base points to.
        with _bases_lock:
            _bases.setdefault((seg.seg_id, layout), tensor)
    return tensor


def _base_for(seg: _segment.Segment, layout: _Layout) -> Any:
    from .._tensor import Tensor

    key = (seg.seg_id, layout)
    with _bases_lock:
        base = _bases.get(key)
        if base is None:
            dtype, shape, strides, offset = layout
            base = Tensor._wrap(seg.ndarray(np.dtype(dtype), shape, strides, offset))
            base._shared = seg
            _bases[key] = base
        return base


def _tensor_types() -> list[type]:
    from .._tensor import Tensor

    try:  # make Parameter known before walking the subclasses
        from .. import nn  # noqa: F401
    except ImportError:  # also a circular import while gradwire itself is initialising
        log.debug("gradwire.nn not importable yet; call init_reductions() again later")
    found: list[type] = []
    todo: list[type] = [Tensor]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def init_reductions() -> None:
    """Register the tensor reductions with ``multiprocessing.reduction.ForkingPickler``.

    Called when gradwire.multiprocessing is imported; call it again after defining a Tensor
    subclass (ForkingPickler looks reductions up by exact type). Safe to call repeatedly.

    Example:
        >>> init_reductions()
    """
    try:
        types = _tensor_types()
    except ImportError:  # the tensor module is not importable (partial install)
        log.debug("gradwire._tensor unavailable; tensor reductions not registered")
        return
    for cls in types:
        if cls not in _registered:
            ForkingPickler.register(cls, reduce_tensor)
            _registered.add(cls)
