"""rpc_sync over long-lived CallStream streams: one message each way per call.

A unary gRPC call pays for opening and closing a call on both sides (metadata, status, the
server's per-call setup); on an open bidirectional stream a call is one request message and one
reply message. Measured on the 2-core development machine with raw grpcio (a synchronous server,
echo of 60 bytes over a Unix socket): ~350 us per exchange on an open stream against ~700-750 us
for a unary call.

Each address has a small set of streams (``Streams``); a blocking call takes an idle one (or
opens one, up to ``limit``), sends its frame, reads the one reply and gives the stream back.
One call at a time per stream, so replies need no ids and the caller's own thread reads its
reply. When every stream is busy and the limit is reached the call returns None and the caller
uses a unary call instead: nothing waits for a stream.

A gRPC stream has one deadline for its whole life, and the wait for a reply on the call's
completion queue has none of its own, so each call's deadline is kept by the ``Watchdog``: one
thread per transport that cancels a stream whose call is past its deadline; the call then fails
with DEADLINE_EXCEEDED like a unary call would, and the stream is discarded. A stream that fails
in any way is discarded; the next call opens a new one.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Protocol

import grpc

from ... import _traffic
from ..._wire.framing import Frame, decode_frame, encode_frame

__all__ = [
    "Streams",
    "Watchdog",
    "StreamFailed",
    "CORE_CALL_API",
    "open_core_call",
    "status_failure",
]


def _core_call_api() -> Any:
    """grpcio's internal core call API (``grpc._cython.cygrpc``), or None when this grpcio
    release lacks a piece ``_CoreStream`` uses (then streams use the public API)."""
    try:
        from grpc import _common
        from grpc._cython import cygrpc
    except ImportError:
        return None
    needed = (
        (cygrpc, "PropagationConstants"),
        (cygrpc, "SendInitialMetadataOperation"),
        (cygrpc, "ReceiveInitialMetadataOperation"),
        (cygrpc, "ReceiveStatusOnClientOperation"),
        (cygrpc, "SendMessageOperation"),
        (cygrpc, "ReceiveMessageOperation"),
        (cygrpc, "SendCloseFromClientOperation"),
        (cygrpc, "OperationType"),
        (cygrpc, "StatusCode"),
        (cygrpc, "build_census_context"),
        (getattr(cygrpc, "Channel", None), "segregated_call"),
        (_common, "CYGRPC_STATUS_CODE_TO_STATUS_CODE"),
        (_common, "decode"),
    )
    if not all(owner is not None and hasattr(owner, name) for owner, name in needed):
        return None
    if not hasattr(cygrpc.OperationType, "receive_message") or not hasattr(
        cygrpc.StatusCode, "cancelled"
    ):
        return None
    return cygrpc


cygrpc = _core_call_api()
if cygrpc is not None:
    from grpc import _common

    _CANCELLED = cygrpc.StatusCode.cancelled

#: Whether call streams are driven through grpcio's core call API (checked once, at import);
#: otherwise through its public streaming API (``_PublicStream``), slower by a thread hand-off.
CORE_CALL_API = cygrpc is not None

log = logging.getLogger(__name__)
# Completion tags of a core call's operations (a stream's, a pipe's).
SENT_METADATA, METADATA, STATUS, _EXCHANGE = object(), object(), object(), object()


class StreamFailed(grpc.RpcError):
    """A stream call that failed without a gRPC status of its own (its deadline passed and the
    watchdog cancelled it, or the server ended the stream): carries the status a unary call
    would have got, for ``map_rpc_error``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def status_failure(event: Any, ended: str) -> StreamFailed:
    """The StreamFailed of a core call's status event: its code and details, or UNAVAILABLE
    with ``ended`` when the peer ended the call with OK (a stream call never should)."""
    op = event.batch_operations[0]
    code = _common.CYGRPC_STATUS_CODE_TO_STATUS_CODE.get(op.code(), grpc.StatusCode.UNKNOWN)
    if code == grpc.StatusCode.OK:
        return StreamFailed(grpc.StatusCode.UNAVAILABLE, ended)
    return StreamFailed(code, _common.decode(op.details()) or "")


def open_core_call(core_channel: Any, method: bytes, metadata: Any, *first: Any) -> Any:
    """A core call (``segregated_call``: its own completion queue, driven from the threads
    that use it) of ``method`` on ``core_channel``, opened with ``metadata`` and the call's
    outstanding receives (initial metadata, status), plus the ``(operations, tag)`` batches
    of ``first``. The status batch completes last; the call and its queue go after it."""
    return core_channel.segregated_call(
        cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS,
        method,
        None,  # host
        None,  # no deadline for the stream: each call's is kept by the Watchdog
        metadata,
        None,  # call credentials
        (
            ((cygrpc.SendInitialMetadataOperation(metadata, 0),), SENT_METADATA),
            ((cygrpc.ReceiveInitialMetadataOperation(0),), METADATA),
            # Outstanding for the stream's whole life: it ends the stream's events.
            ((cygrpc.ReceiveStatusOnClientOperation(0),), STATUS),
            *first,
        ),
        cygrpc.build_census_context(),
        None,  # registered call handle
    )


