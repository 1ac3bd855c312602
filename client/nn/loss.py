"""``NLLLoss``: negative log-likelihood of class indices (``CrossEntropyLoss`` is in modules)."""

from __future__ import annotations

from typing import Any

from .._tensor import Tensor
from . import functional as F
from ._losses import _reduction
from .modules import Module

__all__ = ["NLLLoss"]


class NLLLoss(Module):
    """Negative log-likelihood of class indices under log-probabilities (after ``LogSoftmax``).

    Args:
        weight: optional (C,) class weights (kept as a buffer).
        ignore_index: a target value that contributes neither loss nor weight.
        reduction: 'mean' (weighted mean), 'sum' or 'none'.

    Example:
        >>> loss = gradwire.nn.NLLLoss()(gradwire.nn.LogSoftmax(1)(logits), target)
    """

    def __init__(
        self,
        weight: Tensor | None = None,
        size_average: Any = None,
        ignore_index: int = -100,
        reduce: Any = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = _reduction(size_average, reduce, reduction)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(
            input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction
        )
