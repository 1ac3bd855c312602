"""Sending RRef messages without holding a thread: gRPC futures, retried with backoff.

A remote() returns at once and its RemoteCall may wait for a long function on the owner, and a
burst of deletes can hold thousands of messages: a blocked thread per message would not scale.
Each attempt is a gRPC future instead; a transient failure (UNAVAILABLE, DEADLINE_EXCEEDED)
schedules the next attempt on the I/O loop after a jittered, doubling pause, until the
deadline, unless the failure detector declared the peer lost. The outcome is handed to the
serving pool (never run on gRPC's callback thread).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import grpc

from ..._proto import worker_pb2 as pb
from ..._wire.exceptions import decode_exception
from ..._wire.framing import Frame, encode_frame
from ...errors import SerializationError
from ..calls.pool import ServingPool
from ..cluster.workers import Peer
from .lane_calls import delivering
from .loop import io_loop
from .retry import TRANSIENT
from .transport import Transport, map_rpc_error

__all__ = ["RetryingSend", "PipeAnswer", "ATTEMPT_SECONDS", "start_control"]

#: Upper bound of one attempt (a RemoteCall retry re-asks for the ack of a call still running).
ATTEMPT_SECONDS = 10.0
_FIRST_PAUSE, _MAX_PAUSE = 0.05, 2.0

#: ``start(timeout, done)``: begin one attempt; ``done(grpc_future)`` when it ends.
Start = Callable[[float, Callable[[Any], None]], None]
#: ``on_done(response, None)`` or ``on_done(None, error)``.
Done = Callable[[Any, BaseException | None], None]


class RetryingSend:
    """One idempotent message: ``start()`` it; ``on_done`` runs on the serving pool once.

    Args:
        pool: the serving pool, where ``on_done`` runs.
        is_lost: whether the failure detector declared a worker (by id) lost: no more retries.
        peer: the destination.
        what: the method name, for errors.
        start: begins one attempt with a timeout (a gRPC future call).
        deadline: ``time.monotonic()`` after which the last error is final.
        on_done: the outcome.
        on_attempt: called before each attempt (WatchControl), or None.
    """

    def __init__(
        self,
        pool: ServingPool,
        is_lost: Callable[[int], bool],
        peer: Peer,
        what: str,
        start: Start,
        deadline: float,
        on_done: Done,
        on_attempt: Callable[[], None] | None = None,
    ) -> None:
        self._pool = pool
        self._is_lost = is_lost
        self._peer = peer
        self._what = what
        self._start = start
        self._deadline = deadline
        self._on_done = on_done
        self._on_attempt = on_attempt
        self._started = time.monotonic()
        self._pause = _FIRST_PAUSE

    def start(self) -> None:
        """Send the first attempt (non-blocking)."""
        self._attempt()

    def _attempt(self) -> None:
        left = self._deadline - time.monotonic()
        if self._on_attempt is not None:
            self._on_attempt()
        try:
            self._start(max(0.001, min(ATTEMPT_SECONDS, left)), self._settled)
        except BaseException as exc:  # noqa: BLE001 - e.g. the transport is closed
            self._finish(None, exc)

    def _settled(self, gfut: Any) -> None:
        # On gRPC's callback thread: decide, never run the outcome here.
        exc = gfut.exception()
        if exc is None:
            self._finish(gfut.result(), None)
            return
        if isinstance(exc, grpc.RpcError):
            budget = self._deadline - self._started  # what the message had, over its attempts
            exc = map_rpc_error(exc, self._peer.name, self._what, self._started, budget)
        left = self._deadline - time.monotonic()
        lost = self._is_lost(self._peer.id)
        if isinstance(exc, TRANSIENT) and left > 0 and not lost:
            pause = min(random.uniform(0, self._pause), left)
            self._pause = min(_MAX_PAUSE, self._pause * 2)
            loop = io_loop()
            loop.call_soon_threadsafe(loop.call_later, pause, self._attempt)
            return
        self._finish(None, exc)

    def _finish(self, response: Any, error: BaseException | None) -> None:
        if delivering():  # on a thread of the bulk lane's own, not gRPC's: no hand-off
            self._on_done(response, error)
            return
        try:
            self._pool.run(self._on_done, response, error)
        except RuntimeError:  # pool closed: the agent is stopping
            self._on_done(response, error)


class PipeAnswer:
    """A message answered on the call pipe, handed to ``RetryingSend`` as a settled gRPC future
    would be: what ``take`` finds in the reply header (None: the reply carries no answer), or
    the error (a gRPC error of the pipe, or the exception the peer answered with instead,
    which keeps its type: an unavailable peer is retried).

    Args:
        me: this worker's context (policy and name, to rebuild a remote exception).
        settled: ``RetryingSend``'s callback.
        take: the answer in a reply header without an error.
        what: the message, for the error of a reply without an answer.
    """

    def __init__(
        self,
        me: Any,
        settled: Callable[[Any], None],
        take: Callable[[pb.ReplyHeader], Any],
        what: str,
    ) -> None:
        self._me = me
        self._settled = settled
        self._take = take
        self._what = what
        self._answer: Any = None
        self._error: BaseException | None = None

    def done(self, frame: Frame | None, error: grpc.RpcError | None) -> None:
        """The pipe's callback: the reply frame, or the pipe's error."""
        if frame is None:
            self._error = error
        elif frame.header.reply.HasField("error"):
            self._error = decode_exception(frame.header.reply.error, self._me.policy, self._me.name)
        else:
            try:
                self._answer = self._take(frame.header.reply)
            except Exception as exc:  # noqa: BLE001 - a malformed answer fails the message
                self._error = SerializationError(f"{self._what} on the call pipe: {exc}")
            if self._answer is None and self._error is None:
                self._error = SerializationError(f"{self._what} on the call pipe carries no answer")
        self._settled(self)

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        return self._answer


def start_control(
    transport: Transport,
    me: Any,
    peer: Peer,
    message_id: int,
    method: str,
    request: bytes,
    response_cls: Any,
    seconds: float,
    settled: Callable[[Any], None],
    quick: bool = False,
) -> None:
    """One attempt of the control message ``method`` (its serialized ``request``) to ``peer``,
    as a frame sent from this thread: on its bulk lane or a call stream of its fast lane
    (``quick``: its answer comes at once, so on the lane it may wait parked for the next call
    to ``peer``), else on its call pipe. A gRPC future of its own would start grpcio's
    "channel spin" thread whenever that channel has no other call in flight."""
    control = pb.ControlRequest(message_id=message_id, method=method, request=request)
    encoded = encode_frame(Frame(pb.FrameHeader(control=control, last=True), ()))
    answer = PipeAnswer(me, settled, lambda r: response_cls.FromString(r.control_response), method)
    if peer.call_dial != peer.dial and transport.stream_call(
        peer.call_dial, encoded, seconds, answer.done, peer, quick=quick
    ):
        return
    transport.pipe_call(peer.dial, message_id, encoded, seconds, answer.done)
