"""Array kernels on :class:`~gradwire._sparse_coo.SparseCOO` (NumPy or CuPy alike): build and
check, coalesce, densify, add, mask, select and sum. No autograd here (``_ops/sparse.py``)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._backend import array_module, device_of, device_scope, ufunc_at
from ._sparse_coo import SparseCOO

__all__ = [
    "build",
    "check_indices",
    "coalesce",
    "to_dense",
    "from_dense",
    "add",
    "add_into_dense",
    "mask",
    "index_select",
    "sum_dims",
    "empty_like",
]


def _xp(coo: SparseCOO) -> Any:
    return array_module(coo.values)


def check_indices(indices: Any, shape: Sequence[int]) -> None:
    """Raise ValueError unless every index column lies inside ``shape``'s sparse dims."""
    if indices.shape[1] == 0:
        return
    xp = array_module(indices)
    low = xp.min(indices, axis=1)
    high = xp.max(indices, axis=1)
    for d in range(indices.shape[0]):
        lo, hi = int(low[d]), int(high[d])
        if lo < 0 or hi >= shape[d]:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"sparse tensor indices out of range: for dim {d}, size is {shape[d]} but "
                f"found index {bad} (indices must lie in [0, size))"
            )


def build(
    indices: Any, values: Any, shape: Sequence[int] | None, coalesced: bool = False
) -> SparseCOO:
    """A checked SparseCOO from index and value arrays (one device), inferring the size from
    the indices when ``shape`` is None (PyTorch's rule: one past the largest index)."""
    xp = array_module(values)
    if indices.ndim != 2:
        raise ValueError(
            f"sparse_coo_tensor: indices must be 2-D (sparse_dim, nnz), got shape "
            f"{tuple(indices.shape)}"
        )
    if indices.dtype.kind not in "iub":
        if indices.dtype.kind != "f" or not bool(xp.all(indices == xp.floor(indices))):
            raise TypeError(
                f"sparse_coo_tensor: indices must be integers, got dtype {indices.dtype}"
            )
    indices = indices.astype(np.int64, copy=False)
    if values.ndim == 0:
        values = values.reshape(1)
    nnz = indices.shape[1]
    if values.shape[0] != nnz:
        raise ValueError(
            f"sparse_coo_tensor: indices have {nnz} columns (nnz) but values have "
            f"{values.shape[0]} rows; they must match"
        )
    sparse_dim = indices.shape[0]
    if shape is None:
        high = xp.max(indices, axis=1) + 1 if nnz else xp.zeros(sparse_dim, np.int64)
        shape = tuple(int(h) for h in high) + tuple(values.shape[1:])
    shape = tuple(int(s) for s in shape)
    if len(shape) != sparse_dim + values.ndim - 1:
        raise ValueError(
            f"sparse_coo_tensor: size {list(shape)} has {len(shape)} dims but indices give "
            f"{sparse_dim} sparse dims and values {values.ndim - 1} dense dims"
        )
    if tuple(values.shape[1:]) != shape[sparse_dim:]:
        raise ValueError(
            f"sparse_coo_tensor: values have dense shape {list(values.shape[1:])} but size "
            f"{list(shape)} needs {list(shape[sparse_dim:])}"
        )
    check_indices(indices, shape)
    out = SparseCOO(indices, values, shape, coalesced)
    if coalesced and nnz > 1 and not bool(xp.all(xp.diff(_linear(out)) > 0)):
        raise ValueError(
            "sparse_coo_tensor: is_coalesced=True but the index columns are not sorted and "
            "unique; leave is_coalesced unset and call .coalesce()"
        )
    return out


def empty_like(coo: SparseCOO) -> SparseCOO:
    """No stored elements, the shape and dtype of ``coo``."""
    xp = _xp(coo)
    with device_scope(device_of(coo.values)):
        idx = xp.zeros((coo.sparse_dim, 0), np.int64)
        vals = xp.zeros((0, *coo.shape[coo.sparse_dim :]), coo.values.dtype)
    return SparseCOO(idx, vals, coo.shape, True)


def _where(coo: SparseCOO) -> Any:
    """The index for ``arr[...]`` of ``coo``'s columns: the row numbers themselves for one
    sparse dim (which ``ufunc_at`` scatters whole rows for), else one array per dim."""
    return coo.indices[0] if coo.sparse_dim == 1 else tuple(coo.indices)


def _linear(coo: SparseCOO) -> Any:
    xp = _xp(coo)
    sparse_shape = coo.shape[: coo.sparse_dim]
    if not sparse_shape:
        return xp.zeros(coo.nnz, np.int64)
    return xp.ravel_multi_index(tuple(coo.indices), sparse_shape)


def coalesce(coo: SparseCOO) -> SparseCOO:
    """Sorted unique index columns, duplicates summed (``coo`` itself when already so)."""
    if coo.coalesced:
        return coo
    xp = _xp(coo)
    with device_scope(device_of(coo.values)):
        lin = _linear(coo)
        uniq, inverse = xp.unique(lin, return_inverse=True)
        inverse = inverse.reshape(-1)
        values = xp.zeros((len(uniq), *coo.values.shape[1:]), coo.values.dtype)
        ufunc_at("add", values, inverse, coo.values)
        sparse_shape = coo.shape[: coo.sparse_dim]
        if sparse_shape:
            indices = xp.stack(xp.unravel_index(uniq, sparse_shape)).astype(np.int64)
        else:
            indices = xp.zeros((0, len(uniq)), np.int64)
    return SparseCOO(indices, values, coo.shape, True)


