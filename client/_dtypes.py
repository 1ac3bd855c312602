"""Dtype objects like torch's (``gradwire.float32``), each wrapping a NumPy dtype."""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

__all__ = [
    "dtype",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "half",
    "float",
    "double",
    "long",
    "int",
    "cfloat",
    "cdouble",
    "get_default_dtype",
    "set_default_dtype",
    "to_numpy_dtype",
    "from_numpy_dtype",
]


class dtype:
    """A tensor element type. Compare with ``gradwire.float32`` etc."""

    __slots__ = ("name", "np", "is_floating_point", "is_complex")

    def __init__(self, name: str, np_dtype: Any) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)
        self.is_floating_point = self.np.kind == "f"
        self.is_complex = self.np.kind == "c"

    @property
    def itemsize(self) -> builtins.int:
        return self.np.itemsize  # not int(): this module rebinds `int` to gradwire.int32

    def __repr__(self) -> str:
        return f"gradwire.{self.name}"

    def __reduce__(self) -> str:
        return self.name


float16 = half = dtype("float16", np.float16)
float32 = dtype("float32", np.float32)
float64 = double = dtype("float64", np.float64)
complex64 = cfloat = dtype("complex64", np.complex64)
complex128 = cdouble = dtype("complex128", np.complex128)
int8 = dtype("int8", np.int8)
int16 = dtype("int16", np.int16)
int32 = dtype("int32", np.int32)
int64 = long = dtype("int64", np.int64)
uint8 = dtype("uint8", np.uint8)
bool = dtype("bool", np.bool_)  # noqa: A001 - mirrors torch.bool
float = float32  # noqa: A001 - mirrors torch.float
int = int32  # noqa: A001 - mirrors torch.int

_BY_NP = {
    d.np: d
    for d in (
        float16,
        float32,
        float64,
        complex64,
        complex128,
        int8,
        int16,
        int32,
        int64,
        uint8,
        bool,
    )
}
_default = float32


def from_numpy_dtype(np_dtype: Any) -> dtype:
    """The gradwire dtype for a NumPy dtype; a clear error for unsupported ones."""
    key = np.dtype(np_dtype)
    try:
        return _BY_NP[key]
    except KeyError:
        raise TypeError(
            f"unsupported dtype {key}: gradwire tensors hold "
            + ", ".join(sorted(d.name for d in _BY_NP.values()))
        ) from None


def to_numpy_dtype(d: Any) -> Any:
    """A NumPy dtype from a gradwire dtype, a NumPy dtype or a Python type."""
    if d is None:
        return None
    if isinstance(d, dtype):
        return d.np
    return from_numpy_dtype(d).np


def get_default_dtype() -> dtype:
    """The floating dtype used for Python floats (float32 unless changed)."""
    return _default


def set_default_dtype(d: dtype) -> None:
    """Set the floating dtype used for Python floats: float32 or float64."""
    global _default
    if d not in (float32, float64):
        raise TypeError(f"default dtype must be gradwire.float32 or gradwire.float64, got {d!r}")
    _default = d
