"""Attaches the op surface to ``Tensor``: operators, math methods and in-place variants.

Kept apart from ``_tensor.py`` so that the class itself stays about data and autograd metadata.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import numpy as np

from ._backend import array_module, on_self_device
from ._ops import binary as B
from ._ops import movement as M
from ._ops import reduce as R
from ._ops import scalar as S
from ._ops import unary as U
from ._ops._base import as_tensor_like
from ._ops.scalar import scalar_ok
from ._ops.views import inplace_on_view
from ._sampling import multinomial
from ._sparse_coo import SparseCOO
from ._sparse_inplace import inplace_sparse
from ._tensor import Tensor
from .autograd.grad_mode import _state, no_grad

__all__: list[str] = []


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def _in_ops(fn: _Fn) -> _Fn:
    """Mark a method whose array work all happens inside ``Op.apply``, which makes the
    tensors' CUDA device current itself: it is installed as it is. Every other method is
    installed under :func:`on_self_device` (its work outside an op needs the tensor's device
    current); tests/gpu/test_current_device.py calls them with another device current."""
    fn._in_ops = True  # type: ignore[attr-defined]
    return fn


def _t(value: Any, like: Tensor) -> Tensor:
    return as_tensor_like(value, like)


def _shape_arg(shape: Any) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(s) for s in shape)


# ------------------------------------------------------------------ in place
def _check_inplace(t: Tensor) -> None:
    if t._inference and not _state.inference:
        raise RuntimeError(
            "Inplace update to inference tensor outside InferenceMode is not allowed."
        )


def _inplace(
    self: Tensor, compute: Callable[[Tensor], Tensor], others: tuple[Any, ...] = ()
) -> Tensor:
    """Apply an out-of-place op and write its result into ``self``, rewriting the graph.

    With autograd recording, the op sees a snapshot of ``self``'s old value (so its backward
    does not read the overwritten data) and ``self`` takes the op's node as its grad_fn. The
    version counter is bumped, so anything that saved ``self`` earlier detects the change.
    """
    _check_inplace(self)
    recording = _state.grad_enabled and (
        self.requires_grad or any(isinstance(o, Tensor) and o.requires_grad for o in others)
    )
    if recording:
        if self._grad_fn is None and self._requires_grad:
            raise RuntimeError(
                "a leaf Variable that requires grad is being used in an in-place operation."
            )
        base = self._base
        if base is not None and (
            base.requires_grad or any(isinstance(o, Tensor) and o.requires_grad for o in others)
        ):
            # Through a view: the base takes a CopySlices node; the view (and its siblings)
            # rebuild their history from the base on next use, as the version moved.
            inplace_on_view(self, compute)
            self._vc.value += 1
            return self
        snap = Tensor._wrap(self._data.copy(), self._requires_grad)
        snap._grad_fn, snap._output_nr = self._grad_fn, self._output_nr
        out = compute(snap)
        _write(self, out._data)
        self._grad_fn, self._output_nr = out._grad_fn, out._output_nr
    else:
        with no_grad():
            out = compute(self)
        _write(self, out._data)
    self._vc.value += 1
    return self


def _write(self: Tensor, arr: Any) -> None:
    dst = self._data
    if arr.dtype != dst.dtype and not np.can_cast(arr.dtype, dst.dtype, casting="same_kind"):
        raise RuntimeError(
            f"result type {arr.dtype} can't be cast to the desired output type {dst.dtype}"
        )
    if arr.shape != dst.shape:
        try:
            arr = array_module(arr).broadcast_to(arr, dst.shape)
        except ValueError:
            raise RuntimeError(
                f"output with shape {list(dst.shape)} doesn't match the broadcast shape {list(arr.shape)}"
            ) from None
    dst[...] = arr


def _fast_inplace(self: Tensor, ufunc: Any, other: Any, others: tuple[Any, ...]) -> bool:
    """In-place arithmetic straight into the buffer when nothing is recorded."""
    if _state.grad_enabled and (
        self.requires_grad or any(isinstance(o, Tensor) and o.requires_grad for o in others)
    ):
        return False
    _check_inplace(self)
    o = other._data if isinstance(other, Tensor) else other
    try:
        ufunc(self._data, o, out=self._data, casting="same_kind")
    except TypeError as exc:  # numpy's casting errors subclass TypeError
        if type(self._data) is SparseCOO or type(o) is SparseCOO:
            return False  # the caller's slow path: inplace_sparse
        raise RuntimeError(
            f"result type can't be cast to the desired output type {self._data.dtype}: {exc}"
        ) from None
    except ValueError:
        raise RuntimeError(
            f"output with shape {list(self._data.shape)} doesn't match the broadcast shape"
        ) from None
    self._vc.value += 1
    return True


def add_(self: Tensor, other: Any, alpha: Any = 1) -> Tensor:
    if alpha == 1 and _fast_inplace(self, np.add, other, (other,)):
        return self
    done = inplace_sparse(self, other, alpha, "add")
    return (
        done if done is not None else _inplace(self, lambda s: s.add(other, alpha=alpha), (other,))
    )


def sub_(self: Tensor, other: Any, alpha: Any = 1) -> Tensor:
    if alpha == 1 and _fast_inplace(self, np.subtract, other, (other,)):
        return self
    done = inplace_sparse(self, other, alpha, "sub")
    return (
        done if done is not None else _inplace(self, lambda s: s.sub(other, alpha=alpha), (other,))
    )


def mul_(self: Tensor, other: Any) -> Tensor:
    if _fast_inplace(self, np.multiply, other, (other,)):
        return self
    done = inplace_sparse(self, other, 1, "mul")
    return done if done is not None else _inplace(self, lambda s: s * other, (other,))


def div_(self: Tensor, other: Any) -> Tensor:
    if self._data.dtype.kind in "fc" and _fast_inplace(self, np.divide, other, (other,)):
        return self
    done = inplace_sparse(self, other, 1, "div")
    return done if done is not None else _inplace(self, lambda s: s / other, (other,))


def zero_(self: Tensor) -> Tensor:
    return fill_(self, 0)


def fill_(self: Tensor, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise RuntimeError(
                f"fill_ only supports 0-dimension value tensor but got tensor with {value.ndim} dimensions."
            )
        if value.requires_grad:
            return _inplace(self, lambda s: B.CopyFrom.apply(s, value.reshape(())), (value,))
    _check_inplace(self)
    if _state.grad_enabled and self._grad_fn is None and self._requires_grad:
        raise RuntimeError(
            "a leaf Variable that requires grad is being used in an in-place operation."
        )
    if _state.grad_enabled and self.requires_grad:
        number = value.item() if isinstance(value, Tensor) else value
        return _inplace(self, lambda s: B.Fill.apply(s, value=number))
    self._data[...] = value._data if isinstance(value, Tensor) else value
    self._vc.value += 1
    return self


def copy_(self: Tensor, src: Tensor, non_blocking: bool = False) -> Tensor:
    if not isinstance(src, Tensor):
        raise TypeError(f"copy_(): argument 'src' must be Tensor, not {type(src).__name__}")
    src_here = src.to(self.device)
    if _state.grad_enabled and (self.requires_grad or src.requires_grad):
        return _inplace(self, lambda s: B.CopyFrom.apply(s, src_here), (src,))
    _check_inplace(self)
    self._data[...] = src_here._data
    self._vc.value += 1
    return self


def clamp_(self: Tensor, min: Any = None, max: Any = None) -> Tensor:
    return _inplace(self, lambda s: s.clamp(min, max))


def setitem(self: Tensor, index: Any, value: Any) -> None:
    v = _t(value, self)
    _inplace(self, lambda s: M.IndexPut.apply(s, v.to(self.device), index=index), (v,))


# ------------------------------------------------------------------ arithmetic
@_in_ops
def add(self: Tensor, other: Any, *, alpha: Any = 1) -> Tensor:
    if alpha == 1 and scalar_ok(self, other):
        return S.AddScalar.apply(self, other=other)
    return B.Add.apply(self, _t(other, self), alpha=alpha)


@_in_ops
def sub(self: Tensor, other: Any, *, alpha: Any = 1) -> Tensor:
    if alpha == 1 and scalar_ok(self, other):
        return S.AddScalar.apply(self, other=-other)
    return B.Sub.apply(self, _t(other, self), alpha=alpha)


@_in_ops
def mul(self: Tensor, other: Any) -> Tensor:
    if scalar_ok(self, other):
        return S.MulScalar.apply(self, other=other)
    return B.Mul.apply(self, _t(other, self))


@_in_ops
def div(self: Tensor, other: Any) -> Tensor:
    if scalar_ok(self, other) and other != 0:
        return S.DivScalar.apply(self, other=other)
    o = _t(other, self)
    a = self
    if self._data.dtype.kind in "biu" and o._data.dtype.kind in "biu":
        a = self.to(dtype=np.float32)
    return B.Div.apply(a, o)


@_in_ops
def pow(self: Tensor, exponent: Any) -> Tensor:
    if isinstance(exponent, Tensor):
        return B.Pow.apply(self, exponent)
    if isinstance(exponent, (float, complex)) and self._data.dtype.kind in "biu":
        return U.PowScalar.apply(_as_floating(self), exponent)
    return U.PowScalar.apply(self, exponent)


@_in_ops
def rpow(self: Tensor, base: Any) -> Tensor:
    return B.Pow.apply(_t(base, self), self)


@_in_ops
def matmul(self: Tensor, other: Tensor) -> Tensor:
    if not isinstance(other, Tensor):
        raise TypeError(f"matmul(): argument 'other' must be Tensor, not {type(other).__name__}")
    return B.MatMul.apply(self, other)


@_in_ops
def bmm(self: Tensor, mat2: Tensor) -> Tensor:
    """Batched matrix product of two 3-D tensors (b, n, m) @ (b, m, p)."""
    if not isinstance(mat2, Tensor):
        raise TypeError(f"bmm(): argument 'mat2' must be Tensor, not {type(mat2).__name__}")
    if self.ndim != 3 or mat2.ndim != 3:
        raise RuntimeError(
            f"batch1 and batch2 must be 3D tensors, got {self.ndim}D and {mat2.ndim}D"
        )
    if self.shape[0] != mat2.shape[0]:
        raise RuntimeError(
            f"batch1 and batch2 must have same number of batches, got {self.shape[0]} and "
            f"{mat2.shape[0]}"
        )
    return B.MatMul.apply(self, mat2)


def nonzero(self: Tensor, *, as_tuple: bool = False) -> Any:
    """Indices of the non-zero elements: an int64 (n, ndim) tensor, or one index tensor per
    dimension with ``as_tuple=True``; never part of the graph."""
    xp = array_module(self._data)
    idx = xp.argwhere(self._data).astype(np.int64)
    if as_tuple:
        return tuple(Tensor._wrap(idx[:, i].copy()) for i in range(max(self.ndim, 1)))
    return Tensor._wrap(idx)


def _cmp(op: str) -> Callable[[Tensor, Any], Tensor]:
    @_in_ops
    def fn(self: Tensor, other: Any) -> Tensor:
        return B.Compare.apply(self, _t(other, self), op=op)

    fn.__name__ = op
    return fn


def _logical(ufunc_name: str) -> Callable[[Tensor, Any], Tensor]:
    def fn(self: Tensor, other: Any) -> Tensor:
        o = other._data if isinstance(other, Tensor) else other
        return Tensor._wrap(getattr(array_module(self._data), ufunc_name)(self._data, o))

    return fn


@_in_ops
def maximum(self: Tensor, other: Tensor) -> Tensor:
    return B.Maximum.apply(self, _t(other, self))


@_in_ops
def remainder(self: Tensor, other: Any) -> Tensor:
    """``self % other`` with the sign of ``other`` (Python's and PyTorch's rule)."""
    return B.Remainder.apply(self, _t(other, self))


@_in_ops
def floor_divide(self: Tensor, other: Any) -> Tensor:
    """``self // other``: the floor of the quotient."""
    return B.FloorDivide.apply(self, _t(other, self))