def to_dense(coo: SparseCOO) -> Any:
    xp = _xp(coo)
    with device_scope(device_of(coo.values)):
        out = xp.zeros(coo.shape, coo.values.dtype)
        if coo.nnz:
            where = _where(coo)
            if coo.coalesced:
                out[where] = coo.values
            else:
                ufunc_at("add", out, where, coo.values)
    return out


def from_dense(arr: Any, sparse_dim: int | None = None) -> SparseCOO:
    """The nonzero entries of ``arr`` (with ``sparse_dim`` < ndim: its nonzero slices)."""
    xp = array_module(arr)
    nd = arr.ndim
    sd = nd if sparse_dim is None else int(sparse_dim)
    if not 0 <= sd <= nd:
        raise ValueError(f"to_sparse: sparse_dim must lie in [0, {nd}], got {sparse_dim}")
    with device_scope(device_of(arr)):
        if sd == 0:
            return SparseCOO(xp.zeros((0, 1), np.int64), arr[None].copy(), arr.shape, True)
        flat = arr.reshape(*arr.shape[:sd], -1) if sd < nd else arr
        keep = xp.any(flat != 0, axis=-1) if sd < nd else flat != 0
        indices = xp.stack(xp.nonzero(keep)).astype(np.int64).reshape(sd, -1)
        values = arr[tuple(indices)]
    return SparseCOO(indices, values, arr.shape, True)


def add(a: SparseCOO, b: SparseCOO, alpha: Any = 1) -> SparseCOO:
    """``a + alpha * b``: the columns of both (merged when both were coalesced)."""
    xp = _xp(a)
    vb = b.values if alpha == 1 else b.values * alpha
    with device_scope(device_of(a.values)):
        out = SparseCOO(
            xp.concatenate([a.indices, b.indices], axis=1),
            xp.concatenate([a.values, vb.astype(a.values.dtype, copy=False)], axis=0),
            a.shape,
            False,
        )
    if a.coalesced and b.coalesced:
        return coalesce(out)
    return out


def add_into_dense(dense: Any, coo: SparseCOO, alpha: Any = 1) -> None:
    """``dense += alpha * coo`` in place."""
    if not coo.nnz:
        return
    values = coo.values if alpha == 1 else coo.values * alpha
    with device_scope(device_of(dense)):
        ufunc_at("add", dense, _where(coo), values.astype(dense.dtype, copy=False))


def mask(dense: Any, coo: SparseCOO) -> SparseCOO:
    """``dense`` at the columns of ``coo`` (coalesced first): PyTorch's ``sparse_mask``."""
    c = coalesce(coo)
    with device_scope(device_of(dense)):
        return SparseCOO(c.indices, dense[tuple(c.indices)], c.shape, True)


def index_select(coo: SparseCOO, dim: int, index: Any) -> SparseCOO:
    """The slices ``index`` along ``dim`` (a sparse or a dense dim), in ``index``'s order."""
    xp = _xp(coo)
    shape = list(coo.shape)
    shape[dim] = int(index.shape[0])
    with device_scope(device_of(coo.values)):
        if dim >= coo.sparse_dim:
            values = xp.take(coo.values, index, axis=dim - coo.sparse_dim + 1)
            return SparseCOO(coo.indices, values, tuple(shape), coo.coalesced)
        row = coo.indices[dim]
        order = xp.argsort(row, kind="stable")
        ordered = row[order]
        lo = xp.searchsorted(ordered, index, side="left")
        counts = xp.searchsorted(ordered, index, side="right") - lo
        total = int(counts.sum())
        starts = xp.cumsum(counts) - counts
        within = xp.arange(total) - xp.repeat(starts, counts)
        picked = order[xp.repeat(lo, counts) + within]
        indices = coo.indices[:, picked].copy()
        indices[dim] = xp.repeat(xp.arange(len(index)), counts)
        values = coo.values[picked]
    return SparseCOO(indices, values, tuple(shape), False)


def sum_dims(coo: SparseCOO, dims: Sequence[int]) -> Any:
    """Sum over ``dims`` (normalized, unique): dense when every sparse dim is summed (an
    ndarray), else a coalesced SparseCOO over the sparse dims kept."""
    xp = _xp(coo)
    sd = coo.sparse_dim
    sparse_dims = sorted(d for d in dims if d < sd)
    dense_axes = tuple(d - sd + 1 for d in dims if d >= sd)
    values = coo.values.sum(axis=dense_axes) if dense_axes else coo.values
    kept = [d for d in range(sd) if d not in sparse_dims]
    dense_shape = tuple(s for d, s in enumerate(coo.shape) if d >= sd and d not in dims)
    with device_scope(device_of(coo.values)):
        if not kept:
            return values.sum(axis=0) if coo.nnz else xp.zeros(dense_shape, coo.values.dtype)
        shape = tuple(coo.shape[d] for d in kept) + dense_shape
        part = SparseCOO(coo.indices[kept], values, shape, False)
    return coalesce(part)
