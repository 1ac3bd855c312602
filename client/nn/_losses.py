"""Classification losses of ``gradwire.nn.functional``: ``nll_loss`` and ``cross_entropy``.

Both take class indices over (N, C), (N, C, d1, ...) or unbatched (C,) inputs, with PyTorch's
``weight``, ``ignore_index`` and ``reduction``: a weighted mean divides by the total weight of
the targets that were not ignored (NaN when every target is ignored, as PyTorch).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._backend import array_module, on_input_device
from .._tensor import Tensor

__all__ = ["nll_loss", "cross_entropy"]

_REDUCTIONS = ("mean", "sum", "none")


def _reduction(size_average: Any, reduce: Any, reduction: str) -> str:
    """PyTorch's legacy ``size_average`` / ``reduce`` flags, mapped onto ``reduction``."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = ("mean" if size_average else "sum") if reduce else "none"
    if reduction not in _REDUCTIONS:
        raise ValueError(
            f"{reduction} is not a valid value for reduction: use 'mean', 'sum' or 'none'"
        )
    return reduction


def _class_last(input: Tensor) -> Tensor:
    """(N, C, d1, ...) -> (N * d1 * ..., C); (N, C) and (1, C) unchanged."""
    if input.ndim <= 2:
        return input
    perm = (0, *range(2, input.ndim), 1)
    return input.permute(*perm).reshape(-1, input.shape[1])


def _check_target(name: str, input: Tensor, target: Tensor) -> tuple[int, ...]:
    """The shape the unreduced loss takes; clear errors for mismatched targets."""
    if not isinstance(input, Tensor) or not isinstance(target, Tensor):
        raise TypeError(f"{name} expects Tensors for input and target")
    if input.ndim == 0:
        raise ValueError(f"{name} expects (C,), (N, C) or (N, C, d1, ...) input, got a 0-d tensor")
    if target._data.dtype.kind not in "iu":
        raise TypeError(
            f"{name} expects integer class indices as target, got {target.dtype}; "
            "use target.long() (or pass class probabilities of the input's shape to cross_entropy)"
        )
    if input.ndim == 1:
        expected: tuple[int, ...] = ()
    else:
        expected = (input.shape[0], *input.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"{name} expects target of shape {expected} (class indices) for input "
            f"{input.shape}, got target {target.shape}"
        )
    return expected


