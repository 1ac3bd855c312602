"""``assertEqual`` over tensors, as PyTorch's ``TestCase.assertEqual`` compares them.

The same comparison serves both implementations (gradwire's tensors, or torch's when the suite
runs on torch itself: PyTorch's own TestCase needs test-only packages).

Tensors compare by shape, dtype (``exact_dtype``) and values within the tolerance of their
dtype (PyTorch's defaults: float32 rtol 1.3e-6 / atol 1e-5, float64 1e-7 / 1e-7); a Python
number or nested sequence against a tensor compares as a tensor of the same dtype; lists,
tuples and dicts compare element by element; anything else as ``unittest`` does.
"""

from __future__ import annotations

import unittest
from typing import Any

import numpy as np

__all__ = ["TensorTestCase"]

_TOLERANCES = {
    np.dtype(np.float16): (1e-3, 1e-5),
    np.dtype(np.float32): (1.3e-6, 1e-5),
    np.dtype(np.float64): (1e-7, 1e-7),
    np.dtype(np.complex64): (1.3e-6, 1e-5),
    np.dtype(np.complex128): (1e-7, 1e-7),
}


def _tensor_type() -> type:
    from . import IMPL

    if IMPL == "torch":
        import torch

        return torch.Tensor  # type: ignore[no-any-return]
    import gradwire

    return gradwire.Tensor


def _array(value: Any) -> np.ndarray:
    if isinstance(value, _tensor_type()):
        return np.asarray(value.detach().cpu().numpy())
    return np.asarray(value)


class TensorTestCase(unittest.TestCase):
    """unittest.TestCase whose assertEqual understands tensors."""

    def assertEqual(  # noqa: N802 - unittest's name
        self,
        first: Any,
        second: Any,
        msg: Any = None,
        *,
        atol: float | None = None,
        rtol: float | None = None,
        exact_dtype: bool = True,
        **kwargs: Any,
    ) -> None:
        problem = self._difference(first, second, atol, rtol, exact_dtype)
        if problem is not None:
            raise self.failureException(f"{problem}{f' : {msg}' if msg else ''}")

    def assertNotEqual(self, first: Any, second: Any, msg: Any = None, **kwargs: Any) -> None:  # noqa: N802
        if self._difference(first, second, None, None, True) is None:
            raise self.failureException(msg or f"{first!r} == {second!r}")

    def _difference(
        self, a: Any, b: Any, atol: float | None, rtol: float | None, exact_dtype: bool
    ) -> str | None:
        tensor = _tensor_type()
        if isinstance(a, tensor) or isinstance(b, tensor):
            return self._tensor_difference(a, b, atol, rtol, exact_dtype)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            if len(a) != len(b):
                return f"lengths differ: {len(a)} != {len(b)}"
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                problem = self._difference(x, y, atol, rtol, exact_dtype)
                if problem is not None:
                    return f"at index {i}: {problem}"
            return None
        if isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                return f"keys differ: {sorted(map(str, a))} != {sorted(map(str, b))}"
            for key in a:
                problem = self._difference(a[key], b[key], atol, rtol, exact_dtype)
                if problem is not None:
                    return f"at key {key!r}: {problem}"
            return None
        if isinstance(a, float) or isinstance(b, float):
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                ok = np.isclose(a, b, rtol=rtol or 1e-7, atol=atol or 1e-7, equal_nan=True)
                return None if ok else f"{a!r} != {b!r}"
        try:
            super().assertEqual(a, b)
        except self.failureException as exc:
            return str(exc)
        return None

    def _tensor_difference(
        self, a: Any, b: Any, atol: float | None, rtol: float | None, exact_dtype: bool
    ) -> str | None:
        tensor = _tensor_type()
        both = isinstance(a, tensor) and isinstance(b, tensor)
        x = _array(a)
        y = _array(b) if isinstance(b, tensor) else np.asarray(b, dtype=x.dtype)
        if not isinstance(a, tensor):
            x = np.asarray(a, dtype=y.dtype)
        if both and x.shape != y.shape:
            return f"shapes differ: {x.shape} != {y.shape}"
        if both and exact_dtype and x.dtype != y.dtype:
            return f"dtypes differ: {a.dtype} != {b.dtype}"
        default_rtol, default_atol = _TOLERANCES.get(np.result_type(x, y), (0.0, 0.0))
        rtol = default_rtol if rtol is None else rtol
        atol = default_atol if atol is None else atol
        try:
            x, y = np.broadcast_arrays(x, y)
        except ValueError:
            return f"shapes differ: {x.shape} != {y.shape}"
        if x.dtype == bool or y.dtype == bool or x.dtype.kind in "iu" and y.dtype.kind in "iu":
            ok = bool(np.array_equal(x, y))
        else:
            ok = bool(np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True))
        return None if ok else f"tensors differ:\n{x}\n!=\n{y}"
