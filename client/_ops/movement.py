"""Shape and layout ops. View ops share memory (and the version counter) with their input."""

from __future__ import annotations

from typing import Any

from .._backend import array_module, ufunc_at
from ._base import Op, reduce_grad

__all__ = [
    "Reshape",
    "Transpose",
    "Permute",
    "Expand",
    "Squeeze",
    "Unsqueeze",
    "Index",
    "IndexPut",
    "Cat",
    "Stack",
    "Contiguous",
    "normalize_index",
]


def _check_dim(d: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})"
        )
    return d % n


class Reshape(Op):
    is_view = True

    def forward(self, x: Any, shape: tuple[int, ...]) -> Any:
        self.save("self_sym_sizes", x._data.shape)
        try:
            return x._data.reshape(shape)
        except ValueError:
            raise RuntimeError(
                f"shape '{list(shape)}' is invalid for input of size {x._data.size}"
            ) from None

    def backward(self, g: Any) -> Any:
        return g.reshape(self.saved("self_sym_sizes"))

    def name(self) -> str:
        return "ViewBackward0"


class Transpose(Op):
    is_view = True

    def forward(self, x: Any, dim0: int, dim1: int) -> Any:
        nd = x._data.ndim
        if nd == 0:
            return x._data
        d0, d1 = _check_dim(dim0, nd), _check_dim(dim1, nd)
        self.save("dim0", d0)
        self.save("dim1", d1)
        return x._data.swapaxes(d0, d1)

    def backward(self, g: Any) -> Any:
        if g.ndim == 0:
            return g
        return g.transpose(self.saved("dim0"), self.saved("dim1"))


class Permute(Op):
    is_view = True

    def forward(self, x: Any, dims: tuple[int, ...]) -> Any:
        nd = x._data.ndim
        if len(dims) != nd:
            raise RuntimeError(
                f"permute(sparse_coo): number of dimensions in the tensor input does not match the length of the desired ordering of dimensions i.e. input.dim() = {nd} is not equal to len(dims) = {len(dims)}"
            )
        dims = tuple(_check_dim(d, nd) for d in dims)
        if len(set(dims)) != nd:
            raise RuntimeError(f"permute(): duplicate dims are not allowed, got {dims}")
        self.save("dims", dims)
        return x._data.transpose(dims)

    def backward(self, g: Any) -> Any:
        dims = self.saved("dims")
        inv = [0] * len(dims)
        for i, d in enumerate(dims):
            inv[d] = i
        return g.permute(*inv)


class Expand(Op):
    is_view = True

    def forward(self, x: Any, shape: tuple[int, ...]) -> Any:
        xs = x._data.shape
        lead = len(shape) - len(xs)
        if lead < 0:
            raise RuntimeError(
                f"expand: the number of sizes provided ({len(shape)}) must be greater or equal to the number of dimensions in the tensor ({len(xs)})"
            )
        target = tuple(xs[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(shape))
        self.save("self_sym_sizes", xs)
        try:
            return array_module(x._data).broadcast_to(x._data, target)
        except ValueError:
            raise RuntimeError(
                f"The expanded size of the tensor {list(target)} must match the existing size {list(xs)} at non-singleton dimensions"
            ) from None

    def backward(self, g: Any) -> Any:
        return reduce_grad(g, self.saved("self_sym_sizes"), g._data.dtype)


class Squeeze(Op):
    is_view = True

    def forward(self, x: Any, dim: Any = None) -> Any:
        self.save("self_sym_sizes", x._data.shape)
        shape = x._data.shape
        if dim is None:
            return x._data.reshape(tuple(s for s in shape if s != 1))
        dims = {_check_dim(d, len(shape)) for d in ((dim,) if isinstance(dim, int) else dim)}
        if not shape:
            return x._data
        return x._data.reshape(tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1)))

    def backward(self, g: Any) -> Any:
        return g.reshape(self.saved("self_sym_sizes"))


class Unsqueeze(Op):
    is_view = True

    def forward(self, x: Any, dim: int) -> Any:
        nd = x._data.ndim
        if not -(nd + 1) <= dim <= nd:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-(nd + 1)}, {nd}], but got {dim})"
            )
        d = dim % (nd + 1)
        self.save("dim", d)
        return array_module(x._data).expand_dims(x._data, d)

    def backward(self, g: Any) -> Any:
        return g.squeeze(self.saved("dim"))


