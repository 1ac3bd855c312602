"""Calls on the bulk lane (docs/wire.md, "Calls on the lane"): the caller's side (``exchange``
from the calling thread, ``start`` with a reader thread, ``pinned`` tensors before the call)
and the callee's (``_answer``: the lane's reader serves a call record with the server's
``serve_call`` and writes the answer on the same connection).

Why (issue 19): over gRPC a message costs each side several thread hand-offs (gRPC's poller,
the stream's thread, the waiting caller), and on a 2-core machine each one costs more than the
Python it runs. On a lane connection the caller's own thread writes the call and reads the
answer, and the callee's reader thread, woken by the kernel, serves it where it is: one
wake-up per side, as a plain socket echo. A caller keeps at most ``CALL_CONNECTIONS_PER_PEER``
(``bulk_lane``) connections for calls to one peer, one call at a time on each; a call finding
them all busy, or a peer whose lane cannot be reached or takes no calls, goes by gRPC.

``LaneCalls`` is mixed into ``BulkLane``, which owns the sockets; what it needs from it is the
block of attributes and methods at the top of the class.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor

import grpc

from ..._wire import bulk
from ..._wire.framing import Frame, decode_frame, encode_frame
from ..calls.streams import StreamFailed
from ..cluster.context import WorkerContext
from ..cluster.workers import Peer
from .lane_io import (
    CALL,
    CANCEL,
    CODE,
    RECORD,
    STATUS,
    STATUS_CODES,
    recv_exact,
    send_parts,
    status_record,
)
from .loop import in_loop_thread

__all__ = ["LaneCalls", "LaneStatus", "Pin"]

log = logging.getLogger(__name__)


class Pin:
    """Where this thread's bulk-lane writes to ``peer`` go for a while (``BulkLane.pinned``; or
    while the lane's reader serves a call: its connection, ``inbound``)."""

    __slots__ = ("peer", "conn", "inbound")

    def __init__(self, peer: str, conn: socket.socket | None, inbound: bool) -> None:
        self.peer = peer
        self.conn = conn
        self.inbound = inbound


class _Sent:
    """A call written on a lane connection, its answer still to read."""

    __slots__ = ("conn", "pin", "deadline")

    def __init__(self, conn: socket.socket, pin: Pin | None, deadline: float | None) -> None:
        self.conn = conn
        self.pin = pin
        self.deadline = deadline


