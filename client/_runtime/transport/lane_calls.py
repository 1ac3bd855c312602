"""Calls on the bulk lane (docs/wire.md, "Calls on the lane"): the caller's side (``exchange``
from the calling thread, ``start`` with a reader thread, ``pinned`` tensors before the call)
and the callee's (``_answer``: the lane's reader serves a call record with the server's
``serve_call`` and writes the answer on the same connection).

Why (issue 19): over gRPC a message costs each side several thread hand-offs (gRPC's poller,
the stream's thread, the waiting caller), and on a 2-core machine each one costs more than the
Python it runs. On a lane connection the caller's own thread writes the call and reads the
answer, and the callee's reader thread, woken by the kernel, serves it where it is: one
wake-up per side, as a plain socket echo. A caller keeps at most ``CALL_CONNECTIONS_PER_PEER``
(``bulk_lane``) connections for calls to one peer, one thread reading answers on each; a
call finding them all busy, or a peer whose lane cannot be reached or takes no calls, goes
by gRPC.

A remote() and the quick control messages (answered at once by the owner: RRef deletes,
ReleaseContext) may leave their answers *parked* (``start`` with ``park`` or ``quick``): no
reader thread is woken for them. The next call on the connection goes right behind and its
thread reads the parked answers before its own (``_Sent.ahead``; the callee serves a
connection's calls in order): the to_here() after its remote() claims that remote()'s
connection (``exchange(behind=...)``), so the owner's one lane thread serves the RemoteCall
and then the fetch, whose value is set by then; any call may go behind parked answers that
are all quick, so the next step's call goes behind the last step's ReleaseContext. Answers
nobody claims within ``PARK_SECONDS`` are handed to a reader thread by the lane's sweeper.

``LaneCalls`` is mixed into ``BulkLane``, which owns the sockets; what it needs from it is the
block of attributes and methods at the top of the class.
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
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
    set_timeout,
    status_record,
)
from .loop import in_loop_thread

__all__ = ["LaneCalls", "LaneStatus", "Parked", "Pin", "PARK_SECONDS", "delivering"]

log = logging.getLogger(__name__)

#: A parked answer nobody claimed after this long is read by a reader thread.
PARK_SECONDS = 0.002
#: Connections with parked answers per peer at most; a call past it gets a reader thread.
PARKED_PER_PEER = 2
#: Calls whose answers wait on one connection at most (a chain of quick ones and one more).
CHAIN_LIMIT = 8

#: ``done(reply frame, None)`` or ``done(None, StreamFailed)``: a started call's outcome.
Done = Callable[[Frame | None, grpc.RpcError | None], None]

_delivering = threading.local()


def delivering() -> bool:
    """Whether this thread is running a started call's ``done`` with the answer it read on
    the lane: one of the lane's own threads (a reader, or a caller that read a parked answer
    before its own), not gRPC's, so the outcome may run right here."""
    return getattr(_delivering, "on", False)


class Pin:
    """Where this thread's bulk-lane writes to ``peer`` go for a while (``BulkLane.pinned``; or
    while the lane's reader serves a call: its connection, ``inbound``)."""

    __slots__ = ("peer", "conn", "inbound")

    def __init__(self, peer: str, conn: socket.socket | None, inbound: bool) -> None:
        self.peer = peer
        self.conn = conn
        self.inbound = inbound


class _Sent:
    """A call written on a lane connection, its answer still to read: after the answers of
    the parked calls it went behind (``ahead``, in order, with their ``done``)."""

    __slots__ = ("conn", "pin", "deadline", "ahead")

    def __init__(
        self,
        conn: socket.socket,
        pin: Pin | None,
        deadline: float | None,
        ahead: tuple[tuple[_Sent, Done], ...] = (),
    ) -> None:
        self.conn = conn
        self.pin = pin
        self.deadline = deadline
        self.ahead = ahead


class _AheadFailed(StreamFailed):
    """The connection broke while the answers ahead of a call were read: the call's own
    answer is lost with it (whether it ran is unknown; a fetch may ask again)."""