def normalize_index(index: Any) -> tuple[Any, bool]:
    """Turn Tensors inside an index into arrays; report whether the index is basic (a view)."""
    from .._tensor import Tensor

    items = index if isinstance(index, tuple) else (index,)
    out = []
    basic = True
    for it in items:
        if isinstance(it, Tensor):
            it = it._data
            basic = False
        elif isinstance(it, (list,)):
            basic = False
        elif not (it is None or it is Ellipsis or isinstance(it, (int, slice))) or isinstance(
            it, bool
        ):
            basic = False
        out.append(it)
    return (tuple(out) if isinstance(index, tuple) else out[0]), basic


class Index(Op):
    """x[index]: basic indexing gives a view; integer-array and mask indexing copy."""

    is_view = True

    def forward(self, x: Any, index: Any = None) -> Any:
        idx, basic = normalize_index(index)
        self.save("self_sym_sizes", x._data.shape)
        self.save("self_dtype", x._data.dtype)
        self.save("indices", idx)
        self._basic = basic
        try:
            return x._data[idx]
        except IndexError as exc:
            raise IndexError(f"{exc} (indexing a tensor of shape {tuple(x._data.shape)})") from None

    def backward(self, g: Any) -> Any:
        return IndexAddInto.apply(
            g,
            shape=self.saved("self_sym_sizes"),
            dtype=self.saved("self_dtype"),
            index=self.saved("indices"),
            basic=self._basic,
        )

    def name(self) -> str:
        return "SliceBackward0" if getattr(self, "_basic", True) else "IndexBackward0"


class IndexAddInto(Op):
    """zeros(shape)[index] += g; the backward of Index (and differentiable itself)."""

    def forward(
        self, g: Any, shape: Any = None, dtype: Any = None, index: Any = None, basic: bool = True
    ) -> Any:
        xp = array_module(g._data)
        out = xp.zeros(shape, dtype=g._data.dtype if g._data.dtype.kind == "c" else dtype)
        if basic:
            out[index] = g._data
        else:
            ufunc_at("add", out, index, g._data)
        self.save("indices", index)
        return out

    def backward(self, gg: Any) -> Any:
        return gg[self.saved("indices")]


class IndexPut(Op):
    """out = x.clone(); out[index] = value (the out-of-place core of __setitem__)."""

    def forward(self, x: Any, value: Any, index: Any = None) -> Any:
        idx, _ = normalize_index(index)
        out = x._data.copy()
        out[idx] = value._data
        self.save("indices", idx)
        self.save("value_meta", (value._data.shape, value._data.dtype))
        return out

    def backward(self, g: Any) -> Any:
        idx = self.saved("indices")
        gx = gv = None
        if self.needs_input_grad[0]:
            from .._tensor import Tensor

            keep = array_module(g._data).ones(g._data.shape, dtype=bool)
            keep[idx] = False
            gx = g * Tensor._wrap(keep)
        if self.needs_input_grad[1]:
            shape, dt = self.saved("value_meta")
            gv = reduce_grad(g[idx], shape, dt)
        return gx, gv


class Cat(Op):
    def forward(self, *tensors: Any, dim: int = 0) -> Any:
        if not tensors:
            raise RuntimeError("cat(): expected a non-empty list of Tensors")
        nd = tensors[0]._data.ndim
        d = _check_dim(dim, nd)
        self.save("dim", d)
        self.save("sizes", [t._data.shape[d] for t in tensors])
        try:
            return array_module(tensors[0]._data).concatenate([t._data for t in tensors], axis=d)
        except ValueError as exc:
            raise RuntimeError(f"cat(): {exc}") from None

    def backward(self, g: Any) -> Any:
        d, sizes = self.saved("dim"), self.saved("sizes")
        out, start = [], 0
        for s in sizes:
            out.append(g.narrow(d, start, s))
            start += s
        return tuple(out)


class Stack(Op):
    def forward(self, *tensors: Any, dim: int = 0) -> Any:
        if not tensors:
            raise RuntimeError("stack expects a non-empty TensorList")
        nd = tensors[0]._data.ndim + 1
        if not -nd <= dim < nd:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], but got {dim})"
            )
        d = dim % nd
        self.save("dim", d)
        self.save("n", len(tensors))
        shapes = {t._data.shape for t in tensors}
        if len(shapes) != 1:
            raise RuntimeError(
                f"stack expects each tensor to be equal size, but got {sorted(shapes)}"
            )
        return array_module(tensors[0]._data).stack([t._data for t in tensors], axis=d)

    def backward(self, g: Any) -> Any:
        d = self.saved("dim")
        return tuple(g.select(d, i) for i in range(self.saved("n")))


class Contiguous(Op):
    def forward(self, x: Any) -> Any:
        return array_module(x._data).ascontiguousarray(x._data)

    def backward(self, g: Any) -> Any:
        return g
