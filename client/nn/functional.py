"""Stateless layers and losses: relu, softmax, log_softmax, linear, mse_loss, cross_entropy."""

from __future__ import annotations

from typing import Any

from .._tensor import Tensor

__all__ = [
    "relu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
    "linear",
    "mse_loss",
    "cross_entropy",
    "nll_loss",
]


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(x, 0) elementwise."""
    return input.relu()


def sigmoid(input: Tensor) -> Tensor:
    return input.sigmoid()


def tanh(input: Tensor) -> Tensor:
    return input.tanh()


def softmax(input: Tensor, dim: int) -> Tensor:
    """exp(x) / sum(exp(x)) along ``dim``."""
    return input.softmax(dim)


def log_softmax(input: Tensor, dim: int) -> Tensor:
    """log(softmax(x)) along ``dim``, computed stably."""
    return input.log_softmax(dim)


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


def nll_loss(log_probs: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of class indices ``target`` under ``log_probs`` (N, C)."""
    if log_probs.ndim != 2:
        raise ValueError(f"nll_loss expects (N, C) log-probabilities, got shape {log_probs.shape}")
    if target.ndim != 1 or target.shape[0] != log_probs.shape[0]:
        raise ValueError(
            f"nll_loss expects (N,) class indices for input {log_probs.shape}, got target {target.shape}"
        )
    if target._data.dtype.kind not in "iu":
        raise TypeError(f"nll_loss expects integer class indices, got {target.dtype}")
    n, c = log_probs.shape
    idx = target._data
    if n and (idx.min() < 0 or idx.max() >= c):
        raise IndexError(
            f"Target {int(idx.max() if idx.max() >= c else idx.min())} is out of bounds for {c} classes"
        )
    from .._backend import array_module

    picked = log_probs[array_module(idx).arange(n), idx]
    return _reduce(-picked, reduction)


def cross_entropy(input: Tensor, target: Tensor, reduction: str = "mean", **kwargs: Any) -> Tensor:
    """Softmax cross entropy of logits (N, C) against class indices (N,)."""
    if kwargs:
        raise TypeError(f"cross_entropy: unsupported arguments {sorted(kwargs)}")
    return nll_loss(log_softmax(input, 1), target, reduction)