class _CoreStream:
    """One open CallStream, driven from the calling thread through gRPC core's call API.

    grpcio's public streaming API feeds requests from an iterator on a thread of its own and
    hands replies over from its channel thread: two thread switches per exchange, measured at
    ~100-150 us of a ~400 us exchange here. A core call with its own completion queue (what
    grpcio's blocking unary calls use) lets the calling thread send, then sleep in the queue
    until the reply is there. That API is grpcio's internal one (``grpc._cython.cygrpc``);
    grpcio is pinned to one release (pyproject.toml), and ``Streams`` falls back to unary calls
    if it is not there.
    """

    __slots__ = ("_call", "_due", "expired", "idle_since", "stuck")

    def __init__(
        self, channel: Any, method: bytes, metadata: Any, stuck: Callable[[], None] | None = None
    ) -> None:
        self.expired = False
        self.idle_since = 0.0
        #: what to do when a cancellation does not end this call (close its connection)
        self.stuck = stuck
        self._due = {SENT_METADATA, METADATA, STATUS}
        self._call = open_core_call(channel, method, metadata)

    def exchange(self, request: bytes) -> bytes:
        """Send ``request``, return the reply; raises StreamFailed when the stream ends."""
        self.send(request)
        return self.receive()

    def send(self, request: bytes) -> None:
        """Start sending ``request`` and receiving its reply (returns at once; ``receive``,
        from any one thread, takes the reply). Raises StreamFailed when the stream ended."""
        if not self._call.operate(
            (cygrpc.SendMessageOperation(request, 0), cygrpc.ReceiveMessageOperation(0)), _EXCHANGE
        ):  # gRPC did not start it: the call is over
            self.close()
            raise StreamFailed(grpc.StatusCode.UNAVAILABLE, "the call stream has ended")
        self._due.add(_EXCHANGE)

    def receive(self) -> bytes:
        """The reply of the request ``send`` started; raises StreamFailed when the stream
        ends first."""
        call = self._call
        failure: StreamFailed | None = None
        while True:
            event = call.next_event()
            self._due.discard(event.tag)
            if event.tag is _EXCHANGE:
                reply = None
                if event.success:
                    for op in event.batch_operations:
                        if op.type() == cygrpc.OperationType.receive_message:
                            reply = op.message()
                if reply is not None:
                    return reply
            elif event.tag is STATUS:
                failure = status_failure(event, "the peer ended the call stream")
            if _EXCHANGE not in self._due and failure is not None:
                self._drain()
                raise failure

    def cancel(self) -> bool:
        """Cancel the call (from any thread; the thread in ``exchange`` sees it fail); whether
        gRPC took the cancellation."""
        try:
            self._call.cancel(_CANCELLED, "call stream closed")
        except Exception:  # noqa: BLE001 - the channel may be closed already
            return False
        return True

    def close(self) -> None:
        """Cancel the call and take its last events (its completion queue then goes away);
        only from the thread that holds the stream."""
        if self.cancel():
            try:
                self._drain()
            except Exception:  # noqa: BLE001 - the channel may be closed already
                pass

    def _drain(self) -> None:
        while self._due:
            self._due.discard(self._call.next_event().tag)


_END = object()  # ends a _PublicStream's request iterator


class _PublicStream:
    """One open CallStream over grpcio's public streaming API: the fallback of ``_CoreStream``
    for grpcio releases without the core call API. grpcio reads the requests from an iterator
    on a thread of its own, so each exchange costs that thread's hand-offs (~100-150 us here).
    Same interface and failures as ``_CoreStream``."""

    __slots__ = ("_call", "_requests", "expired", "idle_since")

    def __init__(self, channel: grpc.Channel, method: str, metadata: Any) -> None:
        self.expired = False
        self.idle_since = 0.0
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        stub = channel.stream_stream(method)  # bytes in, bytes out
        self._call = stub(iter(self._requests.get, _END), metadata=metadata)

    def exchange(self, request: bytes) -> bytes:
        """Send ``request``, return the reply; raises StreamFailed when the stream ends."""
        self._requests.put(request)
        try:
            return next(self._call)
        except StopIteration:
            raise StreamFailed(
                grpc.StatusCode.UNAVAILABLE, "the peer ended the call stream"
            ) from None
        except grpc.RpcError as exc:
            raise StreamFailed(exc.code(), exc.details() or "") from None

    def cancel(self) -> bool:
        """Cancel the call (from any thread); whether gRPC took the cancellation."""
        try:
            return bool(self._call.cancel())
        except Exception:  # noqa: BLE001 - the channel may be closed already
            return False

    def close(self) -> None:
        """End the request iterator and cancel the call."""
        self._requests.put(_END)
        self.cancel()


