"""``Tensor.multinomial`` / ``gradwire.multinomial``: draw category indices from weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._backend import to_device
from ._tensor import Tensor

__all__ = ["multinomial"]


def _rng() -> Any:
    from . import _creation

    return _creation._rng  # read at call time: manual_seed replaces the generator


def multinomial(
    input: Tensor, num_samples: int, replacement: bool = False, *, generator: Any = None
) -> Tensor:
    """Sample ``num_samples`` category indices from each row of non-negative weights.

    Rows need not sum to one. Without replacement, a category is drawn at most once per row
    (in draw order), which needs at least ``num_samples`` non-zero weights.

    Args:
        input: (K,) or (R, K) non-negative weights.
        num_samples: draws per row.
        replacement: draw with replacement.
        generator: a ``numpy.random.Generator`` to use instead of gradwire's (seeded by
            ``gradwire.manual_seed``).

    Returns:
        An int64 tensor of shape (num_samples,) or (R, num_samples), on the input's device.

    Raises:
        RuntimeError: for a bad shape, a negative, infinite or NaN weight, a row summing to
            zero, or too few categories to draw without replacement.

    Example:
        >>> gradwire.tensor([0.1, 0.0, 0.9]).multinomial(4, replacement=True)
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"multinomial(): input must be a Tensor, not {type(input).__name__}")
    if input.ndim not in (1, 2):
        raise RuntimeError(f"prob_dist must be 1 or 2 dim, got {input.ndim} dims")
    if input._data.dtype.kind != "f":
        raise RuntimeError(
            f"multinomial only supports floating-point dtypes for input, got {input.dtype}"
        )
    n = int(num_samples)
    if n <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    probs = np.asarray(input._to_host(), dtype=np.float64).reshape(-1, input.shape[-1])
    k = probs.shape[1]
    if not replacement and n > k:
        raise RuntimeError(
            f"cannot sample n_sample ({n}) > prob_dist.size(-1) ({k}) samples without replacement"
        )
    if not np.isfinite(probs).all() or (probs < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if (probs.sum(1) <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    rng = generator if generator is not None else _rng()
    if replacement:
        cdf = np.cumsum(probs, axis=1)
        u = rng.random((probs.shape[0], n)) * cdf[:, -1:]
        out = np.stack([np.searchsorted(c, row, side="right") for c, row in zip(cdf, u)])
        out = np.minimum(out, k - 1)
    else:
        if ((probs > 0).sum(1) < n).any():
            raise RuntimeError(
                "invalid multinomial distribution (with replacement=False, not enough "
                "non-negative category to sample)"
            )
        # Exponential races: the order of E_k / p_k is the order of draws without replacement.
        with np.errstate(divide="ignore"):
            keys = rng.standard_exponential(probs.shape) / probs
        out = np.argsort(keys, axis=1, kind="stable")[:, :n]
    out = out.astype(np.int64).reshape(*input.shape[:-1], n)
    return Tensor._wrap(to_device(out, input.device))
