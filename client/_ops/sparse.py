"""Differentiable ops on sparse COO tensors (``Tensor._data`` a :class:`SparseCOO`).

Gradients follow PyTorch's layouts: an op whose input is sparse gives it a sparse gradient at
its (coalesced) index columns where PyTorch does (``to_dense``, ``gradwire.sparse.sum``, ``mul``
by a scalar, sparse + sparse), and a dense one where PyTorch does (``dense + sparse``).
"""

from __future__ import annotations

from typing import Any

from .. import _sparse_kernels as K
from .._backend import array_module, ufunc_at
from .._sparse_coo import SparseCOO
from .._tensor import Tensor
from ._base import Op

__all__ = [
    "SparseFromValues",
    "ToDense",
    "ToSparse",
    "Coalesce",
    "Values",
    "SparseAdd",
    "DenseSparseAdd",
    "SparseScale",
    "SparseMulDense",
    "SparseSum",
    "SparseIndexSelect",
    "dense_array",
]


class _SparseOp(Op):
    sparse_inputs = True


def dense_array(g: Tensor) -> Any:
    """The gradient ``g`` as an ndarray, whatever its layout."""
    data = g._data
    return K.to_dense(data) if type(data) is SparseCOO else data


def _sparse_at(columns: SparseCOO, g: Tensor) -> Tensor:
    """``g`` restricted to the (coalesced) columns of ``columns``: a sparse gradient."""
    return Tensor._wrap(K.mask(dense_array(g), columns))


class SparseFromValues(_SparseOp):
    """``sparse_coo_tensor(indices, values, size)``: the gradient of ``values`` is the incoming
    gradient at each index column (each duplicate gets it whole)."""

    def forward(self, values: Any, coo: SparseCOO) -> Any:
        self.save("indices", coo.indices)
        return coo

    def backward(self, g: Any) -> Any:
        return Tensor._wrap(dense_array(g)[tuple(self.saved("indices"))])

    def name(self) -> str:
        return "SparseCooTensorWithDimsAndTensorsBackward0"


class ToDense(_SparseOp):
    def forward(self, x: Any) -> Any:
        self.save("columns", x._data)
        return K.to_dense(x._data)

    def backward(self, g: Any) -> Any:
        return _sparse_at(self.saved("columns"), g)

    def name(self) -> str:
        return "ToDenseBackward0"


class ToSparse(_SparseOp):
    def forward(self, x: Any, sparse_dim: int | None = None) -> Any:
        return K.from_dense(x._data, sparse_dim)

    def backward(self, g: Any) -> Any:
        return Tensor._wrap(dense_array(g))

    def name(self) -> str:
        return "ToSparseBackward0"


class Coalesce(_SparseOp):
    """Merging duplicates leaves the tensor's value as it is: the gradient passes through."""

    def forward(self, x: Any) -> Any:
        return K.coalesce(x._data)  # only applied to an uncoalesced tensor: a new one

    def backward(self, g: Any) -> Any:
        return g

    def name(self) -> str:
        return "CoalesceBackward0"


class Values(_SparseOp):
    """``values()`` of a coalesced sparse tensor (a view of its values)."""

    def forward(self, x: Any) -> Any:
        self.save("coo", x._data)
        return x._data.values

    def backward(self, g: Any) -> Any:
        return Tensor._wrap(self.saved("coo").with_values(dense_array(g)))

    def name(self) -> str:
        return "ValuesBackward0"


class SparseAdd(_SparseOp):
    """sparse + alpha * sparse -> sparse."""

    def forward(self, a: Any, b: Any, alpha: Any = 1) -> Any:
        self.save("alpha", alpha)
        return K.add(a._data, b._data, alpha)

    def backward(self, g: Any) -> Any:
        alpha = self.saved("alpha")
        return g, (g if alpha == 1 else g * alpha)

    def name(self) -> str:
        return "AddBackward0"


