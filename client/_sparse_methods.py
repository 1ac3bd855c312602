"""The sparse COO surface of ``Tensor`` (PyTorch's names), ``gradwire.sparse_coo_tensor`` and
the layouts ``gradwire.strided`` / ``gradwire.sparse_coo``.

Dense code never tests for sparse operands. Arithmetic reaches the sparse ops through
``SPARSE_VARIANTS`` (an op whose dense forward a ``SparseCOO`` refuses runs its variant
instead, see ``_ops/_base.record``); the in-place methods, which write into the buffer without
an op, check here on their slow path only.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import _sparse_kernels as K
from . import _tensor_scatter  # noqa: F401  (first: the Tensor surface this module extends)
from ._backend import CPU, Device, device_of, device_scope, module_for, on_self_device, to_device
from ._ops import binary as B
from ._ops import reduce as R
from ._ops import scalar as S
from ._ops import sparse as SP
from ._ops import unary as U
from ._ops._base import SPARSE_VARIANTS
from ._sparse_coo import SparseCOO, unsupported
from ._sparse_coo import is_sparse_tensor as _is_sparse
from ._tensor import Tensor
from .autograd.grad_mode import no_grad

__all__ = ["layout", "strided", "sparse_coo", "sparse_coo_tensor"]


class layout:  # noqa: N801 - PyTorch's name (torch.layout)
    """A tensor's memory layout: ``gradwire.strided`` (dense) or ``gradwire.sparse_coo``."""

    __slots__ = ("name",)
    __module__ = "gradwire"  # pickled by name as gradwire.strided / gradwire.sparse_coo

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"gradwire.{self.name}"

    def __reduce__(self) -> str:
        return self.name


strided = layout("strided")
sparse_coo = layout("sparse_coo")


def _array(x: Any, device: Device | None, dtype: Any = None) -> Any:
    if isinstance(x, Tensor):
        if type(x._data) is SparseCOO:
            raise TypeError("sparse_coo_tensor: indices and values must be dense tensors")
        arr = x._data if device is None else to_device(x._data, device)
        return arr if dtype is None else arr.astype(dtype, copy=False)
    xp = module_for(device or CPU)
    with device_scope(device or CPU):
        return xp.asarray(x, dtype=dtype)


def sparse_coo_tensor(
    indices: Any,
    values: Any,
    size: Any = None,
    *,
    dtype: Any = None,
    device: Any = None,
    requires_grad: bool = False,
    check_invariants: bool | None = None,
    is_coalesced: bool | None = None,
) -> Tensor:
    """A sparse COO tensor whose elements are ``values`` at the columns of ``indices``.

    Args:
        indices: integer array-like of shape ``(sparse_dim, nnz)`` (cast to int64).
        values: array-like of shape ``(nnz, *dense_shape)``; a tensor that requires grad
            gets the gradient of the result at its columns.
        size: the full shape (default: one past the largest index per sparse dim, then the
            dense shape).
        dtype, device: of the values (default: those of ``values``).
        requires_grad: make the result a leaf that requires grad.
        check_invariants: accepted for PyTorch's signature; indices are always checked.
        is_coalesced: declare the columns sorted and unique (checked).

    Returns:
        The sparse tensor (``is_sparse`` True, ``layout`` ``gradwire.sparse_coo``).

    Raises:
        ValueError: shapes that do not agree, or an index outside ``size``.
        TypeError: non-integer indices.

    Example::

        s = gw.sparse_coo_tensor([[0, 2]], [1.0, 5.0], (4,))
        s.to_dense()  # tensor([1., 0., 5., 0.])
    """
    del check_invariants
    dev = Device(device) if device is not None else None
    if dev is None and isinstance(values, Tensor):
        dev = values.device
    with device_scope(dev or CPU):  # CuPy computes on the current device
        return _sparse_coo_tensor(indices, values, size, dtype, dev, requires_grad, is_coalesced)


def _sparse_coo_tensor(
    indices: Any,
    values: Any,
    size: Any,
    dtype: Any,
    dev: Device | None,
    requires_grad: bool,
    is_coalesced: bool | None,
) -> Tensor:
    from ._dtypes import get_default_dtype, to_numpy_dtype

    np_dt = to_numpy_dtype(dtype) if dtype is not None else None
    vals = _array(values, dev, np_dt)
    if np_dt is None and not hasattr(values, "dtype") and vals.dtype == np.float64:
        vals = vals.astype(get_default_dtype().np)  # Python floats: the default dtype
    idx = _array(indices, dev or device_of(vals))
    shape = tuple(int(s) for s in size) if size is not None else None
    coo = K.build(idx, vals, shape, bool(is_coalesced))
    if isinstance(values, Tensor) and values.requires_grad and coo.values is vals:
        out = SP.SparseFromValues.apply(values, coo=coo)
    else:
        out = Tensor._wrap(coo)
    if requires_grad:
        out.requires_grad_(True)
    return out


