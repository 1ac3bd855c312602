"""Array backends and devices: the only module that imports CuPy, and only when asked to."""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
from typing import Any, Callable, TypeVar, cast

import numpy as np

from ._sparse_coo import SparseCOO

__all__ = [
    "Device",
    "device",
    "array_module",
    "cupy_or_none",
    "cuda_unavailable_reason",
    "device_scope",
    "device_scope_of",
    "on_input_device",
    "on_self_device",
    "ufunc_at",
    "is_cuda_available",
    "to_device",
]

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")
_cupy: Any = None
_F = TypeVar("_F", bound=Callable[..., Any])
_cupy_checked = False
#: Why CUDA cannot be used here, for the error a CUDA request gets ("" until checked).
_cupy_why = ""

#: What to do about each CUDA runtime error that ends the check (CuPy's error names).
_DRIVER_ADVICE = {
    "cudaErrorInsufficientDriver": "the NVIDIA driver is missing, or older than the CUDA "
    "runtime this CuPy was built for needs: install or update the driver (nvidia-smi shows "
    "it), or install the CuPy package built for the CUDA version the driver supports",
    "cudaErrorNoDevice": "no CUDA device is visible: check that the GPU is there (nvidia-smi) "
    "and that CUDA_VISIBLE_DEVICES does not hide it",
    "cudaErrorCallRequiresNewerDriver": "the NVIDIA driver is too old for this CuPy: update it",
    "cudaErrorSystemDriverMismatch": "the NVIDIA kernel module and user-space driver differ: "
    "reinstall the driver or reboot",
}


def cupy_or_none() -> Any:
    """Return the cupy module if it imports and sees a device, else None (checked once; why
    not is kept for the error of a later CUDA request, see :func:`cuda_unavailable_reason`)."""
    global _cupy, _cupy_checked, _cupy_why
    if not _cupy_checked:
        _cupy_checked = True
        _cupy = None
        try:
            cp = importlib.import_module("cupy")
        except ImportError as exc:
            _cupy_why = (
                f"CuPy is not installed ({exc}): install gradwire[cuda] (CuPy) on a machine "
                "with an NVIDIA GPU"
            )
            return None
        try:
            count = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001 - CuPy's CUDARuntimeError, or a load failure
            _cupy_why = _driver_error(cp, exc)
            return None
        if count > 0:
            _cupy = cp
        else:
            _cupy_why = f"CuPy {cp.__version__} sees no CUDA device (getDeviceCount() is 0)"
    return _cupy


