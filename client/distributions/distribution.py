"""``Distribution``: the base class, with PyTorch's batch and event shapes."""

from __future__ import annotations

from typing import Any, Sequence

from .._tensor import Tensor

__all__ = ["Distribution"]


class Distribution:
    """Base class of distributions: ``sample``, ``log_prob``, ``entropy`` over a batch shape.

    Required to implement: ``sample``, ``log_prob``, ``entropy``; the shapes come from
    ``__init__``.
    """

    has_rsample = False

    def __init__(
        self,
        batch_shape: Sequence[int] = (),
        event_shape: Sequence[int] = (),
        validate_args: bool | None = None,
    ) -> None:
        self._batch_shape = tuple(batch_shape)
        self._event_shape = tuple(event_shape)
        self._validate_args = bool(validate_args)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The shape over which parameters are batched."""
        return self._batch_shape

    @property
    def event_shape(self) -> tuple[int, ...]:
        """The shape of a single sample."""
        return self._event_shape

    def sample(self, sample_shape: Sequence[int] = ()) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement sample()")

    def log_prob(self, value: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement log_prob()")

    def entropy(self) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement entropy()")

    def _extended_shape(self, sample_shape: Sequence[int] = ()) -> tuple[int, ...]:
        return tuple(sample_shape) + self._batch_shape + self._event_shape

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def _args_repr(self, **params: Any) -> str:
        inner = ", ".join(
            f"{k}: {v.size() if isinstance(v, Tensor) else v}" for k, v in params.items()
        )
        return f"{type(self).__name__}({inner})"
