"""``Softmax`` and ``LogSoftmax`` layers."""

from __future__ import annotations

from .._tensor import Tensor
from . import functional as F
from .modules import Module

__all__ = ["Softmax", "LogSoftmax"]


class Softmax(Module):
    """exp(x) / sum(exp(x)) along ``dim``.

    Example:
        >>> probs = gradwire.nn.Softmax(dim=1)(logits)
    """

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        return F.softmax(input, self.dim, _stacklevel=5)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """log(softmax(x)) along ``dim``, computed stably.

    Example:
        >>> logp = gradwire.nn.LogSoftmax(dim=1)(logits)
    """

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        return F.log_softmax(input, self.dim, _stacklevel=5)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
