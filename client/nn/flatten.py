"""``Flatten``: merge a range of dimensions into one."""

from __future__ import annotations

from .._tensor import Tensor
from .modules import Module

__all__ = ["Flatten"]


class Flatten(Module):
    """Flatten dimensions ``start_dim`` .. ``end_dim`` (by default all but the batch dimension).

    Example:
        >>> gradwire.nn.Flatten()(gradwire.zeros(32, 1, 5, 5)).shape
        (32, 25)
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input: Tensor) -> Tensor:
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