_Stream = _CoreStream | _PublicStream


class Watched(Protocol):
    """What the watchdog watches: a stream, or one call of a call pipe."""

    expired: bool

    def cancel(self) -> object: ...


class Watchdog:
    """Cancels streams (and call-pipe calls) whose call is past its deadline (one thread,
    started at the first call with a deadline, sleeping until the nearest deadline)."""

    def __init__(self, name: str = "gradwire-deadlines") -> None:
        self._cond = threading.Condition(threading.Lock())
        self._armed: dict[Watched, float] = {}
        #: streams cancelled at their deadline -> when, if still not ended, their connection
        #: counts as stuck (``STUCK_SECONDS`` later)
        self._cancelled: dict[Watched, float] = {}
        self._wake_at = math.inf
        self._thread: threading.Thread | None = None
        self._closed = False
        self._name = name

    def arm(self, stream: Watched, deadline: float) -> None:
        with self._cond:
            self._armed[stream] = deadline
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            if deadline < self._wake_at:
                self._wake_at = deadline
                self._cond.notify()

    def disarm(self, stream: Watched) -> bool:
        """Stop watching ``stream``; whether its deadline passed (it was cancelled)."""
        with self._cond:
            self._armed.pop(stream, None)
            self._cancelled.pop(stream, None)
            return stream.expired

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            expired: list[Watched] = []
            stuck: list[Watched] = []
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                nearest = math.inf
                for stream, deadline in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[stream]
                        stream.expired = True
                        expired.append(stream)
                        if getattr(stream, "stuck", None) is not None:
                            self._cancelled[stream] = now + STUCK_SECONDS
                    else:
                        nearest = min(nearest, deadline)
                for stream, due in list(self._cancelled.items()):
                    if due <= now:
                        del self._cancelled[stream]
                        stuck.append(stream)
                    else:
                        nearest = min(nearest, due)
                self._wake_at = nearest
                if not expired and not stuck:
                    self._cond.wait(None if nearest == math.inf else nearest - now)
            for stream in expired:
                stream.cancel()
            for stream in stuck:
                # Cancelled, and still not ended: its connection is stuck (a cut link holds its
                # writes, and the cancellation waits behind them until gRPC's keepalive gives
                # up). Closing the connection ends every call on it now.
                callback = getattr(stream, "stuck", None)
                if callback is not None:
                    try:
                        callback()
                    except Exception:  # noqa: BLE001 - the channel may be closed already
                        log.debug("closing a stuck connection failed", exc_info=True)


#: How long a stream cancelled at its deadline may take to end before its connection is
#: taken for stuck and closed (a healthy connection ends a cancelled call at once).
STUCK_SECONDS = 0.5

#: A stream idle this long is closed the next time a stream of its address is given back.
STREAM_IDLE_SECONDS = 60.0