# ---------------------------------------------------------------------- the Tensor surface
def _coo(self: Tensor, what: str) -> SparseCOO:
    data = self._data
    if type(data) is not SparseCOO:
        raise RuntimeError(f"{what} expected a sparse COO tensor, got a dense (strided) one")
    return data


def _layout(self: Tensor) -> layout:
    return sparse_coo if type(self._data) is SparseCOO else strided


def _indices(self: Tensor) -> Tensor:
    return Tensor._wrap(_coo(self, "_indices()").indices)


def _values(self: Tensor) -> Tensor:
    return Tensor._wrap(_coo(self, "_values()").values)


def _need_coalesced(self: Tensor, what: str) -> SparseCOO:
    coo = _coo(self, what)
    if not coo.coalesced:
        raise RuntimeError(
            f"Cannot get {what.rstrip('()')} on an uncoalesced tensor, please call .coalesce() "
            "first"
        )
    return coo


def indices(self: Tensor) -> Tensor:
    return Tensor._wrap(_need_coalesced(self, "indices()").indices)


def values(self: Tensor) -> Tensor:
    _need_coalesced(self, "values()")
    return SP.Values.apply(self)


def coalesce(self: Tensor) -> Tensor:
    coo = _coo(self, "coalesce()")
    if coo.coalesced:
        return self
    return SP.Coalesce.apply(self)


def is_coalesced(self: Tensor) -> bool:
    return _coo(self, "is_coalesced()").coalesced


def to_dense(self: Tensor, dtype: Any = None) -> Tensor:
    out = SP.ToDense.apply(self) if type(self._data) is SparseCOO else self
    return out if dtype is None else out.to(dtype=dtype)


def to_sparse(self: Tensor, sparse_dim: int | None = None, *, layout: Any = None) -> Tensor:
    if layout is not None and layout is not sparse_coo:
        raise ValueError(f"to_sparse: only layout=gradwire.sparse_coo is supported, got {layout}")
    if type(self._data) is SparseCOO:
        if sparse_dim is not None and sparse_dim != self._data.sparse_dim:
            raise RuntimeError(
                f"to_sparse: tensor already has sparse_dim {self._data.sparse_dim}; "
                f"converting to {sparse_dim} is not supported"
            )
        return self
    return SP.ToSparse.apply(self, sparse_dim=sparse_dim)


def sparse_dim(self: Tensor) -> int:
    return _coo(self, "sparse_dim()").sparse_dim if self.is_sparse else 0


def dense_dim(self: Tensor) -> int:
    return _coo(self, "dense_dim()").dense_dim if self.is_sparse else self.ndim


def _nnz(self: Tensor) -> int:
    return _coo(self, "_nnz()").nnz


def sparse_mask(self: Tensor, mask: Tensor) -> Tensor:
    """``self`` (dense) at the columns of the sparse ``mask``, as a sparse tensor."""
    coo = _coo(mask, "sparse_mask(mask)")
    if type(self._data) is SparseCOO:
        raise NotImplementedError(unsupported("sparse_mask of a sparse tensor"))
    if self.shape != coo.shape:
        raise RuntimeError(
            f"sparse_mask(): expected mask of shape {list(self.shape)}, got {list(coo.shape)}"
        )
    return Tensor._wrap(K.mask(self._data, coo))


# ---------------------------------------------------------------------- arithmetic variants
def _add(a: Tensor, b: Tensor, alpha: Any = 1) -> Tensor:
    if a.shape != b.shape:
        raise RuntimeError(
            f"add: a sparse operand needs the other of the same shape, got {list(a.shape)} "
            f"and {list(b.shape)}"
        )
    if _is_sparse(a) and _is_sparse(b):
        return SP.SparseAdd.apply(a, b, alpha=alpha)
    if _is_sparse(b):
        return SP.DenseSparseAdd.apply(a, b, alpha=alpha)
    # sparse + dense: PyTorch refuses; the sum is the same dense tensor
    return SP.DenseSparseAdd.apply(b if alpha == 1 else b * alpha, a)


def _sub(a: Tensor, b: Tensor, alpha: Any = 1) -> Tensor:
    return _add(a, b, -alpha)


