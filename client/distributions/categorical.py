"""``Categorical``: a distribution over category indices 0 .. K-1."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .._backend import array_module
from .._sampling import multinomial
from .._tensor import Tensor
from ..autograd.grad_mode import no_grad
from .distribution import Distribution

__all__ = ["Categorical"]


class Categorical(Distribution):
    """Categorical distribution given by ``probs`` or ``logits`` over the last dimension.

    ``probs`` need only be non-negative (they are normalised); ``logits`` are unnormalised
    log-probabilities. ``log_prob`` and ``entropy`` are differentiable in the parameters.

    Args:
        probs: (..., K) non-negative weights.
        logits: (..., K) unnormalised log-probabilities (exactly one of the two).
        validate_args: check sample values given to ``log_prob``.

    Raises:
        ValueError: unless exactly one of probs and logits is given, or for a 0-d parameter.

    Example:
        >>> m = Categorical(probs=gradwire.tensor([0.25, 0.25, 0.5]))
        >>> a = m.sample()            # 0, 1 or 2
        >>> m.log_prob(a), m.entropy()
    """

    def __init__(
        self,
        probs: Tensor | None = None,
        logits: Tensor | None = None,
        validate_args: bool | None = None,
    ) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        param = probs if probs is not None else logits
        if not isinstance(param, Tensor):
            raise TypeError(f"Categorical expects a Tensor, got {type(param).__name__}")
        if param.ndim < 1:
            raise ValueError("`probs` (or `logits`) parameter must be at least one-dimensional.")
        if probs is not None:
            self._probs: Tensor | None = probs / probs.sum(-1, keepdim=True)
            self._logits: Tensor | None = None
        else:
            assert logits is not None
            self._logits = logits - _logsumexp(logits)
            self._probs = None
        self._num_events = param.shape[-1]
        super().__init__(param.shape[:-1], (), validate_args)

    @property
    def probs(self) -> Tensor:
        """Normalised probabilities, (..., K)."""
        if self._probs is None:
            assert self._logits is not None
            self._probs = self._logits.softmax(-1)
        return self._probs

    @property
    def logits(self) -> Tensor:
        """Normalised log-probabilities, (..., K)."""
        if self._logits is None:
            assert self._probs is not None
            eps = float(np.finfo(self._probs._data.dtype).eps)
            self._logits = self._probs.clamp(eps, 1 - eps).log()
        return self._logits

    @property
    def param_shape(self) -> tuple[int, ...]:
        return (*self.batch_shape, self._num_events)

    @property
    def mean(self) -> Tensor:
        raise NotImplementedError("Categorical has no mean (its support is unordered)")

    @property
    def mode(self) -> Tensor:
        """The most likely category of each distribution in the batch."""
        return self.probs.argmax(-1)

    def sample(self, sample_shape: Sequence[int] = ()) -> Tensor:
        """Draw category indices of shape ``sample_shape + batch_shape`` (int64, no grad)."""
        shape = tuple(int(s) for s in sample_shape)
        n = int(np.prod(shape)) if shape else 1
        with no_grad():
            flat = self.probs.detach().reshape(-1, self._num_events)
            draws = multinomial(flat, n, replacement=True)  # (B, n)
        return draws.t().reshape(*shape, *self.batch_shape)

    def log_prob(self, value: Tensor) -> Tensor:
        """Log-probability of the category indices ``value`` (broadcast with batch_shape).

        Raises:
            ValueError: with ``validate_args`` for values outside 0 .. K-1.
        """
        if not isinstance(value, Tensor):
            value = Tensor(value)
        v = value._data
        if self._validate_args and (
            v.dtype.kind not in "iuf" or (v.size and (v.min() < 0 or v.max() >= self._num_events))
        ):
            raise ValueError(
                f"Expected value argument to be within the support (0 .. {self._num_events - 1})"
                f" of Categorical, got {value}"
            )
        shape = np.broadcast_shapes(tuple(v.shape), self.batch_shape)
        logits = self.logits.expand(*shape, self._num_events).reshape(-1, self._num_events)
        xp = array_module(v)
        idx = xp.broadcast_to(v.astype(np.int64, copy=False), shape).reshape(-1)
        return logits[xp.arange(idx.shape[0]), idx].reshape(*shape)

    def entropy(self) -> Tensor:
        """-sum p log p over the categories, of shape batch_shape."""
        logits = self.logits
        finfo_min = float(np.finfo(logits._data.dtype).min)
        return -(logits.clamp(min=finfo_min) * self.probs).sum(-1)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """The values 0 .. K-1, shaped (K, *batch_shape) when ``expand``."""
        from .._creation import arange

        values = arange(self._num_events, dtype=np.int64).reshape(
            -1, *([1] * len(self.batch_shape))
        )
        return values.expand(self._num_events, *self.batch_shape) if expand else values

    def __repr__(self) -> str:
        if self._probs is not None:
            return self._args_repr(probs=self._probs)
        return self._args_repr(logits=self._logits)


def _logsumexp(x: Tensor) -> Tensor:
    m = Tensor._wrap(x._data.max(axis=-1, keepdims=True))
    return (x - m).exp().sum(-1, keepdim=True).log() + m
