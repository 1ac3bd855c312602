"""Elementwise ops of one tensor. Complex gradients follow the conjugate Wirtinger convention:
for a holomorphic f, grad_input = grad_output * conj(f'(z))."""

from __future__ import annotations

from typing import Any

from .._backend import array_module, to_device
from ..autograd._profiling import traced
from ._base import Op, reduce_grad

__all__ = [
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Abs",
    "Sin",
    "Cos",
    "Tanh",
    "Sigmoid",
    "Relu",
    "Clamp",
    "Conj",
    "Real",
    "Imag",
    "ToCopy",
    "Clone",
    "Softmax",
    "LogSoftmax",
    "PowScalar",
]


class Neg(Op):
    def forward(self, x: Any) -> Any:
        return -x._data

    def backward(self, g: Any) -> Any:
        return -g


class Exp(Op):
    save_output = "result"

    def forward(self, x: Any) -> Any:
        return array_module(x._data).exp(x._data)

    def backward(self, g: Any) -> Any:
        return g * self.saved("result").conj()


class Log(Op):
    def forward(self, x: Any) -> Any:
        self.save("self", x)
        return array_module(x._data).log(x._data)

    def backward(self, g: Any) -> Any:
        return g / self.saved("self").conj()


class Sqrt(Op):
    save_output = "result"

    def forward(self, x: Any) -> Any:
        return array_module(x._data).sqrt(x._data)

    def backward(self, g: Any) -> Any:
        return g / (2 * self.saved("result").conj())


class Abs(Op):
    def forward(self, x: Any) -> Any:
        self.save("self", x)
        return array_module(x._data).abs(x._data)

    def backward(self, g: Any) -> Any:
        # d|z| in the conjugate convention is z/|z| (sgn); the output is real (C->R).
        return g * self.saved("self").sgn()


class Sin(Op):
    def forward(self, x: Any) -> Any:
        self.save("self", x)
        return array_module(x._data).sin(x._data)

    def backward(self, g: Any) -> Any:
        return g * self.saved("self").cos().conj()


class Cos(Op):
    def forward(self, x: Any) -> Any:
        self.save("self", x)
        return array_module(x._data).cos(x._data)

    def backward(self, g: Any) -> Any:
        return -g * self.saved("self").sin().conj()


class Tanh(Op):
    save_output = "result"

    def forward(self, x: Any) -> Any:
        return array_module(x._data).tanh(x._data)

    def backward(self, g: Any) -> Any:
        y = self.saved("result")
        return g * (1 - y * y).conj()


class Sigmoid(Op):
    save_output = "result"

    def forward(self, x: Any) -> Any:
        xp = array_module(x._data)
        d = x._data
        if d.dtype.kind == "c":
            return 1 / (1 + xp.exp(-d))
        # Split by sign so exp never overflows.
        e = xp.exp(-xp.abs(d))
        return xp.where(d >= 0, 1 / (1 + e), e / (1 + e)).astype(d.dtype, copy=False)

    def backward(self, g: Any) -> Any:
        y = self.saved("result")
        return g * (y * (1 - y)).conj()


@traced("aten::clamp_min")
def _clamp_min(data: Any, lo: Any) -> Any:
    """max(data, lo) in data's dtype: relu's kernel (as in PyTorch, where aten::relu runs
    aten::clamp_min, and the profiler shows both)."""
    return array_module(data).maximum(data, lo).astype(data.dtype, copy=False)


class Relu(Op):
    save_output = "result"

    def forward(self, x: Any) -> Any:
        return _clamp_min(x._data, 0)

    def backward(self, g: Any) -> Any:
        return g * (self.saved("result") > 0)


class Clamp(Op):
    def forward(self, x: Any, min: Any = None, max: Any = None) -> Any:
        xp = array_module(x._data)
        self.save("self", x)
        self.save("min", min)
        self.save("max", max)
        return xp.clip(x._data, min, max).astype(x._data.dtype, copy=False)

    def backward(self, g: Any) -> Any:
        x = self.saved("self")
        lo, hi = self.saved("min"), self.saved("max")
        mask = None
        if lo is not None:
            mask = x >= lo
        if hi is not None:
            m = x <= hi
            mask = m if mask is None else mask & m
        return g if mask is None else g * mask


class PowScalar(Op):
    def forward(self, x: Any, exponent: Any) -> Any:
        self.save("self", x)
        self.save("exponent", exponent)
        out = x._data**exponent
        # A Python-number exponent must not widen the tensor's dtype (float32 stays float32).
        return (
            out.astype(x._data.dtype, copy=False) if out.dtype.kind == x._data.dtype.kind else out
        )

    def backward(self, g: Any) -> Any:
        x, e = self.saved("self"), self.saved("exponent")
        if e == 0:
            return g * 0
        return g * (e * x ** (e - 1)).conj()

    def name(self) -> str:
        return "PowBackward0"


class Conj(Op):
    def forward(self, x: Any) -> Any:
        return x._data.conj()

    def backward(self, g: Any) -> Any:
        return g.conj()


class Real(Op):
    is_view = True

    def forward(self, x: Any) -> Any:
        return x._data.real

    def backward(self, g: Any) -> Any:
        return g  # reduce_grad in the engine casts it back to the complex input dtype


class Imag(Op):
    is_view = True

    def forward(self, x: Any) -> Any:
        if x._data.dtype.kind != "c":
            raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
        return x._data.imag

    def backward(self, g: Any) -> Any:
        return g * 1j


class ToCopy(Op):
    def forward(self, x: Any, device: Any, dtype: Any) -> Any:
        self.save("src_device", x.device)
        self.save("src_dtype", x._data.dtype)
        arr = to_device(x._data, device)
        if arr.dtype != dtype:
            arr = arr.astype(dtype)
        elif arr is x._data:
            arr = arr.copy()
        return arr

    def backward(self, g: Any) -> Any:
        g = g.to(self.saved("src_device"))
        return reduce_grad(g, g.shape, self.saved("src_dtype"))


class Clone(Op):
    def forward(self, x: Any) -> Any:
        return x._data.copy()

    def backward(self, g: Any) -> Any:
        return g


class Softmax(Op):
    save_output = "result"

    def forward(self, x: Any, dim: int) -> Any:
        xp = array_module(x._data)
        self.save("dim", dim)
        z = x._data - x._data.max(axis=dim, keepdims=True)
        e = xp.exp(z)
        return e / e.sum(axis=dim, keepdims=True)

    def backward(self, g: Any) -> Any:
        y, dim = self.saved("result"), self.saved("dim")
        return y * (g - (g * y).sum(dim=dim, keepdim=True))


class LogSoftmax(Op):
    save_output = "result"

    def forward(self, x: Any, dim: int) -> Any:
        xp = array_module(x._data)
        self.save("dim", dim)
        z = x._data - x._data.max(axis=dim, keepdims=True)
        return z - xp.log(xp.exp(z).sum(axis=dim, keepdims=True))

    def backward(self, g: Any) -> Any:
        y, dim = self.saved("result"), self.saved("dim")
        return g - y.exp() * g.sum(dim=dim, keepdim=True)
