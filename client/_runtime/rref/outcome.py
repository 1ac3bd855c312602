"""Outcomes of RRef creation: a stored error (``Failure``) and a remote() in progress
(``Creation``)."""

from __future__ import annotations

import time
import traceback
from typing import Any

from ...errors import RpcTimeoutError
from ...futures import Future

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
            getattr(error, "add_note", lambda note: None)(f"original traceback:\n{text}")
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

    __slots__ = ("future", "what", "timeout", "deadline")

    def __init__(self, what: str, timeout: float | None) -> None:
        #: Completed with None (created) or a Failure (the creation error).
        self.future: Future[Failure | None] = Future()
        self.what = what
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

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
