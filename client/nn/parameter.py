"""``Parameter``: a leaf Tensor that a Module registers as trainable."""

from __future__ import annotations

from typing import Any

from .._tensor import Tensor, _rebuild_tensor

__all__ = ["Parameter"]


class Parameter(Tensor):
    """A Tensor that is a module parameter (requires grad by default).

    Example:
        >>> w = gradwire.nn.Parameter(gradwire.randn(3, 2))
    """

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True) -> Parameter:
        if data is None:
            from .._creation import empty

            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter expects a Tensor, got {type(data).__name__}")
        p = cls._wrap(data._data)
        p._vc = data._vc
        if requires_grad:
            p.requires_grad_(True)
        return p  # type: ignore[return-value]

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True) -> None:
        pass  # everything happens in __new__ (Tensor.__init__ would rebuild the data)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_rebuild_tensor, (self._to_host().copy(), self.requires_grad, type(self)))
