"""Broadcasting ops of two tensors, and matmul. Gradients are summed back over broadcast axes
by ``reduce_grad``; complex gradients use the conjugate Wirtinger convention."""

from __future__ import annotations

from typing import Any

from .._backend import array_module
from ..errors import ArgumentError
from ._base import Op, promoted, reduce_grad

__all__ = [
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Maximum",
    "Minimum",
    "Where",
    "MatMul",
    "Compare",
    "CopyFrom",
    "Fill",
]


def check_broadcast(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    """Raise PyTorch's error when shapes ``sa`` and ``sb`` do not broadcast together.

    Raises:
        ArgumentError: a dimension differs and neither size is 1 (a RuntimeError, as PyTorch's).
    """
    for i in range(1, min(len(sa), len(sb)) + 1):
        x, y = sa[-i], sb[-i]
        if x != y and x != 1 and y != 1:
            raise ArgumentError(
                f"The size of tensor a ({x}) must match the size of tensor b ({y}) at "
                f"non-singleton dimension {max(len(sa), len(sb)) - i}: shapes {tuple(sa)} and "
                f"{tuple(sb)} do not broadcast"
            )


class _Binary(Op):
    """Keeps only the shapes/dtypes of its inputs unless a subclass saves more."""

    def _shapes(self, a: Any, b: Any) -> None:
        sa, sb = a._data.shape, b._data.shape
        if sa != sb:
            check_broadcast(sa, sb)
        if self._recording:  # plain attributes: cheaper than saved values, never stale
            self._meta = (a._data.shape, a._data.dtype, b._data.shape, b._data.dtype)

    def _reduce(self, ga: Any, gb: Any) -> tuple[Any, Any]:
        sa, da, sb, db = self._meta
        return (
            reduce_grad(ga, sa, da) if self.needs_input_grad[0] else None,
            reduce_grad(gb, sb, db) if self.needs_input_grad[1] else None,
        )


class Add(_Binary):
    def forward(self, a: Any, b: Any, alpha: Any = 1) -> Any:
        self._shapes(a, b)
        self.save("alpha", alpha)
        x, y = promoted(a, b)
        return x + y if alpha == 1 else x + alpha * y

    def backward(self, g: Any) -> Any:
        alpha = self.saved("alpha")
        return self._reduce(g, g if alpha == 1 else g * alpha)


class Sub(_Binary):
    def forward(self, a: Any, b: Any, alpha: Any = 1) -> Any:
        self._shapes(a, b)
        self.save("alpha", alpha)
        x, y = promoted(a, b)
        return x - y if alpha == 1 else x - alpha * y

    def backward(self, g: Any) -> Any:
        alpha = self.saved("alpha")
        return self._reduce(g, -g if alpha == 1 else -g * alpha)


class Mul(_Binary):
    def forward(self, a: Any, b: Any) -> Any:
        self._shapes(a, b)
        self.save("self", a if self.needs_input_grad[1:2] == (True,) else None)
        self.save("other", b if self.needs_input_grad[:1] == (True,) else None)
        #: ``x * x``: both gradients are ``g * x``, computed once (the engine adds the two).
        self._square = a is b
        x, y = promoted(a, b)
        return x * y

    def backward(self, g: Any) -> Any:
        a, b = self.saved("self"), self.saved("other")  # (both: each checks its version)
        ga = g * b.conj() if b is not None else None
        if self._square and ga is not None:
            return self._reduce(ga, ga)
        return self._reduce(ga, g * a.conj() if a is not None else None)


class Div(_Binary):
    def forward(self, a: Any, b: Any) -> Any:
        self._shapes(a, b)
        self.save("self", a if self.needs_input_grad[1:2] == (True,) else None)
        self.save("other", b)
        x, y = promoted(a, b)
        return x / y

    def backward(self, g: Any) -> Any:
        a, b = self.saved("self"), self.saved("other")
        ga = g / b.conj() if self.needs_input_grad[0] else None
        gb = -g * (a / (b * b)).conj() if self.needs_input_grad[1] else None
        return self._reduce(ga, gb)


class Pow(_Binary):
    save_output = "result"

    def forward(self, a: Any, b: Any) -> Any:
        self._shapes(a, b)
        self.save("self", a)
        self.save("exponent", b)
        x, y = promoted(a, b)
        return x**y

    def backward(self, g: Any) -> Any:
        a, b = self.saved("self"), self.saved("exponent")
        ga = gb = None
        if self.needs_input_grad[0]:
            ga = g * (b * a ** (b - 1)).conj()
        if self.needs_input_grad[1]:
            # d(a^b)/db = a^b log a; where a == 0 and b >= 0 the limit is 0.
            y = self.saved("result")
            safe = a.masked_fill(a == 0, 1)
            gb = g * (y * safe.log()).conj()
        return self._reduce(ga, gb)

    def name(self) -> str:
        return "PowBackward1"


class Maximum(_Binary):
    def forward(self, a: Any, b: Any) -> Any:
        self._shapes(a, b)
        self.save("self", a)
        self.save("other", b)
        return array_module(a._data).maximum(*promoted(a, b))

    def backward(self, g: Any) -> Any:
        a, b = self.saved("self"), self.saved("other")
        # Ties split the gradient evenly, as PyTorch does.
        wa = (a > b) + (a == b) * 0.5
        return self._reduce(g * wa, g * (1 - wa))


class Minimum(_Binary):
    def forward(self, a: Any, b: Any) -> Any:
        self._shapes(a, b)
        self.save("self", a)
        self.save("other", b)
        return array_module(a._data).minimum(*promoted(a, b))

    def backward(self, g: Any) -> Any:
        a, b = self.saved("self"), self.saved("other")
        wa = (a < b) + (a == b) * 0.5
        return self._reduce(g * wa, g * (1 - wa))


class Where(Op):
    """where(cond, a, b); cond is not differentiable and is passed as a keyword."""

    def forward(self, a: Any, b: Any, cond: Any = None) -> Any:
        self.save("condition", cond)
        self.save("self_meta", (a._data.shape, a._data.dtype))
        self.save("other_meta", (b._data.shape, b._data.dtype))
        return array_module(a._data).where(cond._data, *promoted(a, b))

    def backward(self, g: Any) -> Any:
        c = self.saved("condition")
        (sa, da), (sb, db) = self.saved("self_meta"), self.saved("other_meta")
        zero = g * 0
        return (
            reduce_grad(c.where(g, zero), sa, da) if self.needs_input_grad[0] else None,
            reduce_grad(c.where(zero, g), sb, db) if self.needs_input_grad[1] else None,
        )


class MatMul(Op):
    def forward(self, a: Any, b: Any) -> Any:
        if a._data.ndim == 0 or b._data.ndim == 0:
            raise RuntimeError(
                "both arguments to matmul need to be at least 1D, but they are "
                f"{a._data.ndim}D and {b._data.ndim}D"
            )
        self.save("self", a if self.needs_input_grad[1:2] == (True,) else None)
        self.save("other", b if self.needs_input_grad[:1] == (True,) else None)
        self.save("self_meta", (a._data.shape, a._data.dtype))
        self.save("other_meta", (b._data.shape, b._data.dtype))
        self._is_mm = a._data.ndim == 2 and b._data.ndim == 2
        try:
            return a._data @ b._data
        except ValueError:
            raise RuntimeError(
                f"mat1 and mat2 shapes cannot be multiplied ({_fmt(a._data.shape)} and {_fmt(b._data.shape)})"
            ) from None

    def backward(self, g: Any) -> Any:
        a, b = self.saved("self"), self.saved("other")
        (sa, da), (sb, db) = self.saved("self_meta"), self.saved("other_meta")
        a1, b1 = len(sa) == 1, len(sb) == 1
        g2 = g
        # Restore the dims matmul dropped; b's first so that 1-D @ 1-D (a 0-d g) works.
        if b1:
            g2 = g2.unsqueeze(-1)
        if a1:
            g2 = g2.unsqueeze(-2)
        ga = gb = None
        if self.needs_input_grad[0]:
            b2 = b.unsqueeze(-1) if b1 else b
            ga = g2 @ b2.mT.conj()
            ga = reduce_grad(ga, (1, *sa) if a1 else sa, da)
            if a1:
                ga = ga.reshape(sa)
        if self.needs_input_grad[1]:
            a2 = a.unsqueeze(0) if a1 else a
            gb = a2.mT.conj() @ g2
            gb = reduce_grad(gb, (*sb, 1) if b1 else sb, db)
            if b1:
                gb = gb.reshape(sb)
        return ga, gb

    def name(self) -> str:
        return "MmBackward0" if getattr(self, "_is_mm", False) else "MatmulBackward0"


def _fmt(shape: tuple[int, ...]) -> str:
    return "x".join(str(s) for s in shape)


class Compare(Op):
    """A comparison (eq, ne, lt, le, gt, ge): bool output, never differentiable."""

    differentiable = False
    profile_kwarg = "op"  # the profiler names it by its comparison: "aten::gt"
    _FNS = {
        "eq": "equal",
        "ne": "not_equal",
        "lt": "less",
        "le": "less_equal",
        "gt": "greater",
        "ge": "greater_equal",
    }

    def forward(self, a: Any, b: Any, op: str = "eq") -> Any:
        return getattr(array_module(a._data), self._FNS[op])(*promoted(a, b))


class CopyFrom(Op):
    """The out-of-place core of ``dst.copy_(src)``: ``src`` broadcast to dst's shape and dtype.

    The old value of dst gets a zero gradient, never ``dst * 0`` (which is nan where dst held
    inf or nan, e.g. after ``empty``).
    """

    def forward(self, dst: Any, src: Any) -> Any:
        self.save("src_meta", (src._data.shape, src._data.dtype))
        xp = array_module(dst._data)
        try:
            return xp.broadcast_to(src._data, dst._data.shape).astype(dst._data.dtype)
        except ValueError:
            raise RuntimeError(
                f"The size of tensor a ({list(dst._data.shape)}) must match the size of tensor b "
                f"({list(src._data.shape)}) or be broadcastable to it"
            ) from None

    def backward(self, g: Any) -> Any:
        shape, dtype = self.saved("src_meta")
        g_dst = _zeros_like(g) if self.needs_input_grad[0] else None
        g_src = reduce_grad(g, shape, dtype) if self.needs_input_grad[1] else None
        return g_dst, g_src

    def name(self) -> str:
        return "CopyBackwards"


class Fill(Op):
    """The out-of-place core of ``fill_(number)`` and ``zero_()``: a constant of dst's shape."""

    def forward(self, dst: Any, value: Any = 0) -> Any:
        self._zero = value == 0
        return array_module(dst._data).full(dst._data.shape, value, dtype=dst._data.dtype)

    def backward(self, g: Any) -> Any:
        return _zeros_like(g)

    def name(self) -> str:
        return "ZeroBackward0" if getattr(self, "_zero", False) else "FillBackward0"


def _zeros_like(g: Any) -> Any:
    from .._tensor import Tensor

    return Tensor._wrap(array_module(g._data).zeros_like(g._data))


class Remainder(_Binary):
    """Python's (and PyTorch's) ``%``: the result takes the sign of the divisor."""

    def forward(self, a: Any, b: Any) -> Any:
        self._shapes(a, b)
        x, y = promoted(a, b)
        if self._recording and self.needs_input_grad[1]:
            self.save("quotient", array_module(x).floor_divide(x, y))
        return array_module(x).remainder(x, y)

    def backward(self, g: Any) -> Any:
        from .._tensor import Tensor

        gb = None
        if self.needs_input_grad[1]:
            gb = -g * Tensor._wrap(self.saved("quotient"))
        return self._reduce(g, gb)


class FloorDivide(_Binary):
    """``//``: floor of the quotient; not differentiable (PyTorch gives it no gradient)."""

    differentiable = False

    def forward(self, a: Any, b: Any) -> Any:
        return array_module(a._data).floor_divide(*promoted(a, b))
