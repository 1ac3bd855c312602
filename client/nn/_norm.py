"""Normalisation of ``gradwire.nn.functional``: ``batch_norm`` and ``layer_norm``.

Built from differentiable tensor ops, so gradients (and gradients of gradients) come from the
ops' own backward formulas.
"""

from __future__ import annotations

from typing import Any, Sequence

from .._backend import on_input_device
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad

__all__ = ["batch_norm", "layer_norm"]


def _per_channel(t: Tensor, ndim: int) -> Tensor:
    """A (C,) tensor shaped (1, C, 1, ...) to broadcast against an ndim-d input."""
    return t.reshape(1, -1, *([1] * (ndim - 2)))


def _update_running(running: Tensor, value: Tensor, momentum: float) -> None:
    with no_grad():
        running.mul_(1 - momentum).add_(value.detach().to(dtype=running.dtype), alpha=momentum)


@on_input_device
def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise each channel (dim 1) of an (N, C, ...) input.

    In training, the batch statistics normalise (biased variance) and the running
    statistics, when given, move toward them by ``momentum`` (unbiased variance). Otherwise the
    running statistics normalise.

    Args:
        input: (N, C) or (N, C, *) tensor.
        running_mean, running_var: (C,) running statistics, updated in place in training.
        weight, bias: optional (C,) affine parameters.
        training: use (and record) batch statistics.
        momentum: weight of the new batch statistics in the running ones.
        eps: added to the variance for stability.

    Returns:
        A tensor of the input's shape.

    Raises:
        ValueError: in training with a single value per channel.
        RuntimeError: when not training and the running statistics are missing.

    Example:
        >>> y = F.batch_norm(x, rm, rv, training=True)
    """
    if input.ndim < 2:
        raise ValueError(f"batch_norm expects an (N, C, *) input, got shape {input.shape}")
    nd = input.ndim
    axes = (0, *range(2, nd))
    if training:
        count = input.numel() // input.shape[1]
        if count <= 1:
            raise ValueError(
                "Expected more than 1 value per channel when training, got input size "
                f"{list(input.shape)}"
            )
        mean = input.mean(axes, keepdim=True)
        centered = input - mean
        var = (centered * centered).mean(axes, keepdim=True)
        if running_mean is not None:
            _update_running(running_mean, mean.reshape(-1), momentum)
        if running_var is not None:
            _update_running(running_var, var.reshape(-1) * (count / (count - 1)), momentum)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError(
                "batch_norm: running_mean and running_var are needed when training=False"
            )
        centered = input - _per_channel(running_mean, nd)
        var = _per_channel(running_var, nd)
    out = centered / (var + eps).sqrt()
    if weight is not None:
        out = out * _per_channel(weight, nd)
    if bias is not None:
        out = out + _per_channel(bias, nd)
    return out


@on_input_device
def layer_norm(
    input: Tensor,
    normalized_shape: Sequence[int] | int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise over the last ``len(normalized_shape)`` dimensions (biased variance).

    Args:
        input: a tensor whose trailing dimensions equal ``normalized_shape``.
        normalized_shape: the trailing shape to normalise over.
        weight, bias: optional affine parameters of shape ``normalized_shape``.
        eps: added to the variance for stability.

    Returns:
        A tensor of the input's shape.

    Raises:
        RuntimeError: when the input's trailing shape is not ``normalized_shape``.

    Example:
        >>> y = F.layer_norm(x, (16,))
    """
    shape = _as_shape(normalized_shape)
    k = len(shape)
    if k == 0 or tuple(input.shape[input.ndim - k :]) != shape or input.ndim < k:
        raise RuntimeError(
            f"Given normalized_shape={list(shape)}, expected input with shape "
            f"[*, {', '.join(map(str, shape))}], but got input of size{list(input.shape)}"
        )
    axes = tuple(range(input.ndim - k, input.ndim))
    mean = input.mean(axes, keepdim=True)
    centered = input - mean
    var = (centered * centered).mean(axes, keepdim=True)
    out = centered / (var + eps).sqrt()
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _as_shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(s) for s in shape)
