"""Grad modes: thread-local switches deciding whether ops are recorded for autograd.

``no_grad`` / ``enable_grad`` / ``set_grad_enabled`` / ``inference_mode`` work as context
managers and as decorators, and each thread has its own state (as in PyTorch).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

__all__ = [
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "inference_mode",
    "is_grad_enabled",
    "is_inference_mode_enabled",
]

F = TypeVar("F", bound=Callable[..., Any])


class _State(threading.local):
    def __init__(self) -> None:
        self.grad_enabled = True
        self.inference = False


_state = _State()


def is_grad_enabled() -> bool:
    """True when ops in this thread are recorded for autograd."""
    return _state.grad_enabled


def is_inference_mode_enabled() -> bool:
    """True inside ``inference_mode()`` in this thread."""
    return _state.inference


class _Mode:
    """Base of the grad-mode context managers; also usable as a decorator."""

    def _enter(self) -> None:
        raise NotImplementedError  # pragma: no cover - each subclass defines it

    def __enter__(self) -> None:
        self._saved = (_state.grad_enabled, _state.inference)
        self._enter()

    def __exit__(self, *exc: object) -> None:
        _state.grad_enabled, _state.inference = self._saved

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.__class__(*self._args()):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def _args(self) -> tuple[Any, ...]:
        return ()


class _NoParamMode(_Mode):
    """A mode that is also a decorator without parentheses (``@gradwire.no_grad``)."""

    def __new__(cls, orig_func: Any = None) -> Any:
        if orig_func is None:
            return super().__new__(cls)
        if not callable(orig_func):
            raise TypeError(f"{cls.__name__}() takes no arguments, got {orig_func!r}")
        return cls()(orig_func)

    def __init__(self, orig_func: Any = None) -> None:
        pass


class no_grad(_NoParamMode):
    """Do not record ops: results have ``requires_grad=False``.

    Example:
        >>> with gradwire.no_grad():
        ...     y = x * 2
    """

    def _enter(self) -> None:
        _state.grad_enabled = False


class enable_grad(_NoParamMode):
    """Record ops again inside a ``no_grad`` block (no effect in inference mode)."""

    def _enter(self) -> None:
        if not _state.inference:
            _state.grad_enabled = True


class set_grad_enabled(_Mode):
    """Turn recording on or off; acts at once when called, and as a context manager."""

    def __init__(self, mode: bool) -> None:
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled expects a bool, got {type(mode).__name__}")
        self.mode = mode
        self._saved = (_state.grad_enabled, _state.inference)
        _state.grad_enabled = mode

    def _enter(self) -> None:
        _state.grad_enabled = self.mode

    def __enter__(self) -> None:
        self._enter()

    def _args(self) -> tuple[Any, ...]:
        return (self.mode,)

    def __call__(self, fn: F) -> F:
        _state.grad_enabled, _state.inference = self._saved  # undo the eager switch
        return super().__call__(fn)


class inference_mode(_Mode):
    """Like ``no_grad``, and tensors made here can never join autograd later.

    Args:
        mode: False makes this a no-op, as in PyTorch.
    """

    def __new__(cls, mode: Any = True) -> Any:
        if callable(mode):  # used bare, as ``@inference_mode``
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True) -> None:
        self.mode = mode

    def _enter(self) -> None:
        if self.mode:
            _state.grad_enabled = False
            _state.inference = True

    def _args(self) -> tuple[Any, ...]:
        return (self.mode,)