def _driver_error(cp: Any, exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    name = text.split(":", 1)[0].strip()
    advice = _DRIVER_ADVICE.get(name, "check the NVIDIA driver and the CUDA installation")
    version = getattr(cp, "__version__", "?")
    return f"CuPy {version} is installed, but CUDA cannot be used: {text} ({advice})"


def cuda_unavailable_reason() -> str:
    """Why no CUDA device can be used here ("" when one can)."""
    return "" if cupy_or_none() is not None else _cupy_why


def is_cuda_available() -> bool:
    """True when CuPy is installed and at least one CUDA device is visible."""
    return cupy_or_none() is not None


class Device:
    """Where a tensor's memory lives: ``device("cpu")`` or ``device("cuda:0")``."""

    __slots__ = ("type", "index")
    type: str
    index: int | None

    def __init__(self, spec: str | Device | None = "cpu", index: int | None = None) -> None:
        if isinstance(spec, Device):
            self.type, self.index = spec.type, spec.index
            return
        if spec is None:
            spec = "cpu"
        if not isinstance(spec, str):
            raise TypeError(f"device must be a string like 'cpu' or 'cuda:0', got {spec!r}")
        m = _DEVICE_RE.match(spec.strip())
        if m is None:
            raise ValueError(f"unknown device {spec!r}: expected 'cpu', 'cuda' or 'cuda:N'")
        self.type = m.group(1)
        idx = m.group(2)
        self.index = int(idx) if idx is not None else index
        if self.type == "cuda" and self.index is None:
            self.index = 0
        if self.type == "cpu":
            self.index = None

    def __repr__(self) -> str:
        return f"device(type='{self.type}'" + (
            f", index={self.index})" if self.index is not None else ")"
        )

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = Device(other)
            except (ValueError, TypeError):
                return False
        return isinstance(other, Device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Device, (str(self),))


device = Device
CPU = Device("cpu")


def _require_cupy(what: str) -> Any:
    cp = cupy_or_none()
    if cp is None:
        raise RuntimeError(
            f"{what} needs a CUDA device, but none is available: {_cupy_why}; or keep the "
            "tensor on 'cpu'"
        )
    return cp


def array_module(arr: Any) -> Any:
    """Return numpy or cupy, whichever owns ``arr``."""
    if isinstance(arr, np.ndarray) or np.isscalar(arr):
        return np
    cp = cupy_or_none()
    if cp is not None and isinstance(arr, cp.ndarray):
        return cp
    if type(arr) is SparseCOO:
        return array_module(arr.values)
    return np


def device_of(arr: Any) -> Device:
    """The Device of an ndarray (numpy: cpu; cupy: cuda:N)."""
    if isinstance(arr, np.ndarray):
        return CPU
    cp = cupy_or_none()
    if cp is not None and isinstance(arr, cp.ndarray):
        return Device("cuda", arr.device.id)
    if type(arr) is SparseCOO:
        return device_of(arr.values)
    return CPU


def module_for(dev: Device) -> Any:
    """The array module for a device."""
    return np if dev.type == "cpu" else _require_cupy(f"device {dev}")


def device_scope(dev: Device) -> contextlib.AbstractContextManager[Any]:
    """Make ``dev`` CuPy's current device inside the block (CuPy allocates new arrays there);
    nothing to do for the CPU."""
    if dev.type == "cpu":
        return contextlib.nullcontext()
    return _require_cupy(f"device {dev}").cuda.Device(dev.index)


def device_scope_of(tensors: Any) -> contextlib.AbstractContextManager[Any] | None:
    """The CUDA device an op on ``tensors`` must run on, as a scope (CuPy launches kernels on
    the current device, as PyTorch's device guard does), or None when no tensor is on a GPU:
    the CPU path costs one type check per tensor.

    Raises:
        RuntimeError: CUDA tensors of two devices in one op (PyTorch's message).
    """
    dev: Device | None = None
    for t in tensors:
        data = getattr(t, "_data", None)
        if data is None or type(data) is np.ndarray:
            continue
        d = device_of(data)
        if d.type == "cpu":
            continue
        if dev is None:
            dev = d
        elif d != dev:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, {dev} and {d}! (move one with .to(), or map devices with "
                "set_device_map across workers)"
            )
    return None if dev is None else device_scope(dev)


def on_input_device(fn: _F) -> _F:
    """Run ``fn`` with the CUDA device of its tensor arguments current (for functions whose
    array code runs outside an op: losses, normalisation, ...); a plain call on the CPU."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        scope = device_scope_of(args)
        if scope is None:
            return fn(*args, **kwargs)
        with scope:
            return fn(*args, **kwargs)

    return cast(_F, wrapper)


def on_self_device(fn: _F) -> _F:
    """A Tensor method run with its tensor's CUDA device current: what it does to the array
    outside an op (``fill_``'s ``data[...] = v``, ``copy_``, ``equal``, the in-place fast path,
    ...) launches CuPy kernels on the current device, which must be the array's (without peer
    access CuPy refuses an array of another device). On the CPU: one type check."""

    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        scope = None if type(self._data) is np.ndarray else device_scope_of((self,))
        if scope is None:
            return fn(self, *args, **kwargs)
        with scope:
            return fn(self, *args, **kwargs)

    return cast(_F, method)


#: The dtypes CuPy's ``ufunc.at`` takes (CuPy 13 and 14; others raise TypeError before a kernel).
_CUPY_AT_DTYPES: dict[str, frozenset[str]] = {
    "add": frozenset("int32 int64 uint32 uint64 float16 float32 float64".split()),
    "maximum": frozenset("int32 int64 uint32 uint64 float32 float64".split()),
    "minimum": frozenset("int32 int64 uint32 uint64 float32 float64".split()),
}


def _rows_at(a: np.ndarray, indices: Any, b: Any) -> bool:
    """``np.add.at(a, indices, b)`` for whole rows (``indices`` 1-D integers, ``b`` one row per
    index), the scatter of embedding gradients, bags and sparse updates: the rows are sorted by
    index and each run summed by ``add.reduceat`` (2 to 7 times faster than ``add.at``, which
    visits one element at a time; the sums may differ in the last bits, by summation order).
    False, having done nothing, for any other call."""
    if not (
        a.ndim >= 2
        and type(indices) is np.ndarray
        and indices.ndim == 1
        and indices.dtype.kind in "iu"
        and type(b) is np.ndarray
        and b.shape == indices.shape + a.shape[1:]
        and b.dtype == a.dtype
        and indices.size
    ):
        return False
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    sums = np.add.reduceat(b[order], starts, axis=0)
    a[ordered[starts]] += sums.astype(a.dtype, copy=False)
    return True


def ufunc_at(name: str, a: Any, indices: Any, b: Any) -> None:
    """``xp.<name>.at(a, indices, b)`` in place, for ``add``, ``maximum`` and ``minimum``, on
    NumPy or CuPy. CuPy's ``at`` takes only some dtypes; for the others the same scatter runs
    in a wider dtype and is written back: complex ``add`` as its real and imaginary parts,
    bool and small integers through int64/uint64 (the cast back wraps as NumPy's does), and
    float16 ``maximum``/``minimum`` through float32 (exact).

    Raises:
        TypeError: ``maximum``/``minimum`` of complex CUDA arrays (CuPy has no such scatter).
    """
    xp = array_module(a)
    ufunc = getattr(xp, name)
    if xp is np and name == "add" and _rows_at(a, indices, b):
        return
    if xp is np or a.dtype.name in _CUPY_AT_DTYPES[name]:
        ufunc.at(a, indices, b)
        return
    kind = a.dtype.kind
    if kind == "c":
        if name != "add":
            raise TypeError(
                f"{name} scatter of complex CUDA tensors is not supported (CuPy's {name}.at "
                "takes no complex dtype); compare real and imaginary parts separately"
            )
        part = a.real.dtype
        values = xp.asarray(b)
        re = xp.zeros(a.shape, part)
        im = xp.zeros(a.shape, part)
        ufunc.at(re, indices, xp.real(values).astype(part))
        ufunc.at(im, indices, xp.imag(values).astype(part))
        a += re + 1j * im
        return
    wide = {"f": np.float32, "u": np.uint64}.get(kind, np.int64)
    work = a.astype(wide)
    ufunc.at(work, indices, xp.asarray(b).astype(wide))
    a[...] = work.astype(a.dtype)


def to_device(arr: Any, dev: Device) -> Any:
    """Copy ``arr`` to ``dev`` (no copy when it is already there)."""
    src = device_of(arr)
    if src == dev:
        return arr
    if type(arr) is SparseCOO:
        return SparseCOO(
            to_device(arr.indices, dev), to_device(arr.values, dev), arr.shape, arr.coalesced
        )
    if dev.type == "cpu":
        return arr.get()  # cupy -> numpy
    cp = _require_cupy(f"moving a tensor to {dev}")
    if src.type == "cpu":
        with cp.cuda.Device(dev.index):
            return cp.asarray(arr)
    # Device to device: an explicit peer copy (asarray returns a CuPy array as it is, wherever
    # it lives, so it would not move it).
    with cp.cuda.Device(src.index):
        arr = cp.ascontiguousarray(arr)
    with cp.cuda.Device(dev.index):
        out = cp.empty(arr.shape, arr.dtype)
        out.data.copy_from_device(arr.data, arr.nbytes)
    return out
