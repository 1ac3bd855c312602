"""``Dropout`` and ``Dropout2d``: random zeroing during training, identity in ``eval()``."""

from __future__ import annotations

from .._ops.dropout import _check_p, dropout, dropout2d
from .._tensor import Tensor
from .modules import Module

__all__ = ["Dropout", "Dropout2d"]


class _DropoutNd(Module):
    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        _check_p(p)
        self.p, self.inplace = p, inplace

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    """Zero each element with probability ``p`` in training; scale the rest by 1/(1-p).

    Args:
        p: probability of zeroing, in [0, 1].
        inplace: modify the input in place.

    Raises:
        ValueError: if ``p`` is outside [0, 1].

    Example:
        >>> drop = gradwire.nn.Dropout(0.2)
        >>> y = drop(gradwire.ones(8, 8))  # drop.eval() makes it the identity
    """

    def forward(self, input: Tensor) -> Tensor:
        return dropout(input, self.p, self.training, self.inplace)


class Dropout2d(_DropoutNd):
    """Zero whole channels of an (N, C, H, W) input with probability ``p`` in training.

    Args:
        p: probability of zeroing a channel, in [0, 1].
        inplace: modify the input in place.

    Raises:
        ValueError: if ``p`` is outside [0, 1].
    """

    def forward(self, input: Tensor) -> Tensor:
        return dropout2d(input, self.p, self.training, self.inplace)
