"""Tensors and ndarrays <-> (TensorMeta, raw buffer): data never goes through pickle.

A non-contiguous view keeps its layout where PyTorch's does (its storage is under 8 KiB, or under
twice its elements): the memory its elements span travels with its strides
(``TensorMeta.strides``) and it arrives as a view of the same shape and strides. Any other
view is made contiguous first, so only its own elements travel. A large tensor for a peer on the
same host goes through shared memory instead (:mod:`gradwire._wire.shm`), one for any other
peer with a bulk lane over that lane (:mod:`gradwire._wire.bulk`). GPU (CuPy) arrays need an entry for their device in the map of their
direction (the caller's map for a request, its inverse for a reply or gradients;
``gradwire._runtime.cluster.device_maps``); without one the error is immediate and says which worker's
``set_device_map`` to extend. CPU arrays never use a map.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._proto import worker_pb2 as pb
from ..errors import SerializationError
from . import bulk, shm
from .framing import ALLOWED_DTYPES, byte_view

__all__ = [
    "KIND_TENSOR",
    "KIND_PARAMETER",
    "KIND_NDARRAY",
    "pack",
    "unpack",
    "tensor_classes",
    "check_within_base",
]

KIND_TENSOR, KIND_PARAMETER, KIND_NDARRAY = "tensor", "parameter", "ndarray"


_classes: tuple[Any, Any] | None = None


def tensor_classes() -> tuple[Any, Any]:
    """``(gradwire.Tensor, gradwire.nn.Parameter)``, each None while not importable (kept
    once both imported: this runs for every tensor sent and received)."""
    global _classes
    if _classes is not None:
        return _classes
    try:
        from .._tensor import Tensor
    except ImportError:
        Tensor = None  # type: ignore[assignment,misc]  # noqa: N806
    try:
        from ..nn import Parameter
    except ImportError:
        Parameter = None  # type: ignore[assignment,misc]  # noqa: N806
    if Tensor is not None and Parameter is not None:
        _classes = (Tensor, Parameter)
    return Tensor, Parameter


#: dtype -> its name, for the dtypes that travel raw (``dtype.name`` is a Python-level
#: property of NumPy's, ~3 us, and every tensor sent asks for it).
_DTYPE_NAMES: dict[Any, str] = {np.dtype(name): name for name in ALLOWED_DTYPES}


def _device_of(arr: Any) -> str:
    if isinstance(arr, np.ndarray):
        return "cpu"
    from .. import _backend

    return str(_backend.device_of(arr))


def pack(
    obj: Any, kind: str, peer: str = "", device_map: dict[str, str] | None = None
) -> tuple[pb.TensorMeta, memoryview] | None:
    """Describe ``obj`` and return its bytes, or None when it must be pickled instead.

    Args:
        obj: a gradwire Tensor (or Parameter) or a numpy.ndarray.
        kind: KIND_TENSOR, KIND_PARAMETER or KIND_NDARRAY.
        peer: destination worker name, for error messages.
        device_map: the map of this message's direction ``{"cuda:0": "cuda:1", ...}`` (a
            ``DeviceRoute`` carries the hint for a missing entry).

    Returns:
        ``(meta, buffer)``, or None for an ndarray whose dtype cannot travel raw (object dtype).

    Raises:
        SerializationError: a GPU tensor without a device map entry for its device.
    """
    requires_grad = False
    arr = obj
    if kind != KIND_NDARRAY:
        arr = obj._data
        requires_grad = bool(obj.requires_grad)
    dtype_name = _DTYPE_NAMES.get(arr.dtype)
    if dtype_name is None and kind != KIND_NDARRAY and not arr.dtype.isnative:
        # A tensor's values in the other byte order: the receiver reads native ones. (An
        # ndarray is pickled instead, which keeps its dtype as it is.)
        arr = arr.astype(arr.dtype.newbyteorder("="))
        dtype_name = _DTYPE_NAMES.get(arr.dtype)
    if dtype_name is None:
        if kind == KIND_NDARRAY:
            return None
        raise SerializationError(f"tensor dtype {arr.dtype} cannot be sent")
    device = _device_of(arr)
    target = "cpu"
    if device != "cpu":
        target = (device_map or {}).get(device, "")
        if not target:
            # A reply's map is the caller's, inverted: the hint says where to add the entry.
            hint = getattr(device_map, "missing_hint", None) or (
                f"set rpc_backend_options.set_device_map({peer!r}, {{DEVICE: 'cuda:N'}}) on "
                "this worker"
            )
            raise SerializationError(
                f"cannot send a tensor on {device} to worker {peer!r}: no device map entry for "
                f"{device}; {hint.replace('DEVICE', repr(device))} (or move the tensor to the "
                "CPU first)"
            )
        arr = arr.get()  # device -> host copy; the receiver moves it to `target`
    check_within_base(arr, peer)
    meta = pb.TensorMeta(
        dtype=dtype_name,
        shape=arr.shape,
        nbytes=arr.nbytes,
        device=device,
        target_device=target,
        requires_grad=requires_grad,
        kind=kind,
    )
    layout = _layout_span(arr) if device == "cpu" else None
    if layout is not None:  # travels with its strides, in the stream
        span, strides = layout
        meta.nbytes = span.nbytes
        meta.strides.extend(strides)
        return meta, byte_view(span)
    ref = shm.offer(peer, arr)  # same-host peer: a copy in shared memory, no bytes in the stream
    if ref is not None:
        meta.shm.CopyFrom(ref)
        return meta, memoryview(b"")
    arr = np.ascontiguousarray(arr)
    bulk_ref = bulk.offer(peer, arr)  # written to the peer's bulk lane, no bytes in the stream
    if bulk_ref is not None:
        meta.bulk.CopyFrom(bulk_ref)
        return meta, memoryview(b"")
    return meta, byte_view(arr)


try:  # the bytes [low, high) an array's elements span, as NumPy computes them
    from numpy.lib.array_utils import byte_bounds as _extent  # NumPy >= 2
except ImportError:  # NumPy 1.26
    from numpy import byte_bounds as _extent  # type: ignore[attr-defined,no-redef]


#: PyTorch's rule for a view: its storage travels, keeping the layout, unless the storage is
#: at least this many bytes and at least twice the view's (then a contiguous copy travels).
_RECOPY_MIN_BYTES = 8 * 1024
_RECOPY_MIN_MULTIPLE = 2


def _layout_span(arr: np.ndarray) -> tuple[np.ndarray, list[int]] | None:
    """A non-contiguous view that keeps its layout on the wire (PyTorch's rule): the memory
    its elements span, as one contiguous run from its first element, and its strides in
    elements; None when it travels as a contiguous copy."""
    if arr.flags.c_contiguous or arr.size == 0:
        return None
    item = arr.itemsize
    if any(s < 0 or s % item for s in arr.strides):
        return None
    lo, hi = _extent(arr)
    owner = _owner_extent(arr)
    storage = owner[1] - owner[0] if owner is not None else hi - lo
    if storage >= _RECOPY_MIN_BYTES and storage >= _RECOPY_MIN_MULTIPLE * arr.nbytes:
        return None
    # Within the allocation (check_within_base ran): every stride is >= 0, so the first
    # element is the lowest address and the run ends at the last element.
    span = np.lib.stride_tricks.as_strided(arr, shape=((hi - lo) // item,), strides=(item,))
    return span, [s // item for s in arr.strides]


def _owner_extent(arr: np.ndarray) -> tuple[int, int] | None:
    """The bytes of the allocation ``arr`` was made from, or None when it cannot be told."""
    node = arr
    for _ in range(64):  # a chain of views; each step goes one base down
        base = node.base
        if base is None:
            return _extent(node)
        if isinstance(base, np.ndarray):
            node = base
            continue
        try:
            raw = np.frombuffer(base, dtype=np.uint8)  # bytes, memoryview, mmap, shared memory
        except (TypeError, ValueError):
            inner = getattr(base, "base", None)  # as_strided keeps its source here
            if not isinstance(inner, np.ndarray):
                return None
            node = inner
            continue
        return _extent(raw)
    return None


def check_within_base(arr: np.ndarray, peer: str = "") -> None:
    """Refuse an array whose elements lie outside the memory it was made from (a view built
    from unchecked strides or offset, which would send whatever memory lies past its buffer).

    Raises:
        SerializationError: naming the array's shape and strides.
    """
    if arr.base is None or arr.size == 0:
        return
    owner = _owner_extent(arr)
    if owner is None:
        return
    lo, hi = _extent(arr)
    if lo < owner[0] or hi > owner[1]:
        dest = f" to worker {peer!r}" if peer else ""
        raise SerializationError(
            f"refusing to send an array{dest} whose memory lies outside its base buffer "
            f"(shape {arr.shape}, strides {arr.strides}: a view made with unchecked strides "
            "or offset); send a copy of valid data instead"
        )


def unpack(meta: pb.TensorMeta, arr: np.ndarray) -> Any:
    """Rebuild what ``pack`` described from the received host array.

    Raises:
        SerializationError: a tensor arrived but gradwire.Tensor is not available here, or the
            target device does not exist on this worker.
    """
    if meta.target_device and meta.target_device != "cpu":
        from .. import _backend

        try:
            arr = _backend.to_device(arr, _backend.Device(meta.target_device))
        except RuntimeError as exc:
            raise SerializationError(f"cannot place tensor on {meta.target_device}: {exc}") from exc
    if meta.kind == KIND_NDARRAY:
        return arr
    Tensor, Parameter = tensor_classes()  # noqa: N806
    if meta.kind == KIND_PARAMETER and Parameter is not None:
        return Parameter._wrap(arr, requires_grad=meta.requires_grad)
    if Tensor is None:
        raise SerializationError("received a tensor but gradwire.Tensor is not importable here")
    return Tensor._wrap(arr, requires_grad=meta.requires_grad)
