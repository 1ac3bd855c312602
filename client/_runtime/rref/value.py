"""The value slot of an OwnerRRef: a small thread-safe future.

The owner may know an RRef before its value exists (a ForkRequest or a to_here can overtake the
RemoteCall that computes it), so the value is a slot that is filled once, with a value or an
error, and that readers wait on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .errors import RRefProtocolError

__all__ = ["ValueSlot"]

_UNSET: Any = object()


class ValueSlot:
    """Holds an OwnerRRef's value once it is set; ``wait`` blocks until then.

    Example:
        >>> slot = ValueSlot()
        >>> slot.set_value(42)
        >>> slot.wait()
        42
    """

    __slots__ = ("_cond", "_value", "_error", "_callbacks")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[ValueSlot], None]] = []

    def done(self) -> bool:
        """Whether a value or an error was set."""
        with self._cond:
            return self._value is not _UNSET or self._error is not None

    def set_value(self, value: Any) -> None:
        """Fill the slot with ``value``.

        Raises:
            RRefProtocolError: the slot was already filled.
        """
        self._complete(value, None)

    def set_error(self, error: BaseException) -> None:
        """Fill the slot with an error that ``wait`` raises.

        Raises:
            RRefProtocolError: the slot was already filled.
        """
        self._complete(_UNSET, error)

    def wait(self, timeout: float | None = None) -> Any:
        """Return the value, waiting up to ``timeout`` seconds (None: forever).

        Raises:
            TimeoutError: nothing was set in time.
            BaseException: the error that was set.
        """
        with self._cond:
            filled = self._cond.wait_for(
                lambda: self._value is not _UNSET or self._error is not None, timeout
            )
            if not filled:
                raise TimeoutError(f"RRef value not ready after {timeout} seconds")
            if self._error is not None:
                raise self._error
            return self._value

    def add_done_callback(self, fn: Callable[[ValueSlot], None]) -> None:
        """Call ``fn(slot)`` once filled (at once, in this thread, if it already is)."""
        with self._cond:
            if self._value is _UNSET and self._error is None:
                self._callbacks.append(fn)
                return
        fn(self)

    def _complete(self, value: Any, error: BaseException | None) -> None:
        with self._cond:
            if self._value is not _UNSET or self._error is not None:
                raise RRefProtocolError("the RRef value was already set")
            self._value, self._error = value, error
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        # Outside the lock: a callback may read the slot or take other locks.
        for fn in callbacks:
            fn(self)
