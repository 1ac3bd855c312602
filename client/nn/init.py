"""Parameter initializers (in place, without recording), with PyTorch's signatures."""

from __future__ import annotations

import math
from typing import Any

from .._backend import device_scope, to_device
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad

__all__ = [
    "calculate_gain",
    "uniform_",
    "normal_",
    "constant_",
    "zeros_",
    "ones_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
]


def _fill(t: Tensor, values: Any) -> Tensor:
    with no_grad(), device_scope(t.device):
        if hasattr(values, "shape"):
            values = to_device(values, t.device)
        t._data[...] = values
        t._vc.value += 1
    return t


def _gen(generator: Any = None) -> Any:
    if generator is not None:
        return generator
    from .. import _creation

    return _creation._rng  # read at call time: manual_seed replaces the generator


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (PyTorch's table).

    Args:
        nonlinearity: 'linear', 'conv1d', 'conv2d', 'conv3d', 'conv_transpose1d/2d/3d',
            'sigmoid', 'tanh', 'relu', 'leaky_relu' or 'selu'.
        param: the negative slope of 'leaky_relu' (default 0.01).

    Returns:
        The gain: 1, 5/3, sqrt(2), sqrt(2 / (1 + slope^2)) or 3/4.

    Raises:
        ValueError: for an unknown nonlinearity or a non-numeric slope.

    Example:
        >>> gradwire.nn.init.calculate_gain("relu")
        1.4142135623730951
    """
    linear = {"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d"}
    if nonlinearity in linear | {"conv_transpose3d", "sigmoid"}:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Fill with samples from U(a, b); returns ``tensor``."""
    return _fill(tensor, _gen(generator).uniform(a, b, tensor.shape))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Fill with samples from N(mean, std^2); returns ``tensor``."""
    return _fill(tensor, _gen(generator).normal(mean, std, tensor.shape))


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill with ``val``; returns ``tensor``."""
    return _fill(tensor, val)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill with 0; returns ``tensor``."""
    return _fill(tensor, 0)


def ones_(tensor: Tensor) -> Tensor:
    """Fill with 1; returns ``tensor``."""
    return _fill(tensor, 1)


def _fans(t: Tensor) -> tuple[int, int]:
    if t.ndim < 2:
        raise ValueError(
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"
        )
    receptive = 1
    for s in t.shape[2:]:
        receptive *= s
    return t.shape[1] * receptive, t.shape[0] * receptive


def _kaiming_std(t: Tensor, a: float, mode: str, nonlinearity: str) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _fans(t)
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(
    tensor: Tensor,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Any = None,
) -> Tensor:
    """He initialisation: U(-b, b) with b = gain * sqrt(3 / fan).

    Args:
        tensor: at least 2-d (fan_in = size(1) * receptive field).
        a: negative slope of the leaky_relu that follows.
        mode: 'fan_in' (keeps forward variance) or 'fan_out' (backward).
        nonlinearity: the function that follows (see :func:`calculate_gain`).

    Returns:
        ``tensor``, filled.

    Raises:
        ValueError: for a tensor under 2-d, an unknown mode or nonlinearity.

    Example:
        >>> gradwire.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    """
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(
    tensor: Tensor,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: Any = None,
) -> Tensor:
    """He initialisation: N(0, std^2) with std = gain / sqrt(fan); see :func:`kaiming_uniform_`."""
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot initialisation: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _fans(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot initialisation: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)