class Streams:
    """The CallStream streams to one address.

    Args:
        channel: the address's grpc channel.
        method: the stream's full method name.
        metadata: returns the metadata a new stream opens with (token, caller id).
        limit: streams open at most; a call finding them all busy gets None (use unary).
        watchdog: keeps the calls' deadlines.
        core: drive the streams through grpcio's core call API (default: ``CORE_CALL_API``)
            rather than its public streaming API.
        on_stuck: called when a stream cancelled at its deadline does not end (its connection
            is stuck behind writes a cut link holds): close the connection.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        method: str,
        metadata: Callable[[], Any],
        limit: int,
        watchdog: Watchdog,
        core: bool | None = None,
        on_stuck: Callable[[], None] | None = None,
        route: str = _traffic.GRPC,
    ) -> None:
        self._route = route  # what its bytes count as (gradwire._traffic), metrics on
        core_channel = getattr(channel, "_channel", None)
        if core is None:
            core = CORE_CALL_API
        if core and not hasattr(core_channel, "segregated_call"):
            log.debug("a channel without the core call API: call streams use the public API")
            core = False
        self._channel = channel  # the core channel closes when the grpc.Channel goes
        self._core = core_channel if core else None
        self._method = method
        self._metadata = metadata
        self._limit = limit
        self._watchdog = watchdog
        self._on_stuck = on_stuck
        self._lock = threading.Lock()
        self._idle: list[_Stream] = []
        self._open = 0
        self._closed = False

    def exchange(self, frame: Frame, timeout: float | None) -> Frame | None:
        """Send ``frame`` on a stream and return its reply frame; None when no stream is free
        (send it as a unary call). Raises grpc.RpcError like the unary call would."""
        stream = self._take()
        if stream is None:
            return None
        if timeout is not None:
            self._watchdog.arm(stream, time.monotonic() + timeout)
        try:
            request = encode_frame(frame)
            reply = stream.exchange(request)
        except BaseException:
            self._failed(stream, timeout)
            raise
        self._give_back(stream, timeout)
        if _traffic.counts is not None:
            _traffic.sent(self._route, len(request))
            _traffic.received(self._route, len(reply))
        return decode_frame(reply)

    def start(
        self,
        encoded: bytes,
        timeout: float | None,
        readers: Executor,
        done: Callable[[Frame | None, grpc.RpcError | None], None],
    ) -> bool:
        """Send the encoded frame on a stream from this thread and return at once; a thread of
        ``readers`` waits for the reply and runs ``done(reply frame, None)`` or ``done(None,
        grpc error)``, then gives the stream back. False when no stream is free, or the
        streams are not driven through the core call API (send it another way)."""
        if self._core is None:
            return False
        stream = self._take()
        if stream is None:
            return False
        assert isinstance(stream, _CoreStream)
        try:
            stream.send(encoded)
        except Exception:  # noqa: BLE001 - the stream ended while idle: nothing was sent
            self._discard(stream, None)
            return False
        if timeout is not None:
            self._watchdog.arm(stream, time.monotonic() + timeout)
        route = self._route
        if _traffic.counts is not None:
            _traffic.sent(route, len(encoded))

        def receive() -> None:
            error: grpc.RpcError | None = None
            try:
                raw = stream.receive()
                if _traffic.counts is not None:
                    _traffic.received(route, len(raw))
                reply = decode_frame(raw)
            except grpc.RpcError as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - a reply that does not decode
                error = StreamFailed(grpc.StatusCode.INTERNAL, f"malformed reply: {exc}")
            if error is None:
                self._give_back(stream, timeout)
                done(reply, None)
                return
            try:
                self._failed(stream, timeout)
            except grpc.RpcError as timed_out:  # its deadline passed: say so
                error = timed_out
            done(None, error)

        try:
            readers.submit(receive)
        except RuntimeError:  # the readers were shut down: the transport is closing
            self._discard(stream, timeout)
            raise StreamFailed(grpc.StatusCode.UNAVAILABLE, "the transport is closing") from None
        return True

    def _take(self) -> _Stream | None:
        try:
            return self._idle.pop()
        except IndexError:
            return self._new()

    def _failed(self, stream: _Stream, timeout: float | None) -> None:
        """Discard a stream whose exchange failed; raises the timeout when its deadline had
        passed (the watchdog cancelled it)."""
        self._discard(stream, timeout)
        if stream.expired:
            raise _timed_out(timeout) from None

    def _give_back(self, stream: _Stream, timeout: float | None) -> None:
        if timeout is not None and self._watchdog.disarm(stream):
            self._discard(stream, None)  # cancelled as its reply came: the reply still counts
            return
        stream.idle_since = time.monotonic()
        self._idle.append(stream)
        if self._closed:  # closed meanwhile: nobody else will close it
            self.close()
        else:
            self._expire(stream.idle_since)

    def _expire(self, now: float) -> None:
        """Close the streams idle for over ``STREAM_IDLE_SECONDS`` (the least recently used
        are first; a call takes the most recent): each holds a thread of the callee's fast
        lane, so a burst of calls does not leave them all open."""
        while True:
            try:
                oldest = self._idle[0]
            except IndexError:
                return
            if oldest.idle_since >= now - STREAM_IDLE_SECONDS:
                return
            try:
                self._idle.remove(oldest)  # unless a call took it meanwhile
            except ValueError:
                continue
            self._discard(oldest, None)

    def _new(self) -> _Stream | None:
        with self._lock:
            if self._open >= self._limit or self._closed:
                return None
            self._open += 1
        try:
            if self._core is not None:
                return _CoreStream(
                    self._core, self._method.encode(), self._metadata(), self._on_stuck
                )
            return _PublicStream(self._channel, self._method, self._metadata())
        except BaseException as exc:
            with self._lock:
                self._open -= 1
            if isinstance(exc, ValueError):  # grpcio: "Cannot invoke RPC on closed channel!"
                raise StreamFailed(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
            raise

    def _discard(self, stream: _Stream, timeout: float | None) -> None:
        if timeout is not None:
            self._watchdog.disarm(stream)
        stream.close()
        with self._lock:
            self._open -= 1

    def close(self) -> None:
        """Close the idle streams and stop opening new ones (busy ones close as they finish)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for stream in idle:
            stream.close()


def _timed_out(timeout: float | None) -> StreamFailed:
    return StreamFailed(grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline of {timeout} s exceeded")