class DenseSparseAdd(_SparseOp):
    """dense + alpha * sparse -> dense (both gradients dense, as PyTorch's)."""

    def forward(self, a: Any, b: Any, alpha: Any = 1) -> Any:
        self.save("alpha", alpha)
        out = a._data.astype(a._data.dtype, copy=True)
        K.add_into_dense(out, b._data, alpha)
        return out

    def backward(self, g: Any) -> Any:
        alpha = self.saved("alpha")
        return g, (g if alpha == 1 else g * alpha)

    def name(self) -> str:
        return "AddBackward0"


class SparseScale(_SparseOp):
    """sparse * scalar."""

    def forward(self, x: Any, factor: Any = 1) -> Any:
        self.save("factor", factor)
        coo = x._data
        values = coo.values * factor
        return coo.with_values(values)

    def backward(self, g: Any) -> Any:
        factor = self.saved("factor")
        if type(g._data) is SparseCOO:
            return Tensor._wrap(g._data.with_values(g._data.values * factor))
        return g * factor

    def name(self) -> str:
        return "MulBackward0"


class SparseMulDense(_SparseOp):
    """sparse * dense (same shape) -> sparse at the sparse operand's columns."""

    def forward(self, s: Any, d: Any) -> Any:
        coo = K.coalesce(s._data)
        picked = d._data[tuple(coo.indices)]
        self.save("coo", coo)
        self.save("picked", picked)
        return coo.with_values(coo.values * picked)

    def backward(self, g: Any) -> Any:
        coo = self.saved("coo")
        gv = K.mask(dense_array(g), coo).values
        gs = Tensor._wrap(coo.with_values(gv * self.saved("picked")))
        gd = Tensor._wrap(K.to_dense(coo.with_values(gv * coo.values)))
        return gs, gd

    def name(self) -> str:
        return "MulBackward0"


def _spread(rows: Any, like: Any) -> Any:
    """``rows`` broadcast to the shape of ``like``, as a new array of its dtype."""
    return array_module(like).broadcast_to(rows, like.shape).astype(like.dtype)


class SparseSum(_SparseOp):
    """``gradwire.sparse.sum(x, dims)``; the gradient is sparse at ``x``'s columns."""

    def forward(self, x: Any, dims: tuple[int, ...] = ()) -> Any:
        coo = K.coalesce(x._data)
        self.save("coo", coo)
        self.save("dims", dims)
        if not dims:
            return coo.values.sum()
        return K.sum_dims(coo, dims)

    def backward(self, g: Any) -> Any:
        coo, dims = self.saved("coo"), self.saved("dims")
        grad = dense_array(g)
        if not dims:
            return Tensor._wrap(coo.with_values(_spread(grad, coo.values)))
        sd = coo.sparse_dim
        kept = [d for d in range(sd) if d not in dims]
        rows = grad[tuple(coo.indices[kept])] if kept else grad[None]
        # dense dims that were summed come back as broadcast axes
        for d in sorted(d for d in dims if d >= sd):
            rows = rows.reshape(*rows.shape[: d - sd + 1], 1, *rows.shape[d - sd + 1 :])
        return Tensor._wrap(coo.with_values(_spread(rows, coo.values)))

    def name(self) -> str:
        return "SparseSumBackward0"


class SparseIndexSelect(_SparseOp):
    def forward(self, x: Any, dim: int = 0, index: Any = None) -> Any:
        self.save("shape", x._data.shape)
        self.save("dim", dim)
        self.save("index", index)
        return K.index_select(x._data, dim, index)

    def backward(self, g: Any) -> Any:
        dim, index = self.saved("dim"), self.saved("index")
        grad = dense_array(g)
        xp = array_module(grad)
        out = xp.zeros(self.saved("shape"), grad.dtype)
        ufunc_at("add", xp.moveaxis(out, dim, 0), index, xp.moveaxis(grad, dim, 0))
        return Tensor._wrap(out)

    def name(self) -> str:
        return "IndexSelectBackward0"