@_in_ops
def minimum(self: Tensor, other: Tensor) -> Tensor:
    return B.Minimum.apply(self, _t(other, self))


def where(cond: Tensor, a: Any, b: Any) -> Tensor:
    """``cond.where(a, b)``: elements of ``a`` where cond is true, else of ``b``."""
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    if like is None:
        like = Tensor(a)  # Python numbers: PyTorch's inference (floats -> default dtype)
    return B.Where.apply(
        _t(a, like),
        _t(b, like),
        cond=cond if isinstance(cond, Tensor) else Tensor._wrap(np.asarray(cond)),
    )


def masked_fill(self: Tensor, mask: Tensor, value: Any) -> Tensor:
    return where(mask, _t(value, self), self)


# ------------------------------------------------------------------ unary math
def sgn(self: Tensor) -> Tensor:
    """x/|x| (0 at 0) for complex (differentiable); sign(x) for real (gradient 0)."""
    d = self._data
    if d.dtype.kind == "c" and self.requires_grad and _state.grad_enabled:
        # Built from ops so that abs's backward (g * sgn(z)) has a second derivative.
        a = self.abs()
        return self / a.masked_fill(a == 0, 1)
    xp = array_module(d)
    if d.dtype.kind == "c":
        a = xp.abs(d)
        out = xp.where(a == 0, 0, d / xp.where(a == 0, 1, a)).astype(d.dtype)
    else:
        out = xp.sign(d)
    return Tensor._wrap(out)