class LaneStatus(Exception):
    """What a call served on the lane would have had as its gRPC status: ``serve_call`` raises
    it, and the caller's ``exchange`` raises it as a StreamFailed of the same code."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class LaneCalls:
    """The call side of a bulk lane (mixed into ``BulkLane``)."""

    # -- required of the class this is mixed into ---------------------------------------------
    _ctx: WorkerContext
    _local: threading.local
    inbox: bulk.Inbox
    #: Largest frame a call record may carry.
    _frame_limit: int
    #: ``serve_call(caller name, raw frame) -> encoded reply frame`` (raises LaneStatus).
    serve_call: Callable[[str, bytes], bytes] | None

    #: ``_take(peer name, address, calls)``: an idle or new connection (None: none to have).
    _take: Callable[[str, str, bool], socket.socket | None]
    #: ``_give_back(peer name, connection, calls)`` / ``_drop(...)``: done with it / broken.
    _give_back: Callable[[str, socket.socket, bool], None]
    _drop: Callable[[str, socket.socket, bool], None]
    #: ``_receive(connection, peer, transfer id, nbytes, deadline)``: a transfer into the inbox.
    _receive: Callable[[socket.socket, str, int, int, float | None], bool]

    # -- the callee's side --------------------------------------------------------------------

    def _answer(self, conn: socket.socket, peer: str, nbytes: int) -> bool:
        """Serve the call whose record header just came and write its answer; False when the
        connection cannot be used any more."""
        if nbytes > self._frame_limit:
            log.warning(
                "bulk lane of %s: %s sent a call frame of %d bytes (over %d); connection closed",
                self._ctx.name,
                peer,
                nbytes,
                self._frame_limit,
            )
            return False
        conn.settimeout(bulk.STALL_SECONDS)
        try:
            raw = recv_exact(conn, nbytes)
        except (OSError, ConnectionError):
            return False
        if raw is None:
            return False
        serve = self.serve_call
        if serve is None:
            answer = status_record(
                grpc.StatusCode.UNIMPLEMENTED, "this worker serves no calls here"
            )
        else:
            prev = getattr(self._local, "pin", None)
            # The reply's tensors go on this connection, before the reply that names them.
            self._local.pin = Pin(peer, conn, inbound=True)
            try:
                reply = serve(peer, raw)
                answer = (RECORD.pack(CALL, len(reply)), reply)
                bulk.count("calls_served")
            except LaneStatus as st:
                answer = status_record(st.code, st.details)
            except Exception as exc:  # noqa: BLE001 - the caller gets it as INTERNAL
                log.error("bulk lane of %s: serving a call failed: %r", self._ctx.name, exc)
                answer = status_record(
                    grpc.StatusCode.INTERNAL, f"serving the call failed: {exc!r}"
                )
            finally:
                pin, self._local.pin = self._local.pin, prev
            if pin.conn is None:  # a write of the reply's tensors failed: the connection broke
                return False
        try:
            conn.settimeout(bulk.STALL_SECONDS)
            send_parts(conn, answer)
        except OSError:
            return False
        return True

    # -- the caller's side --------------------------------------------------------------------

    def serves(self, peer: Peer, address: str) -> bool:
        """Whether a one-frame call to ``peer``'s fast lane at ``address`` may go on the lane:
        lane calls are on and ``peer`` has a lane and a fast lane (on another host or on this
        one: a same-host peer's tensors still go through shared memory, only the frames take
        the lane's loopback connection instead of the fast lane's Unix socket)."""
        return (
            self._ctx.options.lane_calls
            and bool(peer.bulk_address)
            and address == peer.call_dial
            and address != peer.dial
        )

    def exchange(self, peer: Peer, frame: Frame, timeout: float | None) -> Frame | None:
        """Send the one-frame call ``frame`` to ``peer`` on a lane connection and read its reply
        on this thread (the tensors of the reply first, into the inbox).

        Returns:
            The reply frame; None when the call could not be sent (no connection could be
            had, or it broke before the whole call was written): send it by gRPC.

        Raises:
            StreamFailed: DEADLINE_EXCEEDED past ``timeout``, UNAVAILABLE when the connection
                broke, or the status the callee answered with (LaneStatus).
        """
        found: Pin | None = getattr(self._local, "pin", None)
        pin = found if found is not None and found.peer == peer.name and not found.inbound else None
        sent = self._send_call(peer, encode_frame(frame), timeout, pin)
        return None if sent is None else self._answer_of(peer.name, sent)

    def start(
        self,
        peer: Peer,
        encoded: bytes,
        timeout: float | None,
        readers: Executor,
        done: Callable[[Frame | None, grpc.RpcError | None], None],
    ) -> bool:
        """Send the encoded one-frame call to ``peer`` on a lane connection from this thread
        and return at once; a thread of ``readers`` reads the answer and runs ``done(reply
        frame, None)`` or ``done(None, StreamFailed)``. False when the call could not be sent
        (send it another way), as ``Streams.start``."""
        sent = self._send_call(peer, encoded, timeout, None)
        if sent is None:
            return False

        def receive() -> None:
            try:
                reply = self._answer_of(peer.name, sent)
            except StreamFailed as exc:
                done(None, exc)
                return
            except Exception as exc:  # noqa: BLE001 - an answer that does not decode
                done(None, StreamFailed(grpc.StatusCode.INTERNAL, f"malformed reply: {exc!r}"))
                return
            done(reply, None)

        try:
            readers.submit(receive)
        except RuntimeError:  # the readers were shut down: the transport is closing
            self._failed(peer.name, sent)
            raise StreamFailed(grpc.StatusCode.UNAVAILABLE, "the transport is closing") from None
        return True

    def _send_call(
        self, peer: Peer, raw: bytes, timeout: float | None, pin: Pin | None
    ) -> _Sent | None:
        """Write the call record of ``raw`` on a call connection to ``peer`` (``pin``'s, if
        any); None when it could not be (nothing of it reached the callee as a call)."""
        if in_loop_thread():
            return None
        name = peer.name
        conn = pin.conn if pin is not None else None
        if conn is None:
            conn = self._take(name, peer.bulk_address, True)  # True: for calls
            if conn is None:
                return None
            if pin is not None:
                pin.conn = conn  # given back when the pin ends
        sent = _Sent(conn, pin, None if timeout is None else time.monotonic() + timeout)
        try:
            conn.settimeout(bulk.STALL_SECONDS if timeout is None else max(timeout, 0.001))
            send_parts(conn, (RECORD.pack(CALL, len(raw)), raw))
        except OSError as exc:
            # Not all of it was written: the callee reads a cut record and closes, so the call
            # never runs there and may go another way.
            log.info(
                "bulk lane to %s: a call could not be written (%r); it goes by gRPC", name, exc
            )
            self._failed(name, sent, connected=False)
            return None
        self.inbox.connected(name)  # a take of a transfer read with the answer waits for it
        return sent

    def _answer_of(self, name: str, sent: _Sent) -> Frame:
        """The answer of the call ``sent`` to ``name``, read on this thread."""
        try:
            reply = self._read_reply(sent.conn, name, sent.deadline)
        except BaseException as exc:
            self._failed(name, sent)
            if isinstance(exc, StreamFailed):
                raise
            if isinstance(exc, TimeoutError):
                raise StreamFailed(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded on the bulk lane"
                ) from exc
            if isinstance(exc, (OSError, ConnectionError)):
                raise StreamFailed(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the bulk-lane connection to {name!r} broke: {exc!r}",
                ) from exc
            raise
        self.inbox.disconnected(name)
        if sent.pin is None:
            self._give_back(name, sent.conn, True)
        bulk.count("calls")
        return reply

    def _failed(self, name: str, sent: _Sent, connected: bool = True) -> None:
        """The call ``sent`` ended without its answer: its connection goes."""
        if connected:
            self.inbox.disconnected(name)
        self._drop(name, sent.conn, True)
        if sent.pin is not None:
            sent.pin.conn = None

    def _read_reply(self, conn: socket.socket, peer: str, deadline: float | None) -> Frame:
        """The answer of the call just sent on ``conn``: its transfers into the inbox, then
        the reply frame (or the status, raised as StreamFailed)."""
        while True:
            if deadline is None:
                conn.settimeout(None)  # as a stream with no deadline: until the connection ends
            head = recv_exact(conn, RECORD.size, deadline)
            if head is None:
                raise ConnectionError("the peer closed the connection")
            record, nbytes = RECORD.unpack(head)
            if record == CALL or record == STATUS:
                if nbytes > self._frame_limit or (record == STATUS and nbytes < CODE.size):
                    raise ConnectionError(f"an answer of {nbytes} bytes")
                body = recv_exact(conn, nbytes, deadline) if nbytes else b""
                if body is None:
                    raise ConnectionError("the peer closed the connection")
                if record == CALL:
                    return decode_frame(body)
                (code,) = CODE.unpack_from(body)
                status = STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN)
                raise StreamFailed(status, body[CODE.size :].decode("utf-8", "replace"))
            if nbytes == CANCEL:
                self.inbox.cancel(peer, record)
            elif not self._receive(conn, peer, record, nbytes, deadline):
                raise ConnectionError("a transfer of the answer failed")
