"""Array backends and devices: the only module that imports CuPy, and only when asked to."""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
from typing import Any, Callable, TypeVar, cast

import numpy as np

__all__ = [
    "Device",
    "device",
    "array_module",
    "cupy_or_none",
    "device_scope",
    "device_scope_of",
    "on_input_device",
    "is_cuda_available",
    "to_device",
]

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")
_cupy: Any = None
_F = TypeVar("_F", bound=Callable[..., Any])
_cupy_checked = False


def cupy_or_none() -> Any:
    """Return the cupy module if it imports and sees a device, else None (checked once)."""
    global _cupy, _cupy_checked
    if not _cupy_checked:
        _cupy_checked = True
        try:
            cp = importlib.import_module("cupy")
            if cp.cuda.runtime.getDeviceCount() > 0:
                _cupy = cp
        except Exception:  # ImportError, or a CUDA runtime without a device
            _cupy = None
    return _cupy


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
            f"{what} needs a CUDA device, but none is available: install gradwire[cuda] "
            "(CuPy) on a machine with an NVIDIA GPU, or keep the tensor on 'cpu'"
        )
    return cp


def array_module(arr: Any) -> Any:
    """Return numpy or cupy, whichever owns ``arr``."""
    if isinstance(arr, np.ndarray) or np.isscalar(arr):
        return np
    cp = cupy_or_none()
    if cp is not None and isinstance(arr, cp.ndarray):
        return cp
    return np


def device_of(arr: Any) -> Device:
    """The Device of an ndarray (numpy: cpu; cupy: cuda:N)."""
    if isinstance(arr, np.ndarray):
        return CPU
    cp = cupy_or_none()
    if cp is not None and isinstance(arr, cp.ndarray):
        return Device("cuda", arr.device.id)
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


def to_device(arr: Any, dev: Device) -> Any:
    """Copy ``arr`` to ``dev`` (no copy when it is already there)."""
    src = device_of(arr)
    if src == dev:
        return arr
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