def clamp(self: Tensor, min: Any = None, max: Any = None) -> Tensor:
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        out = self
        if min is not None:
            out = maximum(out, min)
        if max is not None:
            out = minimum(out, max)
        return out
    return U.Clamp.apply(self, min=min, max=max)


def softmax(self: Tensor, dim: int) -> Tensor:
    return U.Softmax.apply(self, dim=dim)


def log_softmax(self: Tensor, dim: int) -> Tensor:
    return U.LogSoftmax.apply(self, dim=dim)


def square(self: Tensor) -> Tensor:
    return self * self


def relu_(self: Tensor) -> Tensor:
    return _inplace(self, lambda t: U.Relu.apply(t))


@_in_ops
def rsub(self: Tensor, other: Any) -> Tensor:
    if scalar_ok(self, other):
        return S.RSubScalar.apply(self, other=other)
    return _t(other, self).sub(self)


@_in_ops
def rdiv(self: Tensor, other: Any) -> Tensor:
    if scalar_ok(self, other):
        return S.RDivScalar.apply(self, other=other)
    return div(_t(other, self), self)


@_in_ops
def rmatmul(self: Tensor, other: Any) -> Tensor:
    return matmul(_t(other, self), self)


# ------------------------------------------------------------------ reductions
@_in_ops
def _sum(self: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    return R.Sum.apply(self, dim=dim, keepdim=keepdim, dtype=None if dtype is None else dtype.np)


@_in_ops
def mean(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return R.Mean.apply(self, dim=dim, keepdim=keepdim)


def _minmax(largest: bool) -> Callable[..., Any]:
    @_in_ops
    def fn(self: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
        if isinstance(dim, Tensor):
            return maximum(self, dim) if largest else minimum(self, dim)
        if dim is None:
            return R.MaxAll.apply(self, largest=largest)
        from .return_types import MinMax

        values, indices = R.MaxDim.apply(self, dim=dim, keepdim=keepdim, largest=largest)
        return MinMax(values, indices)

    return fn


@_in_ops
def prod(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return R.Prod.apply(self, dim=dim, keepdim=keepdim)


@_in_ops
def var(
    self: Tensor,
    dim: Any = None,
    unbiased: bool | None = None,
    keepdim: bool = False,
    *,
    correction: Any = None,
) -> Tensor:
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return R.Var.apply(self, dim=dim, correction=correction, keepdim=keepdim)


@_in_ops
def std(
    self: Tensor,
    dim: Any = None,
    unbiased: bool | None = None,
    keepdim: bool = False,
    *,
    correction: Any = None,
) -> Tensor:
    return var(self, dim, unbiased, keepdim, correction=correction).sqrt()


@_in_ops
def argmax(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return R.ArgReduce.apply(self, dim=dim, keepdim=keepdim, largest=True)


@_in_ops
def argmin(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return R.ArgReduce.apply(self, dim=dim, keepdim=keepdim, largest=False)


# ------------------------------------------------------------------ movement
@_in_ops
def reshape(self: Tensor, *shape: Any) -> Tensor:
    shp = _shape_arg(shape)
    if shp == self._data.shape:
        return M.Reshape.apply(self, shape=shp) if self.requires_grad else self.view_as_self()
    return M.Reshape.apply(self, shape=shp)


@_in_ops
def view(self: Tensor, *shape: Any) -> Tensor:
    shp = _shape_arg(shape)
    out = M.Reshape.apply(self, shape=shp)
    if out._base is None and out._data.size > 0 and self._data.size > 0:
        raise RuntimeError(
            "view size is not compatible with input tensor's size and stride (at least one dimension "
            "spans across two contiguous subspaces). Use .reshape(...) instead."
        )
    return out


def view_as_self(self: Tensor) -> Tensor:
    t = Tensor._wrap(self._data.view())
    t._base = self._base if self._base is not None else self
    t._vc = self._vc
    t._inference = self._inference
    # Replayable like any view, so an in-place op through it can be recorded (views.py).
    t._view_meta = (self, M.Reshape, {"shape": self._data.shape}, self._vc.value)
    return t


def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    nd = self._data.ndim
    if nd == 0:
        return reshape(self, 1)
    s, e = start_dim % nd, end_dim % nd
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    shape = self._data.shape
    n = 1
    for d in shape[s : e + 1]:
        n *= d
    return reshape(self, *shape[:s], n, *shape[e + 1 :])


def squeeze(self: Tensor, dim: Any = None) -> Tensor:
    return M.Squeeze.apply(self, dim=dim)


def unsqueeze(self: Tensor, dim: int) -> Tensor:
    return M.Unsqueeze.apply(self, dim=dim)


def transpose(self: Tensor, dim0: int, dim1: int) -> Tensor:
    return M.Transpose.apply(self, dim0=dim0, dim1=dim1)


def permute(self: Tensor, *dims: Any) -> Tensor:
    return M.Permute.apply(self, dims=_shape_arg(dims))


def t(self: Tensor) -> Tensor:
    if self._data.ndim > 2:
        raise RuntimeError(
            f"t() expects a tensor with <= 2 dimensions, but self is {self._data.ndim}D"
        )
    return transpose(self, 0, 1) if self._data.ndim == 2 else self


def _T(self: Tensor) -> Tensor:
    return permute(self, *reversed(range(self._data.ndim)))


def _mT(self: Tensor) -> Tensor:
    if self._data.ndim < 2:
        raise RuntimeError(
            "tensor.mT is only supported on matrices or batches of matrices. Got 1-D tensor."
        )
    return transpose(self, -2, -1)


def _mH(self: Tensor) -> Tensor:
    return _mT(self).conj()


def expand(self: Tensor, *sizes: Any) -> Tensor:
    return M.Expand.apply(self, shape=_shape_arg(sizes))


def expand_as(self: Tensor, other: Tensor) -> Tensor:
    return expand(self, *other.shape)


def contiguous(self: Tensor) -> Tensor:
    if self._data.flags.c_contiguous:
        return self
    return M.Contiguous.apply(self)


def clone(self: Tensor) -> Tensor:
    return U.Clone.apply(self)


def getitem(self: Tensor, index: Any) -> Tensor:
    return M.Index.apply(self, index=index)


def narrow(self: Tensor, dim: int, start: int, length: int) -> Tensor:
    d = dim % max(self._data.ndim, 1)
    idx = (slice(None),) * d + (slice(start, start + length),)
    return getitem(self, idx)


def select(self: Tensor, dim: int, index: int) -> Tensor:
    d = dim % max(self._data.ndim, 1)
    return getitem(self, (slice(None),) * d + (index,))


def split(self: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    n = self._data.shape[dim]
    if isinstance(split_size_or_sections, int):
        if split_size_or_sections <= 0:
            raise RuntimeError(
                f"split expects split_size be positive, but got split_size={split_size_or_sections}"
            )
        sizes = [
            min(split_size_or_sections, n - i) for i in range(0, n, split_size_or_sections)
        ] or [0]
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise RuntimeError(
                f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at dimension {dim}), but got split_sizes={sizes}"
            )
    out, start = [], 0
    for s in sizes:
        out.append(narrow(self, dim, start, s))
        start += s
    return tuple(out)


def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    n = self._data.shape[dim]
    size = -(-n // chunks) if n else 1
    return split(self, max(size, 1), dim)


def conj(self: Tensor) -> Tensor:
    if self._data.dtype.kind != "c":
        return self
    return U.Conj.apply(self)


def _real(self: Tensor) -> Tensor:
    if self._data.dtype.kind != "c":
        return self
    return U.Real.apply(self)


def _imag(self: Tensor) -> Tensor:
    return U.Imag.apply(self)


def _to_dtype(self: Tensor, dtype: Any) -> Tensor:
    return self.to(dtype=dtype)


def _zeros_like_self(self: Tensor) -> Tensor:
    return Tensor._wrap(array_module(self._data).zeros_like(self._data))


def equal(self: Tensor, other: Tensor) -> bool:
    """True when both tensors have the same shape and elements."""
    return bool(self._data.shape == other._data.shape and (self._data == other._data).all())


def _truth(reduce: str) -> Callable[..., Tensor]:
    def fn(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        """True where all (``all``) or any (``any``) elements along ``dim`` are nonzero; a bool
        tensor, never differentiable."""
        xp = array_module(self._data)
        return Tensor._wrap(xp.asarray(getattr(xp, reduce)(self._data, axis=dim, keepdims=keepdim)))

    fn.__name__ = reduce
    return fn


def allclose(
    self: Tensor, other: Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False
) -> bool:
    return bool(
        array_module(self._data).allclose(
            self._data, other._data, rtol=rtol, atol=atol, equal_nan=equal_nan
        )
    )


def _unary(cls: Any) -> Callable[[Tensor], Tensor]:
    @_in_ops
    def fn(self: Tensor) -> Tensor:
        return cls.apply(self)

    fn.__name__ = cls.__name__.lower()
    return fn


def _as_floating(t: Tensor) -> Tensor:
    """Integer and bool tensors go to the default float dtype, as PyTorch's float ops do."""
    if t._data.dtype.kind in "fc":
        return t
    from ._dtypes import get_default_dtype

    return t.to(dtype=get_default_dtype())


def _float_unary(cls: Any) -> Callable[[Tensor], Tensor]:
    @_in_ops
    def fn(self: Tensor) -> Tensor:
        return cls.apply(_as_floating(self))

    fn.__name__ = cls.__name__.lower()
    return fn


_METHODS: dict[str, Any] = {
    "add": add,
    "sub": sub,
    "subtract": sub,
    "mul": mul,
    "multiply": mul,
    "div": div,
    "divide": div,
    "true_divide": div,
    "pow": pow,
    "matmul": matmul,
    "mm": matmul,
    "bmm": bmm,
    "nonzero": nonzero,
    "neg": _unary(U.Neg),
    "negative": _unary(U.Neg),
    "exp": _float_unary(U.Exp),
    "log": _float_unary(U.Log),
    "sqrt": _float_unary(U.Sqrt),
    "abs": _unary(U.Abs),
    "sin": _float_unary(U.Sin),
    "cos": _float_unary(U.Cos),
    "tanh": _float_unary(U.Tanh),
    "sigmoid": _float_unary(U.Sigmoid),
    "relu": _unary(U.Relu),
    "sgn": sgn,
    "sign": sgn,
    "clamp": clamp,
    "clip": clamp,
    "softmax": softmax,
    "log_softmax": log_softmax,
    "relu_": relu_,
    "multinomial": multinomial,
    "square": square,
    "maximum": maximum,
    "minimum": minimum,
    "where": where,
    "masked_fill": masked_fill,
    "sum": _sum,
    "mean": mean,
    "max": _minmax(True),
    "min": _minmax(False),
    "amax": None,
    "prod": prod,
    "var": var,
    "std": std,
    "argmax": argmax,
    "argmin": argmin,
    "reshape": reshape,
    "view": view,
    "view_as_self": view_as_self,
    "flatten": flatten,
    "squeeze": squeeze,
    "unsqueeze": unsqueeze,
    "transpose": transpose,
    "swapaxes": transpose,
    "permute": permute,
    "t": t,
    "expand": expand,
    "expand_as": expand_as,
    "contiguous": contiguous,
    "clone": clone,
    "narrow": narrow,
    "select": select,
    "split": split,
    "chunk": chunk,
    "conj": conj,
    "equal": equal,
    "allclose": allclose,
    "eq": _cmp("eq"),
    "ne": _cmp("ne"),
    "lt": _cmp("lt"),
    "le": _cmp("le"),
    "gt": _cmp("gt"),
    "ge": _cmp("ge"),
    "add_": add_,
    "sub_": sub_,
    "mul_": mul_,
    "div_": div_,
    "zero_": zero_,
    "fill_": fill_,
    "copy_": copy_,
    "clamp_": clamp_,
    "__add__": add,
    "__radd__": add,
    "__sub__": sub,
    "__rsub__": rsub,
    "remainder": remainder,
    "floor_divide": floor_divide,
    "__mod__": remainder,
    "__rmod__": lambda self, other: remainder(_t(other, self), self),
    "__floordiv__": floor_divide,
    "__rfloordiv__": lambda self, other: floor_divide(_t(other, self), self),
    "__mul__": mul,
    "__rmul__": mul,
    "__truediv__": div,
    "__rtruediv__": rdiv,
    "__pow__": pow,
    "__rpow__": rpow,
    "__matmul__": matmul,
    "__rmatmul__": rmatmul,
    "__neg__": _unary(U.Neg),
    "__pos__": lambda self: self,
    "__abs__": _unary(U.Abs),
    "__eq__": _cmp("eq"),
    "__ne__": _cmp("ne"),
    "__lt__": _cmp("lt"),
    "__le__": _cmp("le"),
    "__gt__": _cmp("gt"),
    "__ge__": _cmp("ge"),
    "__and__": _logical("logical_and"),
    "__or__": _logical("logical_or"),
    "__xor__": _logical("logical_xor"),
    "__invert__": lambda self: Tensor._wrap(
        array_module(self._data).logical_not(self._data)
        if self._data.dtype.kind == "b"
        else ~self._data
    ),
    "__iadd__": add_,
    "__isub__": sub_,
    "__imul__": mul_,
    "__itruediv__": div_,
    "__getitem__": getitem,
    "__setitem__": setitem,
}
_METHODS["all"] = _truth("all")
_METHODS["any"] = _truth("any")
_METHODS["amax"] = lambda self, dim=None, keepdim=False: (
    _minmax(True)(self, dim, keepdim) if dim is None else _minmax(True)(self, dim, keepdim).values
)
for _name, _fn in _METHODS.items():
    # with the tensor's CUDA device current (what runs outside an op: in-place writes, equal)
    setattr(Tensor, _name, _fn if getattr(_fn, "_in_ops", False) else on_self_device(_fn))

Tensor.T = property(_T)  # type: ignore[attr-defined]
Tensor.mT = property(_mT)  # type: ignore[attr-defined]
Tensor.mH = property(_mH)  # type: ignore[attr-defined]
Tensor.H = property(lambda self: _T(self).conj())  # type: ignore[attr-defined]
Tensor.real = property(_real)  # type: ignore[attr-defined]
Tensor.imag = property(_imag)  # type: ignore[attr-defined]
