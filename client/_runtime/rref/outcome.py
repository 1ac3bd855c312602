"""Outcomes of RRef creation: a stored error (``Failure``) and a remote() in progress
(``Creation``)."""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from ..._compat import add_note
from ...errors import InvalidFutureStateError, RpcTimeoutError
from ...futures import Future

if TYPE_CHECKING:
    from ..transport.lane_calls import Parked

__all__ = ["Failure", "outcome", "Creation"]


class Failure:
    """An error kept as an OwnerRRef's value or as a remote()'s outcome.

    Raising one stored exception object again and again would chain every reader's frames to
    its traceback, and those frames (holding RRefs) would stay alive as long as the value. So
    the original's traceback is kept as text (a note) and each reader raises a fresh copy.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        if error.__traceback__ is not None:
            text = "".join(traceback.format_exception(error)).rstrip()
            error.__traceback__ = error.__context__ = error.__cause__ = None
            add_note(error, f"original traceback:\n{text}")
        self.error = error

    def fresh(self) -> BaseException:
        """A copy of the error (same type, args and attributes), to raise."""
        exc = self.error
        try:
            new = type(exc).__new__(type(exc), *exc.args)
            new.args = exc.args
            new.__dict__.update(exc.__dict__)
        except Exception:  # an exception type that cannot be copied: raise the original
            return exc
        return new


def outcome(value: Any) -> Any:
    """``value`` itself, or raise (a fresh copy of) the error it stands for."""
    if isinstance(value, Failure):
        raise value.fresh()
    return value


class Creation:
    """The caller's view of one remote(): done when the RemoteAck arrived (or it failed).

    Args:
        what: ``"remote(mod:fn) on worker 'w1'"``, for error messages.
        timeout: the remote()'s timeout in seconds (None: none).
    """

    __slots__ = ("future", "what", "timeout", "deadline", "parked")

    def __init__(self, what: str, timeout: float | None) -> None:
        #: Completed with None (created) or a Failure (the creation error).
        self.future: Future[Failure | None] = Future()
        self.what = what
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        #: The RemoteCall's answer left parked on its bulk-lane connection (``Parked``), for
        #: the first to_here() to claim: its fetch goes right behind it (None: none is).
        self.parked: Parked | None = None

    def park(self, parked: Parked) -> None:
        self.parked = parked

    def take_parked(self) -> Parked | None:
        """The parked RemoteCall's answer, once (a later fetch goes its own way)."""
        parked, self.parked = self.parked, None
        return parked

    def timed_out(self) -> RpcTimeoutError:
        return RpcTimeoutError(
            f"RRef creation timed out: {self.what} did not complete within its timeout of "
            f"{self.timeout} s",
            self.what,
            self.timeout or 0.0,
        )

    def time_left(self) -> float | None:
        """Seconds until the creation deadline (None: no deadline)."""
        return None if self.deadline is None else max(0.001, self.deadline - time.monotonic())

    def settle_late(self) -> None:
        """The RemoteAck came after the deadline: the creation failed, as in PyTorch (its
        timeout error stays the RRef's error even though the owner created the value)."""
        self.future.set_result(Failure(self.timed_out()))

    def past_deadline(self) -> bool:
        """Whether the remote()'s timeout has expired."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def answered(self) -> Future[None]:
        """A Future completed with None once created, or with the creation error (when the
        RemoteAck arrived, or delivery gave up); unlike ``as_future``, no timer."""
        out: Future[None] = Future()

        def created(fut: Future[Failure | None]) -> None:
            failure = fut.value()
            if failure is None:
                out.set_result(None)
            else:
                out.set_exception(failure.fresh())

        self.future.add_done_callback(created)
        return out

    def as_future(self) -> Future[None]:
        """A Future of the creation (``RRef._get_future``): None once created, else the
        creation error, or RpcTimeoutError as soon as the deadline passes without an answer."""
        out: Future[None] = Future()

        def settle(error: BaseException | None) -> None:
            with contextlib.suppress(InvalidFutureStateError):
                if error is None:
                    out.set_result(None)
                else:
                    out.set_exception(error)

        def created(fut: Future[Failure | None]) -> None:
            failure = fut.value()
            settle(None if failure is None else failure.fresh())

        self.future.add_done_callback(created)
        left = self.time_left()
        if left is not None and not out.done():
            timer = threading.Timer(left, lambda: settle(self.timed_out()))
            timer.daemon = True
            timer.start()
            out.add_done_callback(lambda _: timer.cancel())
        return out

    def check(self) -> bool:
        """Raise the creation error if there is one; return True once created.

        Raises:
            The creation error (the original exception type), or RpcTimeoutError "RRef
            creation timed out" once the remote()'s deadline passed without an answer.
        """
        if self.future.done():
            outcome(self.future.value())
            return True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise self.timed_out()
        return False