def _weights(weight: Tensor | None, c: int, like: Any) -> Any:
    if weight is None:
        return None
    if not isinstance(weight, Tensor) or weight.shape != (c,):
        shape = list(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise RuntimeError(
            "weight tensor should be defined either for all "
            f"{c} classes or no classes but got weight tensor of shape: {shape}"
        )
    return weight._data.astype(like.dtype, copy=False)


def _picked(
    name: str, input: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int
) -> tuple[Tensor, Any, Any, tuple[int, ...]]:
    """Per-element -input[n, target[n]] * w[target[n]], the weights, the valid mask, the shape."""
    out_shape = _check_target(name, input, target)
    x = _class_last(input if input.ndim > 1 else input.unsqueeze(0))
    m, c = x.shape
    xp = array_module(x._data)
    t = target._data.reshape(-1)
    valid = t != ignore_index
    safe = xp.where(valid, t, 0)
    if safe.size and (int(safe.min()) < 0 or int(safe.max()) >= c):
        bad = int(safe.max()) if int(safe.max()) >= c else int(safe.min())
        raise IndexError(f"Target {bad} is out of bounds for {c} classes")
    w_all = _weights(weight, c, x._data)
    w = valid.astype(x._data.dtype)
    if w_all is not None:
        w = w * w_all[safe]
    picked = x[xp.arange(m), safe]
    return -picked * Tensor._wrap(w), w, valid, out_shape


def _finish(loss: Tensor, total_weight: Any, reduction: str, out_shape: tuple[int, ...]) -> Tensor:
    if reduction == "none":
        return loss.reshape(out_shape)
    if reduction == "sum":
        return loss.sum()
    with np.errstate(invalid="ignore", divide="ignore"):  # every target ignored: NaN, silently
        return loss.sum() / Tensor._wrap(array_module(total_weight).asarray(total_weight))


@on_input_device
def nll_loss(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
) -> Tensor:
    """Negative log-likelihood of class indices ``target`` under log-probabilities ``input``.

    Args:
        input: (N, C), (N, C, d1, ...) or unbatched (C,) log-probabilities.
        target: (N,), (N, d1, ...) or () integer class indices.
        weight: optional (C,) rescaling weight of each class.
        ignore_index: a target value that contributes neither loss nor weight.
        reduction: 'mean' (weighted mean over the targets), 'sum' or 'none'.

    Returns:
        The loss: a scalar, or of the target's shape for reduction='none'.

    Raises:
        TypeError: for a non-integer target.
        ValueError: for mismatched shapes or an unknown reduction.
        IndexError: for a class index outside [0, C).

    Example:
        >>> F.nll_loss(F.log_softmax(logits, 1), gradwire.tensor([1, 0]))
    """
    reduction = _reduction(size_average, reduce, reduction)
    loss, w, _, out_shape = _picked("nll_loss", input, target, weight, ignore_index)
    return _finish(loss, w.sum(), reduction, out_shape)


def _soft_cross_entropy(
    logp: Tensor, target: Tensor, weight: Tensor | None, reduction: str, smoothing: float
) -> Tensor:
    """Cross entropy against class probabilities of the input's shape."""
    c = logp.shape[1] if logp.ndim > 1 else logp.shape[0]
    x = _class_last(logp if logp.ndim > 1 else logp.unsqueeze(0))
    p = _class_last(target if target.ndim > 1 else target.unsqueeze(0))
    if smoothing:
        p = p * (1 - smoothing) + smoothing / c
    terms = x * p
    w_all = _weights(weight, c, x._data)
    if w_all is not None:
        terms = terms * Tensor._wrap(w_all)
    loss = -terms.sum(1)
    out_shape = () if logp.ndim == 1 else (logp.shape[0], *logp.shape[2:])
    count = loss.shape[0] if logp.ndim > 1 else 1
    return _finish(loss, float(count), reduction, out_shape)


@on_input_device
def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Softmax cross entropy of logits against class indices (or class probabilities).

    Args:
        input: (N, C), (N, C, d1, ...) or unbatched (C,) logits.
        target: class indices of shape (N,), (N, d1, ...) or (); or floating class
            probabilities of the input's shape.
        weight: optional (C,) rescaling weight of each class.
        ignore_index: a target value that contributes neither loss nor weight (indices only).
        reduction: 'mean', 'sum' or 'none'.
        label_smoothing: in [0, 1]: mixes the targets with the uniform distribution.

    Returns:
        The loss: a scalar, or of the target's shape for reduction='none'.

    Raises:
        TypeError, ValueError, IndexError: as :func:`nll_loss`; ValueError for a
            label_smoothing outside [0, 1].

    Example:
        >>> F.cross_entropy(logits, gradwire.tensor([1, 0]), label_smoothing=0.1)
    """
    reduction = _reduction(size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if not isinstance(input, Tensor) or input.ndim == 0:
        raise ValueError("cross_entropy expects (C,), (N, C) or (N, C, d1, ...) logits")
    logp = input.log_softmax(1 if input.ndim > 1 else 0)
    if isinstance(target, Tensor) and target._data.dtype.kind in "fc":
        if target.shape != input.shape:
            raise ValueError(
                f"cross_entropy with class probabilities expects target of the input's shape "
                f"{input.shape}, got {target.shape}"
            )
        return _soft_cross_entropy(logp, target, weight, reduction, label_smoothing)
    loss, w, valid, out_shape = _picked("cross_entropy", logp, target, weight, ignore_index)
    if label_smoothing:
        c = logp.shape[1] if logp.ndim > 1 else logp.shape[0]
        x = _class_last(logp if logp.ndim > 1 else logp.unsqueeze(0))
        w_all = _weights(weight, c, x._data)
        per_class = x * Tensor._wrap(w_all) if w_all is not None else x
        smooth = -per_class.sum(1) * Tensor._wrap(valid.astype(x._data.dtype))
        loss = loss * (1 - label_smoothing) + smooth * (label_smoothing / c)
    return _finish(loss, w.sum(), reduction, out_shape)
