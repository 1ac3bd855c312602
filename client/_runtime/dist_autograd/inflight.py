"""The calls of one distributed autograd context that are still in flight.

A call that sends tensors requiring grad records its send function when it leaves, but the
reply's recv function only when the answer arrives (a remote()'s RemoteAck, an rpc's reply). A
pass started in between would not know the reply pair, so it would never tell the callee of the
pass: the callee's recv function would never run, the caller's send function would never get
its gradient, and the pass would finish with the gradients behind it silently missing. So each
worker, before it starts or joins a pass, waits for the answers of such calls of its context
still in flight, each within the call's own deadline. Such a call that failed or timed out fails
every pass of its context instead, naming the call: its send function can never be released.

Calls that sent no tensor requiring grad are not tracked: no send function of this worker
waits on them, and a pass must not wait for a call that itself waits for the pass (the call
that runs ``RRef.backward`` on the owner).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ...errors import RpcError, RpcTimeoutError
from ...futures import Future

__all__ = ["Call", "CallsInFlight"]

#: Seconds past a call's deadline before the pass gives up on it (an rpc's own timeout error is
#: raised by the transport at the deadline and normally arrives first).
_GRACE = 1.0


@dataclass(eq=False)
class Call:
    """One call that sent tensors requiring grad in a context.

    Attributes:
        what: ``"rpc to mod:fn on worker 'w1'"``, for error messages.
        done: completes (after the reply's recv function is recorded) once the answer arrived,
            or with the call's error.
        timeout: the call's timeout in seconds (None: none).
        deadline: ``time.monotonic()`` when the call times out (None: never).
    """

    what: str
    done: Future[Any]
    timeout: float | None
    deadline: float | None


class CallsInFlight:
    """The tracked calls of one context whose answer is outstanding, and those that failed."""

    def __init__(self, context_id: int) -> None:
        self.context_id = context_id
        self._lock = threading.Lock()
        self._pending: set[Call] = set()
        self._failed: list[tuple[Call, BaseException]] = []

    def add(self, call: Call) -> None:
        """Track ``call`` until it is answered (for the context's lifetime if it fails)."""
        with self._lock:
            self._pending.add(call)
        call.done.add_done_callback(lambda f: self._settled(call, f.exception()))

    def _settled(self, call: Call, error: BaseException | None) -> None:
        with self._lock:
            self._pending.discard(call)
            if error is not None:
                self._failed.append((call, error))

    def wait(self) -> None:
        """Return once every call tracked now is answered; at once when none is pending (the
        common case).

        Raises:
            RpcTimeoutError: a call was not answered by its deadline, or timed out.
            RpcError: a call failed (chained to its error).
        """
        with self._lock:
            if not self._pending and not self._failed:
                return
            pending, failed = list(self._pending), list(self._failed)
        for call, error in failed:
            raise self._failure(call, error) from error
        for call in pending:
            left = None if call.deadline is None else call.deadline + _GRACE - time.monotonic()
            try:
                call.done.wait(None if left is None else max(0.0, left))
            except BaseException as exc:  # noqa: BLE001 - the call's error, or our timeout
                if call.done.done():
                    raise self._failure(call, exc) from exc
                raise RpcTimeoutError(
                    f"{self._head(call)} got no answer within its timeout of {call.timeout} s, "
                    "so the pass cannot reach the worker that holds the gradients of its tensors",
                    call.what,
                    call.timeout or 0.0,
                ) from None

    def _head(self, call: Call) -> str:
        return f"distributed backward in context {self.context_id}: {call.what}"

    def _failure(self, call: Call, error: BaseException) -> RpcError:
        text = (
            f"{self._head(call)} failed, so the gradients of the tensors it sent cannot be "
            f"computed: {type(error).__name__}: {error}"
        )
        if isinstance(error, RpcTimeoutError):
            return RpcTimeoutError(text, call.what, call.timeout or 0.0)
        return RpcError(text)
