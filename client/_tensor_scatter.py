"""Tensor methods that index along one dimension or fill in place from the generator:
``gather``, ``scatter`` / ``scatter_``, ``index_select``, ``view_as``, ``uniform_``, ``normal_``,
``random_``.

The index methods are built from indexing (``Index`` and ``IndexPut`` in ``_ops/movement.py``),
so they are differentiable through the ops that already are: ``gather``'s gradient accumulates
into the gathered places, ``scatter``'s reaches the untouched places of ``self`` and the used
entries of ``src``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._backend import array_module, on_self_device, to_device
from ._tensor import Tensor
from .autograd.grad_mode import is_grad_enabled, no_grad

__all__ = [
    "gather",
    "scatter",
    "scatter_",
    "index_select",
    "view_as",
    "uniform_",
    "normal_",
    "random_",
]


def _dim(t: Tensor, dim: int, name: str) -> int:
    nd = max(t._data.ndim, 1)
    if not -nd <= dim < nd:
        raise IndexError(
            f"{name}: dimension {dim} is out of range for a tensor of {t._data.ndim} dimensions "
            f"(expected a dimension in [{-nd}, {nd - 1}])"
        )
    return dim % nd


def _index_tuple(self: Tensor, dim: int, index: Tensor, name: str) -> tuple[Tensor, ...]:
    """Advanced-index arrays that pick ``self[..., index[i, j, ...], ...]`` at ``dim``."""
    if not isinstance(index, Tensor) or index._data.dtype.kind not in "iu":
        raise TypeError(f"{name}(): index must be an integer (int64) tensor")
    if index._data.ndim != self._data.ndim:
        raise RuntimeError(
            f"{name}(): index has {index._data.ndim} dimensions but self has "
            f"{self._data.ndim}; they must have the same number of dimensions"
        )
    d = _dim(self, dim, name)
    idx = index._data
    size = self._data.shape[d]
    if idx.size and (int(idx.min()) < -size or int(idx.max()) >= size):
        raise IndexError(
            f"{name}(): index {int(idx.max()) if int(idx.max()) >= size else int(idx.min())} "
            f"is out of bounds for dimension {d} with size {size}"
        )
    xp = array_module(idx)
    # open grids (NumPy's indices(sparse=True), which CuPy's indices lacks): one arange per
    # dimension, shaped to broadcast along the others
    ndim = idx.ndim
    grids = [
        xp.arange(n).reshape((1,) * i + (n,) + (1,) * (ndim - i - 1))
        for i, n in enumerate(idx.shape)
    ]
    grids[d] = idx
    return tuple(Tensor._wrap(xp.broadcast_to(g, idx.shape)) for g in grids)


def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
    """``out[i][j] = self[index[i][j]][j]`` for ``dim=0`` (and so on): values along ``dim``.

    Raises:
        IndexError: for an index out of range; TypeError for a non-integer index.
    """
    return self[_index_tuple(self, dim, index, "gather")]


def _scatter_values(self: Tensor, index: Tensor, src: Any, value: Any, name: str) -> Any:
    if (src is None) == (value is None):
        raise TypeError(f"{name}(): pass exactly one of src (a tensor) or value (a number)")
    if src is None:
        return value
    if not isinstance(src, Tensor):
        return src  # a Python number given positionally, as PyTorch allows
    if any(s < i for s, i in zip(src._data.shape, index._data.shape)):
        raise RuntimeError(
            f"{name}(): src of shape {tuple(src.shape)} is smaller than index of shape "
            f"{tuple(index.shape)}"
        )
    return src[tuple(slice(0, n) for n in index._data.shape)]


def scatter_(
    self: Tensor,
    dim: int,
    index: Tensor,
    src: Any = None,
    *,
    value: Any = None,
    reduce: str | None = None,
) -> Tensor:
    """Write ``src`` (or ``value``) into ``self`` at ``index`` along ``dim``, in place.

    Raises:
        NotImplementedError: for ``reduce`` (not supported: use ``scatter_add`` semantics
            through ``index_add`` style code, or ask for it).
    """
    if reduce is not None:
        raise NotImplementedError(f"scatter_(reduce={reduce!r}) is not supported")
    values = _scatter_values(self, index, src, value, "scatter_")
    self[_index_tuple(self, dim, index, "scatter_")] = values
    return self


def scatter(self: Tensor, dim: int, index: Tensor, src: Any = None, *, value: Any = None) -> Tensor:
    """The out-of-place form of :func:`scatter_`."""
    return scatter_(self.clone(), dim, index, src, value=value)


def index_select(self: Tensor, dim: int, index: Tensor) -> Tensor:
    """The entries of ``self`` at the positions ``index`` (1-D) along ``dim``."""
    if not isinstance(index, Tensor) or index._data.ndim > 1 or index._data.dtype.kind not in "iu":
        raise TypeError("index_select(): index must be a 0-D or 1-D integer tensor")
    d = _dim(self, dim, "index_select")
    return self[(slice(None),) * d + (index.reshape(-1),)]


def view_as(self: Tensor, other: Tensor) -> Tensor:
    """``self.view(other.shape)``."""
    return self.view(other.shape)


def _fill_from(self: Tensor, values: Any) -> Tensor:
    if self._requires_grad and self._grad_fn is None and is_grad_enabled():
        raise RuntimeError(
            "a leaf Variable that requires grad is being used in an in-place operation."
        )
    with no_grad():
        self._data[...] = to_device(np.asarray(values).astype(self._data.dtype), self.device)
        self._vc.value += 1
    return self


def _rng() -> Any:
    from . import _creation

    return _creation._rng  # read at call time: manual_seed replaces the generator


def uniform_(self: Tensor, from_: float = 0.0, to: float = 1.0, **kwargs: Any) -> Tensor:
    """Fill with samples from U(from, to) (``from`` is a keyword too, as in PyTorch)."""
    low = kwargs.pop("from", from_)
    if kwargs:
        raise TypeError(f"uniform_(): unexpected arguments {sorted(kwargs)}")
    return _fill_from(self, _rng().uniform(low, to, self._data.shape))


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with samples from N(mean, std^2)."""
    return _fill_from(self, _rng().normal(mean, std, self._data.shape))


def random_(self: Tensor, from_: int | None = None, to: int | None = None, **kwargs: Any) -> Tensor:
    """Fill with integers drawn uniformly from [from, to); ``random_(to)`` draws from [0, to)
    and ``random_()`` from [0, 2**mantissa] (floats) or [0, the dtype's maximum].

    Raises:
        ValueError: when the range is empty.
    """
    if "from" in kwargs:
        from_ = kwargs.pop("from")
    if kwargs:
        raise TypeError(f"random_(): unexpected arguments {sorted(kwargs)}")
    if to is None:
        dt = self._data.dtype
        top = 2 ** (np.finfo(dt).nmant + 1) + 1 if dt.kind == "f" else None
        if dt.kind in "iu":
            top = int(np.iinfo(dt).max)
        low, high = 0, (from_ if from_ is not None else (top if top is not None else 2))
    else:
        low, high = (from_ or 0), to
    if high <= low:
        raise ValueError(
            f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}"
        )
    return _fill_from(self, _rng().integers(low, high, self._data.shape))


for _name in __all__:
    setattr(Tensor, _name, on_self_device(globals()[_name]))
