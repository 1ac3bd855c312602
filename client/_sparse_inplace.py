"""In-place arithmetic with a sparse COO operand (``add_``, ``sub_``, ``mul_``, ``div_``): the
slow path of ``_tensor_methods``' in-place methods, taken only after the dense fast path
refused a ``SparseCOO``."""

from __future__ import annotations

from typing import Any

from . import _sparse_kernels as K
from ._sparse_coo import is_sparse_tensor as _is_sparse
from ._sparse_coo import unsupported
from .autograd.grad_mode import _state

__all__ = ["inplace_sparse"]


def inplace_sparse(self: Any, other: Any, alpha: Any, op: str) -> Any:
    """``self <op>= other`` when either is sparse (None when neither is). Dense += sparse
    scatters into the buffer; sparse += sparse and sparse *= scalar replace the index and
    value arrays. Not recorded by autograd (raises when it would have to be)."""
    if not (_is_sparse(self) or _is_sparse(other)):
        return None
    other_grad = bool(getattr(other, "requires_grad", False))
    if _state.grad_enabled and (self.requires_grad or other_grad):
        raise NotImplementedError(unsupported(f"in-place {op}_ recorded by autograd"))
    if op in ("add", "sub"):
        factor = alpha if op == "add" else -alpha
        if getattr(other, "shape", None) != self.shape:
            raise RuntimeError(f"{op}_: a sparse operand needs a tensor of the same shape")
        if _is_sparse(self) and not _is_sparse(other):
            raise RuntimeError(
                f"{op}_(sparse, dense) is not supported: the result is dense. Use "
                f"dense.{op}_(sparse) or sparse.to_dense()"
            )
        if _is_sparse(self):
            self._data = K.add(self._data, other._data, factor)
        else:
            K.add_into_dense(self._data, other._data, factor)
    else:
        if hasattr(other, "_data"):
            if _is_sparse(other) or other.ndim != 0:
                raise NotImplementedError(unsupported(f"{op}_ by a tensor"))
            other = other.item()
        coo = self._data
        self._data = coo.with_values(coo.values * other if op == "mul" else coo.values / other)
    self._vc.value += 1
    return self