def _scale(x: Tensor, other: Any = 1) -> Tensor:
    return SP.SparseScale.apply(x, factor=other)


def _mul(a: Tensor, b: Tensor) -> Tensor:
    s, d = (a, b) if _is_sparse(a) else (b, a)
    if _is_sparse(d):
        raise NotImplementedError(unsupported("mul of two sparse tensors"))
    if d.ndim == 0:
        return _scale(s, d.item())
    if d.shape != s.shape:
        raise RuntimeError(
            f"mul: a sparse tensor multiplies a scalar or a dense tensor of its shape, got "
            f"{list(s.shape)} and {list(d.shape)}"
        )
    return SP.SparseMulDense.apply(s, d)


def _div(a: Tensor, b: Tensor) -> Tensor:
    if _is_sparse(b) or b.ndim != 0:
        raise NotImplementedError(unsupported("division by a tensor"))
    return _scale(a, 1 / b.item())


def _sum(x: Tensor, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    if keepdim:
        raise NotImplementedError(unsupported("sum with keepdim=True"))
    out = sparse_sum(x, dim)
    return out if dtype is None else out.to(dtype=dtype)


def sparse_sum(input: Tensor, dim: Any = None, dtype: Any = None) -> Tensor:
    """``gradwire.sparse.sum``: the sum over ``dim`` (all dims when None) of a sparse tensor;
    a dense tensor when every sparse dim is summed, else a coalesced sparse one."""
    coo = _coo(input, "gradwire.sparse.sum")
    nd = coo.ndim
    if dim is None:
        dims: tuple[int, ...] = ()
    else:
        raw = (dim,) if isinstance(dim, int) else tuple(dim)
        dims = tuple(sorted({int(d) % nd if -nd <= int(d) < nd else _bad_dim(d, nd) for d in raw}))
        if len(dims) == nd:
            dims = ()
    out = SP.SparseSum.apply(input, dims=dims)
    return out if dtype is None else out.to(dtype=dtype)


def _bad_dim(d: Any, nd: int) -> int:
    raise IndexError(
        f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], but got {d})"
    )


SPARSE_VARIANTS.update(
    {
        B.Add: _add,
        B.Sub: _sub,
        B.Mul: _mul,
        B.Div: _div,
        S.MulScalar: _scale,
        S.DivScalar: lambda x, other=1: _scale(x, 1 / other),
        U.Neg: lambda x: _scale(x, -1),
        R.Sum: _sum,
    }
)


# ---------------------------------------------------------------------- in place
def _zero_(self: Tensor) -> Tensor:
    with no_grad():
        self._data = K.empty_like(self._data)
    self._vc.value += 1
    return self


def _index_select(self: Tensor, dim: int, index: Tensor) -> Tensor:
    coo = self._data
    if not isinstance(index, Tensor) or index._data.ndim > 1 or index._data.dtype.kind not in "iu":
        raise TypeError("index_select(): index must be a 0-D or 1-D integer tensor")
    nd = coo.ndim
    if not -nd <= dim < nd:
        _bad_dim(dim, nd)
    d = dim % nd
    idx = index._data.reshape(-1).astype(np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= coo.shape[d]):
        raise IndexError(f"index_select(): index out of range for dim {d} of size {coo.shape[d]}")
    return SP.SparseIndexSelect.apply(self, dim=d, index=to_device(idx, self.device))


def _install() -> None:
    for name, fn in {
        "_indices": _indices,
        "_values": _values,
        "indices": indices,
        "values": values,
        "coalesce": coalesce,
        "is_coalesced": is_coalesced,
        "to_dense": to_dense,
        "to_sparse": to_sparse,
        "sparse_dim": sparse_dim,
        "dense_dim": dense_dim,
        "_nnz": _nnz,
    }.items():
        setattr(Tensor, name, fn)
    Tensor.layout = property(_layout)  # type: ignore[attr-defined]
    Tensor.sparse_mask = on_self_device(sparse_mask)  # type: ignore[attr-defined]
    for name in ("zero_", "index_select"):
        dense = getattr(Tensor, name)
        variants: dict[str, Callable[..., Any]] = {"zero_": _zero_, "index_select": _index_select}
        sparse = on_self_device(variants[name])
        setattr(Tensor, name, _either(dense, sparse))


def _either(dense: Any, sparse: Any) -> Any:
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        return (sparse if type(self._data) is SparseCOO else dense)(self, *args, **kwargs)

    method.__name__ = dense.__name__
    method.__doc__ = dense.__doc__
    return method


_install()
