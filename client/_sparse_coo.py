"""The storage of a sparse COO tensor and the array kernels on it (NumPy or CuPy alike).

A sparse tensor is a :class:`~gradwire.Tensor` whose ``_data`` is a :class:`SparseCOO` instead
of an ndarray: ``indices`` (int64, ``(sparse_dim, nnz)``), ``values`` (``(nnz, *dense_shape)``)
and the full ``shape``. Its element at ``(i0, ..., ik)`` is the sum of the values whose index
column is ``(i0, ..., ik)``: duplicates add up until :func:`coalesce` merges them (sorted, unique
columns). Everything here is arrays in, arrays out: autograd lives in ``_ops/sparse.py`` and the
Tensor surface in ``_sparse_methods.py``.

Any array operation this module does not implement fails on a ``SparseCOO`` with an error that
says so (``__array__``, ``__array_ufunc__``, ``__array_function__`` and unknown attributes), and
``Op`` dispatch turns such a failure into a ``NotImplementedError`` naming the op.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["SparseCOO", "is_sparse", "is_sparse_tensor", "unsupported"]


def unsupported(what: str) -> str:
    """The message for an operation sparse tensors do not have."""
    return (
        f"{what} is not supported on sparse COO tensors; convert with .to_dense() first "
        "(sparse tensors support add/sub, mul/div by a scalar, index_select, coalesce, "
        "to_dense, sum and gradwire.sparse.sum)"
    )


class SparseCOO:
    """A sparse COO array: ``indices`` (int64, ``(sparse_dim, nnz)``), ``values``
    (``(nnz, *shape[sparse_dim:])``), ``shape``, and whether the index columns are known to be
    sorted and unique (``coalesced``). Arrays are NumPy or CuPy (both on one device)."""

    __slots__ = ("indices", "values", "shape", "coalesced")

    def __init__(self, indices: Any, values: Any, shape: tuple[int, ...], coalesced: bool) -> None:
        self.indices = indices
        self.values = values
        self.shape = tuple(int(s) for s in shape)
        self.coalesced = bool(coalesced)

    # -- what generic code reads off an array ----------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> Any:
        return self.values.dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return int(self.values.itemsize)

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[1])

    @property
    def sparse_dim(self) -> int:
        return int(self.indices.shape[0])

    @property
    def dense_dim(self) -> int:
        return len(self.shape) - self.sparse_dim

    def copy(self) -> SparseCOO:
        return SparseCOO(self.indices.copy(), self.values.copy(), self.shape, self.coalesced)

    def astype(self, dtype: Any) -> SparseCOO:
        return SparseCOO(self.indices, self.values.astype(dtype), self.shape, self.coalesced)

    def with_values(self, values: Any) -> SparseCOO:
        """The same index columns with other values."""
        return SparseCOO(self.indices, values, self.shape, self.coalesced)

    # -- everything else refuses, saying what to do --------------------------------------------
    def __getattr__(self, name: str) -> Any:
        raise AttributeError(unsupported(f"array attribute {name!r}"))

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise TypeError(unsupported("conversion to a dense array"))

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        raise TypeError(unsupported(f"the array function {ufunc.__name__}"))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise TypeError(unsupported(f"the array function {func.__name__}"))

    def __repr__(self) -> str:
        return f"SparseCOO(shape={self.shape}, nnz={self.nnz}, coalesced={self.coalesced})"


def is_sparse(arr: Any) -> bool:
    return type(arr) is SparseCOO


def is_sparse_tensor(t: Any) -> bool:
    """True for a tensor (anything with ``_data``) whose storage is a SparseCOO."""
    return type(getattr(t, "_data", None)) is SparseCOO
