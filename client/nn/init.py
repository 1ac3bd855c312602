"""Parameter initializers (in place, without recording)."""

from __future__ import annotations

import math
from typing import Any

from .._tensor import Tensor
from ..autograd.grad_mode import no_grad

__all__ = ["uniform_", "normal_", "zeros_", "ones_", "kaiming_uniform_", "xavier_uniform_"]


def _fill(t: Tensor, values: object) -> Tensor:
    with no_grad():
        t._data[...] = values
        t._vc.value += 1
    return t


def _gen() -> Any:
    from .. import _creation

    return _creation._rng  # read at call time: manual_seed replaces the generator


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """Fill with samples from U(a, b)."""
    return _fill(t, _gen().uniform(a, b, t.shape))


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Fill with samples from N(mean, std^2)."""
    return _fill(t, _gen().normal(mean, std, t.shape))


def zeros_(t: Tensor) -> Tensor:
    return _fill(t, 0)


def ones_(t: Tensor) -> Tensor:
    return _fill(t, 1)


def _fans(t: Tensor) -> tuple[int, int]:
    if t.ndim < 2:
        raise ValueError(
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"
        )
    receptive = 1
    for s in t.shape[2:]:
        receptive *= s
    return t.shape[1] * receptive, t.shape[0] * receptive


def kaiming_uniform_(t: Tensor, a: float = 0.0) -> Tensor:
    """He initialization for layers followed by (leaky) ReLU."""
    fan_in, _ = _fans(t)
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / fan_in)
    return uniform_(t, -bound, bound)


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot initialization."""
    fan_in, fan_out = _fans(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound)
