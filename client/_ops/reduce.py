"""Reductions over all elements or over ``dim`` (an int or a tuple), with ``keepdim``."""

from __future__ import annotations

from typing import Any

from .._backend import array_module
from ._base import Op

__all__ = ["Sum", "Mean", "MaxAll", "MaxDim", "Prod", "Var", "ArgReduce", "normalize_dims"]


def normalize_dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """A sorted tuple of non-negative axes, or None for "all"; clear error when out of range."""
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    out = []
    for d in dims:
        if not isinstance(d, int):
            raise TypeError(f"dim must be an int or a tuple of ints, got {d!r}")
        lo = -max(ndim, 1)
        if not lo <= d < max(ndim, 1):
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{lo}, {max(ndim, 1) - 1}], but got {d})"
            )
        out.append(d % max(ndim, 1))
    return tuple(sorted(set(out))) if ndim else ()


def _expand_back(
    g: Any, shape: tuple[int, ...], dims: tuple[int, ...] | None, keepdim: bool
) -> Any:
    """Broadcast a reduced gradient back to the input shape."""
    if dims is None:
        return g.reshape((1,) * len(shape)).expand(shape) if shape else g.reshape(())
    if not keepdim:
        for d in dims:
            g = g.unsqueeze(d)
    return g.expand(shape)


