"""Stateless layers and losses: relu, softmax, log_softmax, linear, mse_loss, cross_entropy."""

from __future__ import annotations

import warnings
from typing import Any

from .._ops.dropout import dropout, dropout2d
from .._ops.embedding import embedding
from .._ops.embedding_bag import embedding_bag
from .._tensor import Tensor
from ._losses import cross_entropy, nll_loss
from ._norm import batch_norm, layer_norm
from .conv import conv2d
from .pooling import adaptive_avg_pool2d, avg_pool2d, max_pool2d

__all__ = [
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "dropout",
    "dropout2d",
    "embedding",
    "embedding_bag",
    "batch_norm",
    "layer_norm",
    "flatten",
    "relu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "linear",
    "mse_loss",
    "l1_loss",
    "cross_entropy",
    "nll_loss",
]


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(x, 0) elementwise; with ``inplace=True`` written into ``input`` (and returned)."""
    return input.relu_() if inplace else input.relu()


def sigmoid(input: Tensor) -> Tensor:
    return input.sigmoid()


def tanh(input: Tensor) -> Tensor:
    return input.tanh()


def _softmax_dim(name: str, ndim: int, dim: int | None) -> int:
    if dim is not None:
        return dim
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. "
        "Change the call to include dim=X as an argument.",
        stacklevel=3,
    )
    return 0 if ndim in (0, 1, 3) else 1


def softmax(
    input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None
) -> Tensor:
    """exp(x) / sum(exp(x)) along ``dim`` (cast to ``dtype`` first when given)."""
    if dtype is not None:
        input = input.to(dtype=dtype)
    return input.softmax(_softmax_dim("softmax", input.ndim, dim))


def log_softmax(
    input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None
) -> Tensor:
    """log(softmax(x)) along ``dim``, computed stably (cast to ``dtype`` first when given)."""
    if dtype is not None:
        input = input.to(dtype=dtype)
    return input.log_softmax(_softmax_dim("log_softmax", input.ndim, dim))


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dimensions ``start_dim`` .. ``end_dim`` into one (``gradwire.flatten``)."""
    return input.flatten(start_dim, end_dim)


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ W^T + b."""
    out = input @ weight.t()
    return out + bias if bias is not None else out


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction: use 'mean', 'sum' or 'none'")


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error.

    Raises:
        ValueError: if the shapes differ (no silent broadcasting) or ``reduction`` is unknown.
    """
    if input.shape != target.shape:
        raise ValueError(
            f"mse_loss: input shape {input.shape} and target shape {target.shape} differ; "
            "reshape one of them so they match"
        )
    diff = input - target
    return _reduce(diff * diff, reduction)


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean absolute error (its gradient at a zero difference is 0, as in PyTorch).

    Raises:
        ValueError: if the shapes differ (no silent broadcasting) or ``reduction`` is unknown.
    """
    if input.shape != target.shape:
        raise ValueError(
            f"l1_loss: input shape {input.shape} and target shape {target.shape} differ; "
            "reshape one of them so they match"
        )
    return _reduce((input - target).abs(), reduction)
