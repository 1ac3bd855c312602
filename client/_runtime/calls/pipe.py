"""rpc_async over one long-lived ``CallPipe`` stream per address: many calls in flight, batched.

A unary gRPC call costs its opening and closing on both sides (metadata, status, the server's
per-call setup, a completion on gRPC's threads), which caps how many ``rpc_async`` calls per
second a worker can start however many are in flight. On a pipe, a call is one frame in a
message that usually carries several: whatever calls were waiting when the sending thread got
to them go out as one batch, and the callee answers in batches too. Replies come back in any
order, each naming its call (``ReplyHeader.message_id``).

Two implementations, one interface. ``CorePipe`` (grpcio's core call API, as the call streams
use): the submitting thread sends its frame itself when no send is in flight, else queues it;
the pipe's one reader thread takes every completion of the call (a send done: it sends what
queued meanwhile, as one batch; a reply batch: it hands each reply to its call's
``done(frame, error)``). ``Pipe`` (grpcio's public streaming API, the fallback): gRPC's
request-feeding thread takes batches from ``Pipe._outbox``, and gRPC's channel thread hands
reply batches to the reader: two more thread hand-offs per batch each way, which on a busy
2-core machine cost calls per second. Each call's deadline is kept by the transport's
``Watchdog``: a call past it fails alone (DEADLINE_EXCEEDED, as a unary call would), the pipe
goes on. A pipe that fails (the peer went away, the stream was cancelled) fails every call in
it with the stream's status, and the next call opens a new pipe. Nothing is retried: a call
that was in a failed pipe may or may not have run, as with a unary call that failed.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from ... import _traffic
from ..._wire.framing import (
    BATCH_BYTES,
    Frame,
    batch_end,
    decode_frame,
    pack_batch,
    unpack_batch,
)
from . import streams
from .streams import StreamFailed, Watchdog

__all__ = [
    "Pipe",
    "CorePipe",
    "PipeClosed",
    "PlainReply",
    "Done",
    "LaneDone",
    "deferred_callbacks",
    "open_pipe",
    "run_callbacks_here",
]

log = logging.getLogger(__name__)
#: Put in the outbox to end the stream (a batch stops growing at ``BATCH_BYTES``).
_END = None


class PlainReply:
    """The reply of a plain call that came as a lane pipe's PLAIN record: its value's pickle
    (plain data only: ``pickler.loads_plain`` takes it), no protobuf header."""

    __slots__ = ("data",)

    def __init__(self, data: memoryview) -> None:
        self.data = data


#: done(reply frame or None, error or None): called once per call, on the pipe's reader thread,
#: the watchdog's thread or the submitting thread; it must not block.
Done = Callable[[Frame | None, grpc.RpcError | None], None]
#: A lane pipe's ``Done``: its reply may be a PlainReply too.
LaneDone = Callable[[Frame | PlainReply | None, grpc.RpcError | None], None]


_reader = threading.local()


def deferred_callbacks() -> collections.deque[tuple[Any, bool, Any]] | None:
    """On a reader thread that completes futures with callbacks itself, after the replies it
    read (a lane pipe's ``PipeReader``): the queue to append ``(future, ok, value)`` to. None
    on any other thread (hand the completion to the serving pool)."""
    return getattr(_reader, "later", None)


def run_callbacks_here(later: collections.deque[tuple[Any, bool, Any]] | None) -> None:
    """Make the calling thread one that completes futures with callbacks from ``later`` (None:
    not)."""
    _reader.later = later


class PipeClosed(Exception):
    """The pipe no longer takes calls (it failed or was closed): open a new one.

    Attributes:
        failure: the gRPC error the pipe failed with, or None when it was closed.
    """

    def __init__(self, failure: grpc.RpcError | None) -> None:
        super().__init__("the call pipe is closed")
        self.failure = failure


def open_pipe(channel: grpc.Channel, method: str, metadata: Any, watchdog: Watchdog) -> Any:
    """A new pipe on ``channel``: a ``CorePipe`` where grpcio's core call API is there, else a
    ``Pipe``."""
    core_channel = getattr(channel, "_channel", None)
    if streams.CORE_CALL_API and hasattr(core_channel, "segregated_call"):
        return CorePipe(channel, method, metadata, watchdog)
    return Pipe(channel.stream_stream(method), metadata, watchdog)


class _Pending:
    """One call in a pipe: what the watchdog arms (``expired``, ``cancel``)."""

    __slots__ = ("pipe", "message_id", "done", "expired")

    def __init__(
        self, pipe: Any, message_id: int, done: Callable[[Any, grpc.RpcError | None], None]
    ) -> None:
        self.pipe = pipe
        self.message_id = message_id
        self.done = done
        self.expired = False

    def cancel(self) -> None:  # the watchdog: the call is past its deadline
        self.pipe._expire(self.message_id)


#: A pipe with no call in flight for this long is closed (its reader thread ends; the next call
#: opens a new pipe): a worker keeps reader threads for the peers it calls, not for every peer.
PIPE_IDLE_SECONDS = 5.0


class _IdleClose:
    """What the watchdog arms while a pipe has no call in flight: at the deadline, close it."""

    __slots__ = ("pipe", "expired")

    def __init__(self, pipe: _Calls) -> None:
        self.pipe = pipe
        self.expired = False

    def cancel(self) -> None:  # the watchdog: idle for PIPE_IDLE_SECONDS
        self.expired = False
        self.pipe._close_if_idle()


class _Calls:
    """What both pipes keep alike: the calls in flight, each answered once."""

    _lock: threading.Lock
    _pending: dict[int, _Pending]
    _watchdog: Watchdog
    _failure: grpc.RpcError | None
    _closing: bool
    _idle: _IdleClose

    def _close_if_idle(self) -> None:
        with self._lock:  # checked and closed at once: a call submitted meanwhile keeps it open
            if not self._pending and self._failure is None and not self._closing:
                self._end_sends_locked()

    def _end_sends_locked(self) -> None:
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        """Whether it takes calls (not failed, not closing)."""
        return self._failure is None and not self._closing

    def _take_locked(self, message_id: int, timeout: float | None, done: Done | LaneDone) -> None:
        # With the lock held: a new call, its deadline armed; PipeClosed when none is taken.
        if self._failure is not None or self._closing:
            raise PipeClosed(self._failure)
        entry = _Pending(self, message_id, done)
        self._pending[message_id] = entry
        if timeout:
            self._watchdog.arm(entry, time.monotonic() + timeout)

    def _answer(
        self, message_id: int, frame: Frame | PlainReply | None, error: grpc.RpcError | None
    ) -> None:
        with self._lock:
            entry = self._pending.pop(message_id, None)
            drained = not self._pending
        if entry is None:
            return  # expired before its reply came, or an id this pipe never sent
        if drained:  # (re)arm: each drain moves the deadline, one watchdog wake per idle spell
            self._watchdog.arm(self._idle, time.monotonic() + PIPE_IDLE_SECONDS)
        self._watchdog.disarm(entry)
        entry.done(frame, error)

    def _expire(self, message_id: int) -> None:
        self._answer(
            message_id,
            None,
            StreamFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
        )

    def _fail_all(self, failure: grpc.RpcError) -> None:
        """The pipe failed (the first failure sticks): every pending call fails with it."""
        with self._lock:
            if self._failure is None:
                self._failure = failure
            self._failed_locked()
            pending, self._pending = list(self._pending.values()), {}
        self._watchdog.disarm(self._idle)
        for entry in pending:
            self._watchdog.disarm(entry)
            entry.done(None, failure)

    def _failed_locked(self) -> None:
        """With the lock held, as the pipe fails: stop sending."""
        self._closing = True


class Pipe(_Calls):
    """One open ``CallPipe`` stream to an address.

    Args:
        stub: the channel's stream-stream callable of ``CallPipe`` (bytes in, bytes out).
        metadata: the call metadata (token, caller id).
        watchdog: keeps each call's deadline.
    """

    def __init__(self, stub: Any, metadata: Any, watchdog: Watchdog) -> None:
        self._watchdog = watchdog
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._failure: grpc.RpcError | None = None
        self._closing = False
        self._idle = _IdleClose(self)
        self._replies = stub(self._requests(), metadata=metadata)
        self._reader = threading.Thread(target=self._read, name="gradwire-pipe", daemon=True)
        self._reader.start()

    def submit(self, message_id: int, encoded: bytes, timeout: float | None, done: Done) -> None:
        """Send one encoded call frame; ``done`` gets its reply frame or the error.

        Raises:
            PipeClosed: the pipe failed or was closed before the call was taken.
        """
        with self._lock:
            self._take_locked(message_id, timeout, done)
            # Under the lock: a frame is never queued behind the end of the requests.
            self._outbox.put(encoded)

    def close(self) -> None:
        """Send nothing more: the callee answers what it has, then the stream ends (calls
        still pending then fail)."""
        with self._lock:
            if not self._closing:
                self._end_sends_locked()

    def _end_sends_locked(self) -> None:
        self._closing = True
        self._outbox.put(_END)

    def cancel(self) -> None:
        """End the stream now; pending calls fail with CANCELLED."""
        self.close()
        self._replies.cancel()

    # -- threads ---------------------------------------------------------------------------

    def _requests(self) -> Iterator[bytes]:
        """gRPC's request-feeding thread: one message per batch of waiting frames."""
        carry: Any = None  # a frame that did not fit the last batch: it opens the next one
        while True:
            first = carry if carry is not None else self._outbox.get()
            carry = None
            if first is _END:
                return
            frames, size, end = [first], len(first), False
            while size < BATCH_BYTES:
                try:
                    more = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if more is _END:
                    end = True
                    break
                if size + len(more) > BATCH_BYTES:  # within gRPC's message limit
                    carry = more
                    break
                frames.append(more)
                size += len(more)
            yield pack_batch(frames)
            if end:
                return

    def _read(self) -> None:
        failure: grpc.RpcError
        try:
            for batch in self._replies:
                if _traffic.counts is not None:
                    _traffic.received(_traffic.GRPC, len(batch))
                for raw in unpack_batch(batch):
                    frame = decode_frame(raw)  # type: ignore[arg-type]
                    self._answer(frame.header.reply.message_id, frame, None)
            failure = StreamFailed(grpc.StatusCode.UNAVAILABLE, "the callee ended the call pipe")
        except grpc.RpcError as exc:
            failure = exc
        except Exception as exc:  # noqa: BLE001 - a malformed reply batch ends the pipe
            log.warning("call pipe: malformed reply from the callee: %s", exc)
            failure = StreamFailed(grpc.StatusCode.INTERNAL, f"malformed reply batch: {exc}")
        self._fail_all(failure)

    def _failed_locked(self) -> None:
        if not self._closing:
            self._closing = True
            self._outbox.put(_END)  # let the request thread end


# Completion tags of a CorePipe's operations (besides the call's own, ``streams``).
_SEND, _RECEIVE, _CLOSE = object(), object(), object()


class CorePipe(_Calls):
    """One open ``CallPipe`` stream to an address, driven through grpcio's core call API (see
    the module doc). Same interface and failures as ``Pipe``.

    Args:
        channel: the address's grpc channel (its core channel carries the call).
        method: the full method name of ``CallPipe``.
        metadata: the call metadata (token, caller id).
        watchdog: keeps each call's deadline.
    """

    def __init__(self, channel: grpc.Channel, method: str, metadata: Any, watchdog: Watchdog):
        cygrpc = streams.cygrpc
        self._channel = channel  # the core channel closes when the grpc.Channel goes
        self._watchdog = watchdog
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._queued: list[bytes] = []  # frames waiting for the send in flight
        self._sending = False
        self._failure: grpc.RpcError | None = None
        self._closing = False
        self._ended = False  # the status came: no more events after the outstanding ones
        self._idle = _IdleClose(self)
        self._call = streams.open_core_call(
            channel._channel,
            method.encode(),
            metadata,
            ((cygrpc.ReceiveMessageOperation(0),), _RECEIVE),
        )
        # Batches started and not completed, as gRPC counts them: the call and its completion
        # queue go with the last one, after which the reader must not wait on the queue.
        self._outstanding = 4
        self._reader = threading.Thread(target=self._read, name="gradwire-pipe", daemon=True)
        self._reader.start()

    def submit(self, message_id: int, encoded: bytes, timeout: float | None, done: Done) -> None:
        """Send one encoded call frame (from this thread when no send is in flight); ``done``
        gets its reply frame or the error.

        Raises:
            PipeClosed: the pipe failed or was closed before the call was taken.
        """
        with self._lock:
            self._take_locked(message_id, timeout, done)
            if self._sending:
                self._queued.append(encoded)
            else:
                self._send_locked([encoded])

    def close(self) -> None:
        """Send nothing more: the callee answers what it has, then the stream ends (calls
        still pending then fail)."""
        with self._lock:
            if not self._closing:
                self._end_sends_locked()

    def _end_sends_locked(self) -> None:
        self._closing = True
        if not self._sending:
            self._close_locked()

    def cancel(self) -> None:
        """End the stream now; pending calls fail with CANCELLED."""
        self.close()
        try:
            self._call.cancel(streams._CANCELLED, "call pipe cancelled")
        except Exception:  # noqa: BLE001 - the channel may be closed already
            pass

    # -- with the lock held ----------------------------------------------------------------

    def _operate_locked(self, operations: tuple[Any, ...], tag: object) -> bool:
        if self._ended:
            return False
        if self._call.operate(operations, tag):
            self._outstanding += 1
            return True
        return False  # the call is over: its status ends the pipe

    def _send_locked(self, frames: list[bytes]) -> None:
        cygrpc = streams.cygrpc
        self._sending = self._operate_locked(
            (cygrpc.SendMessageOperation(pack_batch(frames), 0),), _SEND
        )

    def _close_locked(self) -> None:
        self._operate_locked((streams.cygrpc.SendCloseFromClientOperation(0),), _CLOSE)

    # -- the reader ------------------------------------------------------------------------

    def _read(self) -> None:
        failure: grpc.RpcError | None = None
        while True:
            with self._lock:
                if self._ended and not self._outstanding:
                    break
            try:
                event = self._call.next_event()
            except Exception as exc:  # noqa: BLE001 - gRPC's queue failed: nothing more comes
                log.warning("call pipe: its completion queue failed: %r", exc)
                self._fail_all(
                    StreamFailed(grpc.StatusCode.UNAVAILABLE, f"call pipe failed: {exc}")
                )
                return
            with self._lock:
                self._outstanding -= 1
            try:
                if event.tag is _SEND:
                    self._sent()
                elif event.tag is _RECEIVE:
                    self._received(event)
                elif event.tag is streams.STATUS:
                    failure = streams.status_failure(event, "the callee ended the call pipe")
                    with self._lock:
                        self._ended = True
                    self._fail_all(failure)
            except Exception as exc:  # noqa: BLE001 - a malformed reply batch ends the pipe
                log.warning("call pipe: malformed reply from the callee: %s", exc)
                self._fail_all(
                    StreamFailed(grpc.StatusCode.INTERNAL, f"malformed reply batch: {exc}")
                )
                self.cancel()

    def _sent(self) -> None:
        with self._lock:
            if self._queued and self._failure is None:
                end = batch_end(self._queued)  # a batch stops growing at BATCH_BYTES
                frames, self._queued = self._queued[:end], self._queued[end:]
                self._send_locked(frames)
            else:
                self._sending = False
                if self._closing:
                    self._close_locked()

    def _received(self, event: Any) -> None:
        batch = None
        if event.success:
            for op in event.batch_operations:
                if op.type() == streams.cygrpc.OperationType.receive_message:
                    batch = op.message()
        if batch is None:  # the callee ended the stream: its status follows
            return
        with self._lock:
            self._operate_locked((streams.cygrpc.ReceiveMessageOperation(0),), _RECEIVE)
        if _traffic.counts is not None:
            _traffic.received(_traffic.GRPC, len(batch))
        for raw in unpack_batch(batch):
            frame = decode_frame(raw)  # type: ignore[arg-type]
            self._answer(frame.header.reply.message_id, frame, None)

    def _failed_locked(self) -> None:
        self._closing = True
        self._queued = []
