"""Futures: the result of ``rpc_async`` and of user code that completes later.

``Future`` is thread-safe. Callbacks run in the thread that completes the future (for RPC futures,
a serving thread of the agent); a callback that raises is logged and does not affect the others.

A thread that blocks in ``Future.wait`` tells the agent's serving pool (through
:func:`blocking_region`) that it is parked, so a handler waiting on a nested call never holds a
serving slot. Outside the agent the hook is a no-op.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from .errors import FuturePicklingError, InvalidFutureStateError, callback_error

__all__ = [
    "Future",
    "collect_all",
    "wait_all",
    "blocking_hook",
    "blocking_region",
    "set_blocking_hook",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
S = TypeVar("S")

_local = threading.local()


def set_blocking_hook(hook: Callable[[], contextlib.AbstractContextManager[Any]] | None) -> None:
    """Install, for the current thread, the context manager entered around blocking waits.

    Args:
        hook: a factory of context managers (the serving pool's ``blocking``), or None to clear.
    """
    _local.hook = hook


def blocking_hook() -> Callable[[], contextlib.AbstractContextManager[Any]] | None:
    """The current thread's blocking hook (None: none)."""
    return getattr(_local, "hook", None)


_NO_POOL = contextlib.nullcontext()


def blocking_region() -> contextlib.AbstractContextManager[Any]:
    """Mark the enclosed code as a blocking wait for the current thread's pool, if any."""
    hook = getattr(_local, "hook", None)
    return _NO_POOL if hook is None else hook()


_PENDING, _RESULT, _ERROR = 0, 1, 2


class Future(Generic[T]):
    """A value that becomes available later, or an exception.

    Example:
        >>> fut = Future()
        >>> fut.then(lambda f: f.value() + 1).add_done_callback(lambda f: None)
        >>> fut.set_result(41)
    """

    __slots__ = ("_lock", "_state", "_value", "_callbacks", "_waiters")

    def __init__(self) -> None:
        # A bare lock and one parked lock per waiting thread (what threading.Condition does
        # inside, without building a Condition for every call's future).
        self._lock = threading.Lock()
        self._state = _PENDING
        self._value: Any = None
        self._callbacks: list[Callable[[Future[T]], Any]] = []
        self._waiters: list[threading.Lock] = []

    def done(self) -> bool:
        """Return True once the future holds a result or an exception."""
        return self._state != _PENDING

    def wait(self, timeout: float | None = None) -> T:
        """Block until the future completes and return its value.

        Args:
            timeout: seconds to wait at most; None waits forever (RPC futures carry their own
                deadline, so they always complete).

        Returns:
            The result.

        Raises:
            The exception the future was completed with; TimeoutError if ``timeout`` expires.
        """
        if self._state == _PENDING:
            with blocking_region():
                if not self._park(timeout):
                    raise TimeoutError(f"future not completed after {timeout} s")
        return self.value()

    def _park(self, timeout: float | None) -> bool:
        """Sleep until the future completes (True) or ``timeout`` seconds pass (False)."""
        with self._lock:
            if self._state != _PENDING:
                return True
            waiter = threading.Lock()
            waiter.acquire()
            self._waiters.append(waiter)
        if waiter.acquire(True, -1 if timeout is None else max(0.0, timeout)):
            return True
        with self._lock:  # timed out: stop waiting, unless it completed meanwhile
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            return self._state != _PENDING

    def value(self) -> T:
        """Return the value of a completed future, or raise its exception.

        Raises:
            InvalidFutureStateError: the future is not done yet (call ``wait()`` first).
        """
        state = self._state
        if state == _RESULT:
            return self._value
        if state == _ERROR:
            raise self._value
        raise InvalidFutureStateError(
            "Future.value() called before the future completed; use wait()"
        )

    def exception(self) -> BaseException | None:
        """Return the exception of a completed future, or None if it holds a result."""
        return self._value if self._state == _ERROR else None

    def set_result(self, result: T) -> None:
        """Complete the future with ``result`` and run its callbacks.

        Raises:
            InvalidFutureStateError: the future was already completed.
        """
        self._complete(_RESULT, result)

    def set_exception(self, exception: BaseException) -> None:
        """Complete the future with ``exception`` and run its callbacks.

        Raises:
            InvalidFutureStateError: the future was already completed.
            TypeError: ``exception`` is not an exception instance.
        """
        if not isinstance(exception, BaseException):
            raise TypeError(f"set_exception needs an exception instance, got {type(exception)!r}")
        self._complete(_ERROR, exception)

    def _complete(self, state: int, value: Any) -> None:
        with self._lock:
            if self._state != _PENDING:
                raise InvalidFutureStateError(
                    "Future can only be marked completed once: it is "
                    "already completed; set_result/set_exception may be called once"
                )
            self._state, self._value = state, value
            callbacks, self._callbacks = self._callbacks, []
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.release()
        for cb in callbacks:
            self._run(cb)

    def _complete_unless_callbacks(self, ok: bool, value: Any) -> bool:
        """Complete with a result (``ok``) or an exception unless callbacks are registered.

        For gradwire's transport threads, which must not run user callbacks: returns False
        (and changes nothing) when a callback would have to run, or the future is done.
        """
        with self._lock:
            if self._state != _PENDING or self._callbacks:
                return False
            self._state, self._value = (_RESULT if ok else _ERROR), value
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.release()
        return True

    def _settle(self, ok: bool, value: Any) -> bool:
        """Complete with a result (``ok``) or an exception, run its callbacks; False (and
        nothing changed) when it is done already (a shutdown failed it meanwhile)."""
        try:
            self._complete(_RESULT if ok else _ERROR, value)
        except InvalidFutureStateError:
            return False
        return True

    def _run(self, cb: Callable[[Future[T]], Any]) -> None:
        try:
            cb(self)
        except Exception:
            log.exception("Future callback %r raised", cb)

    def add_done_callback(self, callback: Callable[[Future[T]], Any]) -> None:
        """Run ``callback(self)`` when the future completes (at once if it already has).

        Args:
            callback: called with this future; exceptions it raises are logged and dropped.
        """
        with self._lock:
            if self._state == _PENDING:
                self._callbacks.append(callback)
                return
        self._run(callback)

    def then(self, callback: Callable[[Future[T]], S]) -> Future[S]:
        """Chain ``callback``: return a Future completed with ``callback(self)``.

        Args:
            callback: called with this (completed) future; what it returns becomes the value of
                the returned future, what it raises becomes its exception (as a RuntimeError
                too, as in PyTorch: ``errors.callback_error``).

        Returns:
            A new Future.

        Raises:
            TypeError: ``callback`` is not callable.
        """
        if not callable(callback):
            raise TypeError(
                "then(): incompatible function arguments. The callback must be callable, "
                f"got {type(callback).__name__}"
            )
        out: Future[S] = Future()

        def chain(fut: Future[T]) -> None:
            try:
                result = callback(fut)
            except BaseException as exc:  # noqa: BLE001 - delivered to the chained future
                out.set_exception(callback_error(exc))
            else:
                out.set_result(result)

        self.add_done_callback(chain)
        return out

    def __reduce__(self) -> Any:
        raise FuturePicklingError(
            "Can not pickle torch.futures.Future: "
            "a gradwire Future cannot be pickled or sent over RPC; send its value "
            "(fut.wait()) or use @rpc.functions.async_execution to return a Future from a callee"
        )

    def __repr__(self) -> str:
        state = {_PENDING: "pending", _RESULT: "result", _ERROR: "error"}[self._state]
        return f"<gradwire.futures.Future {state}>"


def collect_all(futures: Iterable[Future[Any]]) -> Future[list[Future[Any]]]:
    """Return a Future completed with the list of ``futures`` once all of them are done.

    As in PyTorch, the combined future fails at once, with that error, when one of the
    futures fails (the first to fail, in completion order); otherwise its value is the same
    list of (completed) futures.

    Args:
        futures: the futures to gather.

    Returns:
        A Future whose value is the list of futures, or whose error is the first failure.

    Example:
        >>> both = collect_all([rpc.rpc_async("w1", f), rpc.rpc_async("w2", f)])
        >>> [fut.value() for fut in both.wait()]
    """
    items = list(futures)
    out: Future[list[Future[Any]]] = Future()
    remaining = [len(items)]
    lock = threading.Lock()
    if not items:
        out.set_result(items)
        return out

    def one_done(fut: Future[Any]) -> None:
        error = fut.exception()
        with lock:
            if out.done():
                return
            remaining[0] -= 1
            if error is None and remaining[0]:
                return
            if error is not None:
                out.set_exception(error)
            else:
                out.set_result(items)

    for fut in items:
        fut.add_done_callback(one_done)
    return out


def wait_all(futures: Iterable[Future[Any]], timeout: float | None = None) -> list[Any]:
    """Wait for all ``futures`` and return their values in order.

    Args:
        futures: the futures to wait for.
        timeout: seconds to wait at most (None: until every future completes).

    Returns:
        The list of values.

    Raises:
        The first exception among the futures, as soon as it occurs (slow futures are not
        waited for); TimeoutError if ``timeout`` expires.
    """
    items = list(futures)
    collect_all(items).wait(timeout)  # fails with the first error as soon as it occurs
    return [fut.value() for fut in items]
