"""Ops between a float/complex tensor and a Python number: the common ``x * 0.5``, ``x + 1``.

They skip wrapping the number in a tensor and summing gradients over broadcast axes, which the
general binary ops must do; NumPy's weak typing of Python scalars keeps the tensor's dtype.
"""

from __future__ import annotations

from typing import Any

from ._base import Op

__all__ = ["AddScalar", "MulScalar", "DivScalar", "RSubScalar", "RDivScalar", "scalar_ok"]


def scalar_ok(t: Any, value: Any) -> bool:
    """True when ``t <op> value`` can take a scalar op without changing the result dtype."""
    kind = t._data.dtype.kind
    if kind == "f":
        return type(value) in (int, float)
    if kind == "c":
        return type(value) in (int, float, complex)
    return False


class _ScalarOp(Op):
    scalar_operand = True


class AddScalar(_ScalarOp):
    def forward(self, x: Any, other: Any = 0) -> Any:
        return x._data + other

    def backward(self, g: Any) -> Any:
        return g, None

    def name(self) -> str:
        return "AddBackward0"


class MulScalar(_ScalarOp):
    def forward(self, x: Any, other: Any = 1) -> Any:
        self.save("other", other)
        return x._data * other

    def backward(self, g: Any) -> Any:
        s = self.saved("other")
        return g * (s.conjugate() if isinstance(s, complex) else s), None

    def name(self) -> str:
        return "MulBackward0"


class DivScalar(_ScalarOp):
    def forward(self, x: Any, other: Any = 1) -> Any:
        self.save("other", other)
        return x._data / other

    def backward(self, g: Any) -> Any:
        s = self.saved("other")
        return g / (s.conjugate() if isinstance(s, complex) else s), None

    def name(self) -> str:
        return "DivBackward0"


class RSubScalar(_ScalarOp):
    """other - x"""

    def forward(self, x: Any, other: Any = 0) -> Any:
        return other - x._data

    def backward(self, g: Any) -> Any:
        return -g, None

    def name(self) -> str:
        return "RsubBackward1"


class RDivScalar(_ScalarOp):
    """other / x"""

    save_output = "result"

    def forward(self, x: Any, other: Any = 1) -> Any:
        self.save("self", x)
        return other / x._data

    def backward(self, g: Any) -> Any:
        # d(s/x) = -s/x^2 = -result/x
        x, y = self.saved("self"), self.saved("result")
        return -g * (y / x).conj(), None

    def name(self) -> str:
        return "DivBackward0"
