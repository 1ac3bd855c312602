"""Module-level forms of the tensor ops: ``gradwire.exp(x)``, ``gradwire.matmul(a, b)``, ..."""

from __future__ import annotations

from typing import Any

from ._creation import tensor
from ._tensor import Tensor

_NAMES = [
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "matmul",
    "mm",
    "bmm",
    "nonzero",
    "neg",
    "exp",
    "log",
    "sqrt",
    "abs",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "clamp",
    "clip",
    "softmax",
    "log_softmax",
    "multinomial",
    "maximum",
    "remainder",
    "floor_divide",
    "minimum",
    "sum",
    "mean",
    "max",
    "min",
    "amax",
    "prod",
    "var",
    "std",
    "argmax",
    "argmin",
    "reshape",
    "flatten",
    "squeeze",
    "unsqueeze",
    "transpose",
    "permute",
    "t",
    "split",
    "chunk",
    "conj",
    "sgn",
    "sign",
    "square",
    "clone",
    "narrow",
    "select",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "equal",
    "allclose",
    "masked_fill",
    "detach",
]

__all__ = [*_NAMES, "real", "imag", "numel"]


#: Ops whose ``input`` may be a Python number, as in PyTorch (``torch.add(0, 3)`` is
#: ``tensor(3)``): the number becomes a 0-dim tensor, which promotes as PyTorch's does.
_NUMBER_INPUT = frozenset({"add", "sub", "mul", "div", "true_divide"})


def _make(name: str) -> Any:
    number_input = name in _NUMBER_INPUT

    def fn(input: Tensor, *args: Any, **kwargs: Any) -> Any:
        if number_input and isinstance(input, (bool, int, float, complex)):
            input = tensor(input)
        if not isinstance(input, Tensor):
            raise TypeError(
                f"{name}(): argument 'input' must be Tensor, not {type(input).__name__}"
            )
        return getattr(input, name)(*args, **kwargs)

    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = f"Module-level form of ``Tensor.{name}``."
    return fn


for _n in _NAMES:
    globals()[_n] = _make(_n)


def real(input: Tensor) -> Tensor:
    """The real part (a view for complex tensors)."""
    return input.real


def imag(input: Tensor) -> Tensor:
    """The imaginary part of a complex tensor (a view)."""
    return input.imag


def numel(input: Tensor) -> int:
    """The number of elements."""
    return input.numel()