class _StatusAnswer(StreamFailed):
    """A STATUS record answered the call: it failed, and the connection is fine."""


def _run(done: Done, reply: Frame | None, error: StreamFailed | None) -> None:
    """``done(reply, error)`` with ``delivering()`` true."""
    _delivering.on = True
    try:
        done(reply, error)
    finally:
        _delivering.on = False


def _earlier(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


class Parked:
    """A call written on a lane connection whose answer no thread reads yet (and those it
    went behind: ``sent.ahead``). Whoever ``claim``s it first reads the answers and runs
    their ``done``: a call written behind it on the same connection, or a reader thread once
    it waited ``PARK_SECONDS``. ``quick``: every answer comes at once (the owner runs no
    user function for it), so any call may go behind it."""

    __slots__ = ("peer", "sent", "done", "quick", "born", "_claim")

    def __init__(self, peer: str, sent: _Sent, done: Done, quick: bool) -> None:
        self.peer = peer
        self.sent = sent
        self.done = done
        self.quick = quick
        self.born = time.monotonic()
        self._claim = threading.Lock()

    def chain(self) -> tuple[tuple[_Sent, Done], ...]:
        """Every call waiting on the connection, in order."""
        return (*self.sent.ahead, (self.sent, self.done))

    def take_chain(self) -> tuple[tuple[_Sent, Done], ...]:
        """``chain()``, for a call going behind it: each answer is read once, in order, by
        that call's reader (the last one no longer reads those ahead of it)."""
        chain, self.sent.ahead = self.chain(), ()
        return chain

    def claim(self) -> bool:
        """True for the first caller only."""
        return self._claim.acquire(blocking=False)

    @property
    def claimed(self) -> bool:
        return self._claim.locked()


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

    #: ``_take(peer name, address, calls, timeout, connect)``: an idle or new connection
    #: (opened within ``timeout``, and only if ``connect``); None: none to have.
    _take: Callable[[str, str, bool, float | None, bool], socket.socket | None]
    #: ``_give_back(peer name, connection, calls)`` / ``_drop(...)``: done with it / broken.
    _give_back: Callable[[str, socket.socket, bool], None]
    _drop: Callable[[str, socket.socket, bool], None]
    #: ``_receive(connection, peer, transfer id, nbytes, deadline)``: a transfer into the inbox.
    _receive: Callable[[socket.socket, str, int, int, float | None], bool]

    def __init__(self) -> None:
        # Parked answers, oldest first, and the sweeper that hands the unclaimed ones over.
        self._parked: collections.deque[Parked] = collections.deque()
        self._sweep = threading.Condition(threading.Lock())
        self._sweeper: threading.Thread | None = None
        self._sweeper_waits = False
        self._parking_closed = False
        self._parked_readers: Executor | None = None

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
        set_timeout(conn, bulk.STALL_SECONDS)
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
            set_timeout(conn, bulk.STALL_SECONDS)
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

    def exchange(
        self, peer: Peer, frame: Frame, timeout: float | None, behind: Parked | None = None
    ) -> Frame | None:
        """Send the one-frame call ``frame`` to ``peer`` on a lane connection and read its reply
        on this thread (the tensors of the reply first, into the inbox). With ``behind`` (a
        parked answer this thread may claim: to_here()'s remote()), on that call's connection
        right behind it: its answer is read and handed to its ``done`` first.

        Returns:
            The reply frame; None when the call could not be sent (no connection could be
            had, or it broke before the whole call was written): send it by gRPC. (Behind a
            ``behind`` call, which only an idempotent fetch names, also when the connection
            broke before its answer.)

        Raises:
            StreamFailed: DEADLINE_EXCEEDED past ``timeout``, UNAVAILABLE when the connection
                broke, or the status the callee answered with (LaneStatus).
        """
        if behind is not None and (behind.peer != peer.name or not behind.claim()):
            behind = None
        may_resend = behind is not None
        found: Pin | None = getattr(self._local, "pin", None)
        pin = found if found is not None and found.peer == peer.name and not found.inbound else None
        sent = self._send_call(peer, encode_frame(frame), timeout, pin, behind)
        if sent is None:
            return None
        try:
            return self._answer_of(peer.name, sent)
        except _AheadFailed as exc:
            if sent.deadline is not None and time.monotonic() >= sent.deadline:
                raise StreamFailed(
                    grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded on the bulk lane"
                ) from None
            if may_resend:
                return None  # a fetch: asking again by gRPC is harmless
            # Any other call may have run: as when a connection breaks under a call alone.
            raise StreamFailed(exc.code(), exc.details()) from None

    def start(
        self,
        peer: Peer,
        encoded: bytes,
        timeout: float | None,
        readers: Executor,
        done: Done,
        park: Callable[[Parked], None] | None = None,
        quick: bool = False,
        connect: bool = True,
    ) -> bool:
        """Send the encoded one-frame call to ``peer`` on a lane connection from this thread
        and return at once; a thread of ``readers`` reads the answer and runs ``done(reply
        frame, None)`` or ``done(None, StreamFailed)``. False when the call could not be sent
        (send it another way), as ``Streams.start``; without ``connect``, also when no
        connection is open and idle (one is opened in the background for the next call).

        With ``park``, or for a ``quick`` call (its answer comes at once: an RRef delete),
        the answer may be parked instead (``Parked``, given to ``park``): the call that
        claims it reads it, or a reader thread after ``PARK_SECONDS``."""
        sent = self._send_call(peer, encoded, timeout, None, quick=quick, connect=connect)
        if sent is None:
            return False
        if park is not None or quick:
            parked = self._park(peer.name, sent, done, readers, quick)
            if parked is not None:
                if park is not None:
                    park(parked)
                return True
        try:
            readers.submit(self._deliver, peer.name, sent, done)
        except RuntimeError:  # the readers were shut down: the transport is closing
            self._failed(peer.name, sent)
            raise StreamFailed(grpc.StatusCode.UNAVAILABLE, "the transport is closing") from None
        return True

    def _deliver(
        self, name: str, sent: _Sent, done: Done, deadline: float | None = None, keep: bool = False
    ) -> bool:
        """Read the answer of ``sent`` (by ``deadline`` when given) and run ``done`` with it.
        True: the connection goes back to the pool (unless pinned, or ``keep``: a call
        written behind is still to be read on it); False: it broke and was dropped."""
        try:
            reply = self._read_answer(name, sent, deadline)
        except _StatusAnswer as exc:  # an answer all the same: the connection is fine
            if not keep and sent.pin is None:
                self._give_back(name, sent.conn, True)
            _run(done, None, StreamFailed(exc.code(), exc.details()))
            return True
        except StreamFailed as exc:
            # A copy without the traceback: ``done`` keeps the error, and the traceback holds
            # this frame and those above it (a to_here() reading a parked answer, and its
            # RRef) until the garbage collector runs.
            _run(done, None, StreamFailed(exc.code(), exc.details()))
            return False
        except Exception as exc:  # noqa: BLE001 - an answer that does not decode
            _run(done, None, StreamFailed(grpc.StatusCode.INTERNAL, f"malformed reply: {exc!r}"))
            return False
        if not keep and sent.pin is None:
            self._give_back(name, sent.conn, True)
        _run(done, reply, None)
        return True

    # -- parked answers -----------------------------------------------------------------------

    def _park(
        self, name: str, sent: _Sent, done: Done, readers: Executor, quick: bool
    ) -> Parked | None:
        """Leave the answer of ``sent`` (after those ahead of it: quick ones, ``_unpark``)
        for a claimant; None when too many wait already."""
        with self._sweep:
            if self._parking_closed:
                return None
            waiting = sum(1 for p in self._parked if p.peer == name and not p.claimed)
            if waiting >= PARKED_PER_PEER:
                return None
            parked = Parked(name, sent, done, quick)
            self._parked.append(parked)
            bulk.count("parked")
            self._parked_readers = readers
            if self._sweeper is None:
                self._sweeper = threading.Thread(
                    target=self._sweep_parked, name="gradwire-lane-sweeper", daemon=True
                )
                self._sweeper.start()
            elif self._sweeper_waits:
                self._sweep.notify()
        return parked

    def parked_count(self) -> int:
        """Calls whose answers wait parked, unclaimed."""
        with self._sweep:
            return sum(len(p.sent.ahead) + 1 for p in self._parked if not p.claimed)

    def _sweep_parked(self) -> None:
        """The sweeper: every ``PARK_SECONDS`` while answers are parked, hand those parked
        that long to a reader thread; asleep while none is."""
        while True:
            with self._sweep:
                while not self._parked and not self._parking_closed:
                    self._sweeper_waits = True
                    self._sweep.wait()
                    self._sweeper_waits = False
                if self._parking_closed:
                    return
            time.sleep(PARK_SECONDS)
            self._hand_over_due()

    def _hand_over_due(self) -> None:
        # (A method of its own: the parked answers handed over are not kept in the sweeper's
        # locals while it sleeps; an answer's error holds the frames that were waiting for it.)
        due: list[Parked] = []
        with self._sweep:
            now = time.monotonic()
            while self._parked and now - self._parked[0].born >= PARK_SECONDS:
                due.append(self._parked.popleft())
            readers = self._parked_readers
            self._parked = collections.deque(p for p in self._parked if not p.claimed)
        for parked in due:
            if parked.claim():
                self._hand_over(parked, readers)

    def _hand_over(self, parked: Parked, readers: Executor | None) -> None:
        """A reader thread reads the claimed ``parked`` answer (it fails when none can)."""
        bulk.count("handed_over")
        try:
            if readers is None:
                raise RuntimeError("no readers")
            readers.submit(self._deliver, parked.peer, parked.sent, parked.done)
        except RuntimeError:  # the readers were shut down: the transport is closing
            self._fail_chain(parked.peer, parked.take_chain(), "the transport is closing")

    def _fail_chain(self, name: str, chain: tuple[tuple[_Sent, Done], ...], why: str) -> None:
        """The calls of ``chain`` (on one connection) will not be answered: it goes."""
        *ahead, (last, done) = chain
        self._unanswered(name, ahead, why)
        self._failed(name, last)
        _run(done, None, StreamFailed(grpc.StatusCode.UNAVAILABLE, why))

    def _unanswered(self, name: str, calls: Sequence[tuple[_Sent, Done]], why: str) -> None:
        """Calls on a connection that went, whose answers nobody will read: each ``done``
        hears UNAVAILABLE."""
        for _, done in calls:
            self.inbox.disconnected(name)
            _run(done, None, StreamFailed(grpc.StatusCode.UNAVAILABLE, why))

    def _unpark(self, name: str) -> Parked | None:
        """Claim the newest quick parked chain to ``name`` with room for one more call."""
        with self._sweep:
            for parked in reversed(self._parked):
                if (
                    parked.peer == name
                    and parked.quick
                    and len(parked.sent.ahead) + 1 < CHAIN_LIMIT
                    and parked.claim()
                ):
                    self._parked.remove(parked)
                    return parked
        return None

    def _fail_parked(self, peer: str | None, why: str) -> None:
        """Fail the unclaimed parked answers (of ``peer``, or all of them and park no more:
        the lane closes); their connections are shut already."""
        with self._sweep:
            if peer is None:
                self._parking_closed = True
                self._sweep.notify()
            mine = [p for p in self._parked if peer is None or p.peer == peer]
            for parked in mine:
                self._parked.remove(parked)
        for parked in mine:
            if parked.claim():
                self._fail_chain(parked.peer, parked.take_chain(), why)

    def _send_call(
        self,
        peer: Peer,
        raw: bytes,
        timeout: float | None,
        pin: Pin | None,
        behind: Parked | None = None,
        quick: bool = False,
        connect: bool = True,
    ) -> _Sent | None:
        """Write the call record of ``raw`` on a call connection to ``peer``: ``pin``'s if it
        has one, else right behind the claimed ``behind`` or a quick parked chain, else an
        idle or new one (opened within ``timeout``; never for a ``quick`` call). None when it
        could not be (nothing of it reached the callee as a call; the calls it went behind
        then fail, as their connection goes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if in_loop_thread():
            if behind is not None:
                self._hand_over(behind, self._parked_readers)
            return None
        name = peer.name
        conn = pin.conn if pin is not None else None
        if conn is not None and behind is not None:  # (not for a pinned call: put it back)
            self._hand_over(behind, self._parked_readers)
            behind = None
        if conn is None:
            if behind is None:
                behind = self._unpark(name)
            if behind is not None:
                conn = behind.sent.conn
                bulk.count("behind")
            else:
                # for calls; a quick one (housekeeping) never waits on a new connection
                conn = self._take(name, peer.bulk_address, True, timeout, connect and not quick)
                if conn is None:
                    return None
            if pin is not None:
                pin.conn = conn  # given back when the pin ends
        ahead = behind.take_chain() if behind is not None else ()
        sent = _Sent(conn, pin, deadline, ahead)
        try:
            left = None if deadline is None else deadline - time.monotonic()
            set_timeout(conn, bulk.STALL_SECONDS if left is None else max(left, 0.001))
            send_parts(conn, (RECORD.pack(CALL, len(raw)), raw))
        except OSError as exc:
            # Not all of it was written: the callee reads a cut record and closes, so the call
            # never runs there and may go another way.
            log.info(
                "bulk lane to %s: a call could not be written (%r); it goes by gRPC", name, exc
            )
            if ahead:
                self._fail_chain(name, ahead, f"the bulk-lane connection to {name!r} broke")
                if pin is not None:
                    pin.conn = None
            else:
                self._failed(name, sent, connected=False)
            return None
        self.inbox.connected(name)  # a take of a transfer read with the answer waits for it
        return sent

    def _answer_of(self, name: str, sent: _Sent) -> Frame:
        """The answer of the call ``sent`` to ``name``, read on this thread; its connection
        back to the pool unless pinned (also after a status answer, which raises)."""
        try:
            reply = self._read_answer(name, sent)
        except _StatusAnswer:
            if sent.pin is None:
                self._give_back(name, sent.conn, True)
            raise
        if sent.pin is None:
            self._give_back(name, sent.conn, True)
        return reply

    def _read_answer(self, name: str, sent: _Sent, deadline: float | None = None) -> Frame:
        """The answer of the call ``sent`` to ``name`` (by its deadline, or ``deadline``
        when given), read on this thread after the answers ahead of it (each handed to its
        ``done``); the connection is dropped if it fails.

        Raises:
            _AheadFailed: the connection broke while an answer ahead was read.
            StreamFailed: as ``exchange``.
        """
        until = sent.deadline if deadline is None else deadline
        ahead, sent.ahead = sent.ahead, ()
        for i, (prev, done) in enumerate(ahead):
            if not self._deliver(name, prev, done, _earlier(prev.deadline, until), keep=True):
                self._unanswered(name, ahead[i + 1 :], "lane broke")
                self.inbox.disconnected(name)  # ours (the connection went with prev's failure)
                if sent.pin is not None:
                    sent.pin.conn = None
                raise _AheadFailed(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the bulk-lane connection to {name!r} broke before this call's answer",
                )
        try:
            reply = self._read_reply(sent.conn, name, until)
        except _StatusAnswer:
            self.inbox.disconnected(name)
            bulk.count("calls")
            raise
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
                set_timeout(conn, None)  # as a stream with no deadline: until the connection ends
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
                raise _StatusAnswer(status, body[CODE.size :].decode("utf-8", "replace"))
            if nbytes == CANCEL:
                self.inbox.cancel(peer, record)
            elif not self._receive(conn, peer, record, nbytes, deadline):
                raise ConnectionError("a transfer of the answer failed")