class Sum(Op):
    def forward(self, x: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
        dims = normalize_dims(dim, x._data.ndim)
        self.save("self_sym_sizes", x._data.shape)
        self.save("dim", dims)
        self.save("keepdim", keepdim)
        out = x._data.sum(axis=dims, keepdims=keepdim, dtype=dtype)
        if dtype is None and x._data.dtype.kind == "b":
            out = out.astype("int64")
        return array_module(x._data).asarray(out)

    def backward(self, g: Any) -> Any:
        return _expand_back(
            g, self.saved("self_sym_sizes"), self.saved("dim"), self.saved("keepdim")
        )


class Mean(Op):
    def forward(self, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
        if x._data.dtype.kind not in "fc":
            raise RuntimeError(
                f"mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: {x.dtype}"
            )
        dims = normalize_dims(dim, x._data.ndim)
        self.save("self_sym_sizes", x._data.shape)
        self.save("dim", dims)
        self.save("keepdim", keepdim)
        n = x._data.size if dims is None else _count(x._data.shape, dims)
        self.save("count", n)
        return array_module(x._data).asarray(x._data.mean(axis=dims, keepdims=keepdim))

    def backward(self, g: Any) -> Any:
        # Divided before it is expanded (the same values): one full-size array less.
        return _expand_back(
            g / self.saved("count"),
            self.saved("self_sym_sizes"),
            self.saved("dim"),
            self.saved("keepdim"),
        )


def _count(shape: tuple[int, ...], dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= shape[d] if shape else 1
    return n


class MaxAll(Op):
    """max() / min() over all elements: ties share the gradient evenly."""

    def forward(self, x: Any, largest: bool = True) -> Any:
        if x._data.size == 0:
            raise RuntimeError(
                "max(): Expected reduction dim to be specified for input.numel() == 0."
            )
        self.save("self", x)
        self._largest = largest
        return array_module(x._data).asarray(x._data.max() if largest else x._data.min())

    def backward(self, g: Any) -> Any:
        x = self.saved("self")
        mask = x == (x.detach().max() if self._largest else x.detach().min())
        return g * mask / mask.sum()

    def name(self) -> str:
        return "MaxBackward1" if getattr(self, "_largest", True) else "MinBackward1"


class MaxDim(Op):
    """max(dim) / min(dim): (values, indices); the gradient goes to the chosen index."""

    def forward(self, x: Any, dim: int, keepdim: bool = False, largest: bool = True) -> Any:
        xp = array_module(x._data)
        (d,) = normalize_dims(dim, x._data.ndim) or (0,)
        idx = (xp.argmax if largest else xp.argmin)(x._data, axis=d, keepdims=True)
        vals = xp.take_along_axis(x._data, idx, axis=d)
        self.save("self_sym_sizes", x._data.shape)
        self.save("dim", d)
        self.save("keepdim", keepdim)
        self.save("indices", idx)
        self._largest = largest
        if not keepdim:
            vals, idx = vals.squeeze(d), idx.squeeze(d)
        return vals, idx

    def backward(self, g: Any, _gi: Any = None) -> Any:
        from .._tensor import Tensor

        shape, d, keepdim = self.saved("self_sym_sizes"), self.saved("dim"), self.saved("keepdim")
        idx = self.saved("indices")
        if not keepdim:
            g = g.unsqueeze(d)
        xp = array_module(idx)
        ar = xp.arange(shape[d]).reshape([-1 if i == d else 1 for i in range(len(shape))])
        onehot = Tensor._wrap(ar == idx)
        return g * onehot

    def name(self) -> str:
        return "MaxBackward0" if getattr(self, "_largest", True) else "MinBackward0"


class Prod(Op):
    save_output = "result"

    def forward(self, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
        dims = normalize_dims(dim, x._data.ndim)
        if dims is not None and len(dims) != 1:
            raise TypeError("prod() takes a single int dim")
        self.save("self", x)
        self.save("dim", dims)
        self.save("keepdim", keepdim)
        return array_module(x._data).asarray(x._data.prod(axis=dims, keepdims=keepdim))

    def backward(self, g: Any) -> Any:
        from .._tensor import Tensor

        x, dims, keepdim = self.saved("self"), self.saved("dim"), self.saved("keepdim")
        xp = array_module(x._data)
        data = x._data
        if not (data == 0).any():
            # No zeros: the product of the others is result / x, written with ops so that
            # create_graph gives second derivatives.
            result = _expand_back(self.saved("result"), data.shape, dims, keepdim)
            return _expand_back(g, data.shape, dims, keepdim) * (result / x).conj()
        axis = dims[0] if dims else None
        flat = data.reshape(-1) if axis is None else data
        ax = 0 if axis is None else axis
        # With zeros, the product of all the other elements comes from exclusive cumulative
        # products from both sides, on arrays: first-order gradients only in this case.
        ones_shape = list(flat.shape)
        ones_shape[ax] = 1
        one = xp.ones(ones_shape, dtype=flat.dtype)
        left = xp.cumprod(xp.concatenate([one, flat], axis=ax), axis=ax).take(
            range(flat.shape[ax]), axis=ax
        )
        rev = xp.flip(flat, axis=ax)
        right = xp.flip(
            xp.cumprod(xp.concatenate([one, rev], axis=ax), axis=ax).take(
                range(flat.shape[ax]), axis=ax
            ),
            axis=ax,
        )
        others = Tensor._wrap((left * right).reshape(data.shape))
        return _expand_back(g, data.shape, dims, keepdim) * others.conj()


class Var(Op):
    def forward(self, x: Any, dim: Any = None, correction: float = 1, keepdim: bool = False) -> Any:
        dims = normalize_dims(dim, x._data.ndim)
        self.save("self", x)
        self.save("dim", dims)
        self.save("correction", correction)
        self.save("keepdim", keepdim)
        return array_module(x._data).asarray(
            x._data.var(axis=dims, ddof=correction, keepdims=keepdim)
        )

    def backward(self, g: Any) -> Any:
        x, dims, corr, keepdim = (
            self.saved("self"),
            self.saved("dim"),
            self.saved("correction"),
            self.saved("keepdim"),
        )
        n = x._data.size if dims is None else _count(x._data.shape, dims)
        centered = x - x.mean(dim=dims, keepdim=True)
        scale = 2.0 / (n - corr) if n > corr else float("nan")
        return _expand_back(g, x._data.shape, dims, keepdim) * centered * scale


class ArgReduce(Op):
    differentiable = False

    def forward(self, x: Any, dim: Any = None, keepdim: bool = False, largest: bool = True) -> Any:
        xp = array_module(x._data)
        fn = xp.argmax if largest else xp.argmin
        if dim is None:
            out = fn(x._data)
            return xp.asarray(out).reshape((1,) * x._data.ndim) if keepdim else xp.asarray(out)
        (d,) = normalize_dims(dim, x._data.ndim) or (0,)
        return fn(x._data, axis=d, keepdims=keepdim)
