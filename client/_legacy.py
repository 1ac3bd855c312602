"""Legacy typed constructors: ``gradwire.LongTensor([1, 2])``, ``gradwire.FloatTensor(2, 3)``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._creation import tensor, zeros
from ._tensor import Tensor

__all__ = ["FloatTensor", "DoubleTensor", "LongTensor", "IntTensor", "BoolTensor"]


class _LegacyMeta(type):
    _np: Any

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, Tensor) and obj._data.dtype == cls._np and obj.device.type == "cpu"


class _LegacyTensor(metaclass=_LegacyMeta):
    """``X(*sizes)`` makes a zero-filled tensor of those sizes; ``X(data)`` one from data."""

    _np: Any = None

    def __new__(cls, *args: Any, device: Any = None) -> Any:  # noqa: D102 - see class docstring
        dt = cls._np
        if not args:
            return zeros(0, dtype=dt, device=device)
        if all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in args):
            return zeros(*[int(a) for a in args], dtype=dt, device=device)
        if len(args) == 1:
            data = args[0]
            if isinstance(data, Tensor):
                if data._data.dtype != dt:
                    raise TypeError(
                        f"expected {cls.__name__}'s dtype {np.dtype(dt)} (got {data.dtype}); "
                        f"use tensor.to({np.dtype(dt)}) to convert"
                    )
                return data
            return tensor(data, dtype=dt, device=device)
        raise TypeError(
            f"{cls.__name__}() takes sizes (ints) or one sequence of data, got "
            f"{tuple(type(a).__name__ for a in args)}"
        )


def _legacy(name: str, np_dtype: Any) -> Any:
    doc = (
        f"Legacy constructor of {np.dtype(np_dtype)} CPU tensors: ``{name}(data)`` or "
        f"``{name}(*sizes)`` (zero-filled); ``isinstance(t, {name})`` checks the dtype."
    )
    return _LegacyMeta(name, (_LegacyTensor,), {"_np": np_dtype, "__doc__": doc})


FloatTensor = _legacy("FloatTensor", np.float32)
DoubleTensor = _legacy("DoubleTensor", np.float64)
LongTensor = _legacy("LongTensor", np.int64)
IntTensor = _legacy("IntTensor", np.int32)
BoolTensor = _legacy("BoolTensor", np.bool_)
