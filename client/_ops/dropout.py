"""Dropout: multiply by a random keep-mask scaled by 1/(1-p), drawn from gradwire's generator
(so ``gradwire.manual_seed`` makes it reproducible). The functional forms ``dropout`` and
``dropout2d`` live here, next to their op, and are exported by ``gradwire.nn.functional``."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .._backend import array_module, device_of, on_input_device, to_device
from .._tensor import Tensor
from ._base import Op

__all__ = ["NativeDropout", "dropout", "dropout2d"]


class NativeDropout(Op):
    """x * mask, where ``mask`` (a raw array, broadcastable to x) already holds 0 or 1/(1-p)."""

    def forward(self, x: Any, mask: Any = None) -> Any:
        self.save("mask", mask)
        return x._data * mask

    def backward(self, g: Any) -> Any:
        return g * Tensor._wrap(self.saved("mask"))


def _check_p(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _mask(input: Tensor, shape: tuple[int, ...], p: float) -> Any:
    from .. import _creation

    # Read the generator at call time: manual_seed replaces it.
    dt = input._data.dtype
    if p == 1.0:
        keep = np.zeros(shape, dtype=dt)
    else:
        keep = (_creation._rng.random(shape) >= p).astype(dt) * np.asarray(1.0 / (1.0 - p), dt)
    return to_device(keep, device_of(input._data))


def _apply(input: Tensor, mask: Any, inplace: bool) -> Tensor:
    if inplace:
        return input.mul_(Tensor._wrap(mask))
    return NativeDropout.apply(input, mask=mask)


@on_input_device
def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    Args:
        input: a floating-point tensor of any shape.
        p: probability of zeroing an element, in [0, 1].
        training: when False, return ``input`` unchanged.
        inplace: modify ``input`` in place.

    Returns:
        A tensor of ``input``'s shape (``input`` itself when ``inplace`` or not training).

    Raises:
        ValueError: if ``p`` is outside [0, 1].

    Example:
        >>> y = gradwire.nn.functional.dropout(gradwire.ones(4, 4), p=0.25)
    """
    _check_p(p)
    if not training or p == 0.0:
        return input
    return _apply(input, _mask(input, tuple(input.shape), p), inplace)


@on_input_device
def dropout2d(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> Tensor:
    """Zero whole channels: each ``input[n, c]`` of an (N, C, H, W) input is zeroed with
    probability ``p``; the kept channels are scaled by ``1 / (1 - p)``.

    As in PyTorch, a 3-D input is taken as (N, C, L) (with a warning, as PyTorch warns) and a
    2-D input gets element-wise dropout (with a deprecation warning).

    Args:
        input: (N, C, H, W), or 3-D / 2-D as above.
        p: probability of zeroing a channel, in [0, 1].
        training: when False, return ``input`` unchanged.
        inplace: modify ``input`` in place.

    Returns:
        A tensor of ``input``'s shape.

    Raises:
        ValueError: if ``p`` is outside [0, 1] or the input is not 2-D, 3-D or 4-D.
    """
    _check_p(p)
    nd = input.ndim
    if nd not in (2, 3, 4):
        raise ValueError(
            f"dropout2d expects a 3-D or 4-D input (N, C, H, W) or (C, H, W), got shape {input.shape}"
        )
    if nd == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D "
            "dropout behavior is desired - input is interpreted as shape (N, C, L), where C "
            "is the channel dim (PyTorch's behaviour).",
            UserWarning,
            stacklevel=2,
        )
    elif nd == 2:
        warnings.warn(
            "dropout2d: Received a 2-D input to dropout2d, which is deprecated; use dropout "
            "for element-wise dropout.",
            UserWarning,
            stacklevel=2,
        )
    if not training or p == 0.0:
        return input
    shape = tuple(input.shape[:2]) + (1,) * (nd - 2) if nd > 2 else tuple(input.shape)
    mask = _mask(input, shape, p)
    xp = array_module(input._data)
    return _apply(input, xp.ascontiguousarray(mask), inplace)
