"""``@async_execution``: a remote function that returns a Future instead of a value."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ..._runtime.calls.callee import ASYNC_EXECUTION_ATTR

__all__ = ["async_execution"]

F = TypeVar("F", bound=Callable[..., Any])


def async_execution(fn: F) -> F:
    """Mark ``fn`` so that, when called through RPC, the reply waits for the Future it returns.

    No serving thread is held while the Future is pending, so a function that chains further
    RPCs (``rpc_async(...).then(...)``) costs no thread per call. Works with static and class
    methods in either decorator order.

    Args:
        fn: a function returning a ``gradwire.futures.Future``.

    Returns:
        ``fn``, marked (the same object for static and class methods).

    Example:
        >>> @rpc.functions.async_execution
        ... def add_later(to, x):
        ...     return rpc.rpc_async(to, operator.add, (x, 1)).then(lambda f: f.value() * 2)
    """
    if isinstance(fn, (staticmethod, classmethod)):
        setattr(fn.__func__, ASYNC_EXECUTION_ATTR, True)
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    setattr(wrapper, ASYNC_EXECUTION_ATTR, True)
    return wrapper  # type: ignore[return-value]
