"""rpc_async on the bulk lane: one connection per peer carries many calls at once (a *lane
pipe*), as the gRPC ``CallPipe`` does, without gRPC (docs/wire.md, "Pipes on the lane").

Why: with many calls in flight (a parameter server's fan-in), a call on a connection of its own
costs a thread hand-off and two blocking reads on the caller and a wake-up of the callee's
reader per call, and the gRPC pipe's callee (HTTP/2 on the asyncio server, the loop, the pool
and the loop again) costs more still; measured at 32 workers, 170-200 us of the caller's CPU
and 260-670 us of the callees' per noop call. On a lane pipe a caller writes its frame from the
calling thread (what queued meanwhile goes with it, as one write), one reader thread per worker
(``PipeReader``, a selector over every pipe) reads whatever replies came, and the callee's
reader for the connection reads whatever calls came and serves each itself while calls are
quick, else hands it to the serving pool; the threads that have replies write them back,
joined when they come together (``ServedPipe``). Either reader that is held in what it runs
hands its reading to a new thread (``lane_lead``).

Records, on a lane connection after the handshake: ``[u64 PIPE][u64 n][a call frame]`` from
the caller; ``[u64 CALL][u64 n][a reply frame]`` back, in any order, each naming its call
(``ReplyHeader.message_id``); an error is a reply frame with its error (never a STATUS record).
A plain call (plain data, nothing for a hook) may come as ``[u64 PLAIN][u64 n][message id,
function, pickle]`` instead, without a protobuf header, and its plain value go back as ``[u64
PLAIN][u64 n][message id, pickle]`` (``lane_io.PLAIN``): the header's encoding and decoding
were a sixth of a callee's CPU per noop call. A connection that carried a PIPE or PLAIN record
carries nothing else. A peer serves PIPE records when its ``WorkerInfo.lane_pipe`` says so,
PLAIN ones when its ``WorkerInfo.lane_plain`` does.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from ... import _traffic
from ..._wire import bulk
from ..._wire.framing import decode_frame
from ...futures import blocking_hook, set_blocking_hook
from ..calls.pipe import (
    LaneDone,
    PipeClosed,
    PlainReply,
    _Calls,
    _IdleClose,
    _Pending,
    run_callbacks_here,
)
from ..calls.streams import StreamFailed, Watchdog
from .lane_io import (
    CALL,
    PIPE,
    PLAIN,
    PLAIN_CALL,
    PLAIN_REPLY,
    RECORD,
    readable,
    set_timeout,
    shut,
    write_all,
)
from .lane_lead import Leading, Watch
from .lane_rest import LINGER_SECONDS

__all__ = [
    "LanePipe",
    "LanePipes",
    "Outbox",
    "PipeReader",
    "ServePipe",
    "ServedPipe",
    "READ_BYTES",
    "take_records",
    "plain_call",
    "read_plain_call",
]

log = logging.getLogger(__name__)
#: Bytes read from a pipe's socket at once (every whole record in them is taken).
READ_BYTES = 256 << 10


class LanePipe(_Calls):
    """The caller's end of one lane pipe (same interface and failures as ``calls.pipe``'s).

    Args:
        conn: an authenticated lane connection to the peer, this pipe's alone from now on.
        peer: the peer's name (for errors).
        watchdog: keeps each call's deadline, and closes the pipe once idle.
        frame_limit: the largest reply frame taken (a larger one ends the pipe).
        closed: called once when the pipe's connection is done with (it failed or closed).
    """

    def __init__(
        self,
        conn: socket.socket,
        peer: str,
        watchdog: Watchdog,
        frame_limit: int,
        closed: Callable[[LanePipe], None],
    ) -> None:
        self.conn = conn
        self.peer = peer
        self._watchdog = watchdog
        self._frame_limit = frame_limit
        self._closed = closed
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._failure: grpc.RpcError | None = None
        self._closing = False
        self._idle = _IdleClose(self)
        self._out = Outbox(conn, self._broke)
        self._buf = bytearray()  # what the reader has of a record not yet whole
        #: the PipeReader that reads it (set when it is added to one)
        self.reader: PipeReader | None = None

    def submit(
        self,
        message_id: int,
        encoded: bytes,
        timeout: float | None,
        done: LaneDone,
        kind: int = PIPE,
    ) -> None:
        """Write one encoded call: a frame (``kind`` PIPE) or a PLAIN record's body (this
        thread writes it, and whatever queued while it wrote; a thread already writing takes
        it instead); ``done`` gets its reply (a frame, or a ``PlainReply``) or the error.

        Raises:
            PipeClosed: the pipe failed or was closed before the call was taken.
        """
        with self._lock:
            self._take_locked(message_id, timeout, done)
        self._out.put(kind, encoded)

    def _expire(self, message_id: int) -> None:
        # The watchdog: the call is past its deadline. Its reply may have come and wait unread
        # behind a callback the reader is running: then the reading goes to a new thread and
        # the call has a little longer (once per hand-over: a reader not held fails it).
        reader = self.reader
        if reader is not None and reader.unstick():
            with self._lock:
                entry = self._pending.get(message_id)
            if entry is not None:
                entry.expired = False
                self._watchdog.arm(entry, time.monotonic() + HANDOVER_GRACE_SECONDS)
                return
        super()._expire(message_id)

    def _broke(self, exc: OSError) -> None:
        self._gone(f"broke: {exc!r}")

    def _gone(self, what: str) -> None:
        """The connection is over: every pending call fails (UNAVAILABLE, ``what`` said)."""
        self._fail_all(
            StreamFailed(grpc.StatusCode.UNAVAILABLE, f"the lane pipe to {self.peer!r} {what}")
        )

    def _end_sends_locked(self) -> None:
        # Idle (or closed): nothing is pending, so the connection can go now; the reader sees
        # it end and lets it go.
        self._closing = True
        shut(self.conn)

    def close(self) -> None:
        """Take no more calls; those pending fail (UNAVAILABLE) when the connection ends."""
        with self._lock:
            self._closing = True
        shut(self.conn)

    # -- the reader's side (PipeReader's thread) --------------------------------------------

    def readable(self) -> bool:
        """Read what came and answer each whole reply; False once the pipe is over (the
        connection ended, broke, or the peer broke the protocol: every pending call fails)."""
        why = ""
        try:
            chunk = os.read(self.conn.fileno(), READ_BYTES)
        except BlockingIOError:
            return True
        except (OSError, ValueError) as exc:  # ValueError: closed here (fileno -1)
            chunk, why = b"", repr(exc)
        if not chunk:
            self._gone(f"closed: {why}" if why else "closed")
            return False
        if _traffic.counts is not None:
            _traffic.received(_traffic.BULK_LANE, len(chunk))
        buf = self._buf
        buf += chunk
        try:
            records, at = take_records(buf, _REPLIES, self._frame_limit)
            del buf[:at]
            for kind, raw in records:
                if kind == PLAIN:
                    (message_id,) = PLAIN_REPLY.unpack_from(raw)
                    self._answer(message_id, PlainReply(memoryview(raw)[PLAIN_REPLY.size :]), None)
                else:
                    frame = decode_frame(raw)
                    self._answer(frame.header.reply.message_id, frame, None)
        except Exception as exc:  # noqa: BLE001 - a malformed reply ends the pipe
            log.warning("lane pipe to %s: malformed reply: %s", self.peer, exc)
            self._fail_all(
                StreamFailed(grpc.StatusCode.INTERNAL, f"malformed reply on the lane: {exc}")
            )
            shut(self.conn)
            return False
        return True

    def ended(self, why: str = "") -> None:
        """The reader let the connection go: close it, and say so once. With ``why``, the
        reader stopped before the connection ended: what is pending fails first."""
        if why:
            self._gone(why)
        self.conn.close()
        self._closed(self)


#: A call reaching its deadline while the reader is held in a callback hands the reading over
#: (``lane_lead``) and has this much more, once, for a reply that may be waiting unread.
HANDOVER_GRACE_SECONDS = 0.2


class PipeReader(Leading):
    """One thread reading the replies of every lane pipe of a worker (a selector over their
    sockets), started with the first pipe.

    It completes the futures of the replies it reads; one with callbacks (a parameter server's
    ``then`` on every call) after the round of reads, with its callbacks run right here (the
    serving pool would cost a thread wake-up a reply). A callback that blocks (a
    ``Future.wait``, a blocking RPC: ``blocking_region``) or runs longer than
    ``STUCK_SECONDS`` (seen by the worker's ``lane_lead.Watch``) hands the reading to a new
    thread (the *leader*) and keeps only its own callback; the new leader runs the callbacks
    left.

    Args:
        name: the reading threads' name.
        watch: the worker's watch (None: one of its own, closed with the reader).
    """

    def __init__(self, name: str, watch: Watch | None = None) -> None:
        self._name = name
        self._own_watch = watch is None
        self._watch = Watch(f"{name}-watch") if watch is None else watch
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._added: list[LanePipe] = []
        self._pipes: set[LanePipe] = set()  # the leader's alone
        self._later: collections.deque[tuple[Any, bool, Any]] = collections.deque()
        self._closed = False
        #: when the leader started running callbacks (0.0: it is not running any)
        self._busy_since = 0.0
        self._watch.add(self)
        self._leader: threading.Thread | None = threading.Thread(
            target=self._run, name=name, daemon=True
        )
        self._leader.start()

    def add(self, pipe: LanePipe) -> bool:
        """Read ``pipe``'s replies from now on; False once the reader is closed."""
        with self._lock:
            if self._closed:
                return False
            self._added.append(pipe)
        pipe.reader = self
        self._wake()
        return True

    def close(self) -> None:
        """End the thread; every pipe still read is closed (its pending calls fail). A leader
        held in a callback hands over first, so the pipes close now."""
        with self._lock:
            self._closed = True
        self._watch.discard(self)
        if self._own_watch:
            self._watch.close()
        self.unstick(0.0)
        self._wake()

    def _hand_over_locked(self) -> None:
        if self._leader is None:  # stopped
            return
        self._busy_since = 0.0
        self._leader = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._leader.start()

    def _blocking(self) -> contextlib.AbstractContextManager[Any]:
        # The blocking hook of the reader's threads: the leader about to block hands over.
        with self._lock:
            if self._leader is threading.current_thread():
                self._hand_over_locked()
        return contextlib.nullcontext()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # closed: the thread ended
            pass

    def _run(self) -> None:
        me = threading.current_thread()
        run_callbacks_here(self._later)
        set_blocking_hook(self._blocking)
        try:
            while self._leader is me:
                if not self._read_round(me):
                    return
                self._run_later(me)
        finally:
            if self._leader is me:
                self._stop()
            elif self._leader is None:  # stopped while this one was held: what is left
                self._run_left()
            elif self._later:  # held in a callback meanwhile: the leader runs what came
                self._wake()

    def _read_round(self, me: threading.Thread) -> bool:
        """Read whatever came (futures with callbacks are left for after the round); False
        once closed."""
        for key, _ in self._selector.select(None if not self._later else 0):
            pipe: LanePipe | None = key.data
            if pipe is None:
                if not self._woken():
                    return False
            elif not pipe.readable() and self._leader is me:
                self._pipes.discard(pipe)
                self._selector.unregister(pipe.conn)
                pipe.ended()
            if self._leader is not me:
                return True
        return True

    def _run_later(self, me: threading.Thread) -> None:
        later = self._later
        if not later:
            return
        self._busy_since = self._watch.busy()
        try:
            while later and self._leader is me:
                try:
                    fut, ok, value = later.popleft()
                except IndexError:
                    return
                fut._settle(ok, value)
        finally:
            with self._lock:
                if self._leader is me:
                    self._busy_since = 0.0

    def _stop(self) -> None:
        with self._lock:
            self._leader = None  # no hand-over from here on
        for pipe in self._pipes:
            pipe.close()
            pipe.ended("closed: the worker's lane closed")
        self._pipes.clear()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        self._run_left()

    def _run_left(self) -> None:
        # Stopped: the futures whose replies came are still completed.
        while True:
            try:
                fut, ok, value = self._later.popleft()
            except IndexError:
                return
            fut._settle(ok, value)

    def _woken(self) -> bool:
        """Take the pipes added meanwhile; False once closed."""
        try:
            self._wake_r.recv(4096)
        except BlockingIOError:
            pass
        with self._lock:
            added, self._added = self._added, []
            closed = self._closed
        for pipe in added:
            try:
                self._selector.register(pipe.conn, selectors.EVENT_READ, pipe)
                self._pipes.add(pipe)
            except (OSError, ValueError):  # closed before it was read
                pipe.ended("closed before it was read")
        return not closed


class Outbox:
    """Records for one connection, written by whichever thread comes first; what queues while
    it writes goes out with its next write, joined. After a failed write, ``broke(error)`` runs
    once and nothing more is written.

    Args:
        conn: the connection (with a timeout: a stalled write fails).
        broke: told of the failed write (the connection is shut first).
    """

    def __init__(self, conn: socket.socket, broke: Callable[[OSError], None]) -> None:
        self._conn = conn
        self._broke = broke
        self._lock = threading.Lock()
        self._queued: list[bytes] = []
        self._writing = False
        self._dead = False

    def put(self, kind: int, encoded: bytes) -> None:
        """Write the record ``[kind][len][encoded]`` (or leave it to the thread writing)."""
        with self._lock:
            if self._dead:
                return
            self._queued += (RECORD.pack(kind, len(encoded)), encoded)
            if self._writing:
                return
            self._writing = True
        while True:
            with self._lock:
                if not self._queued or self._dead:
                    self._writing = False
                    return
                data = b"".join(self._queued)
                self._queued = []
            try:
                write_all(self._conn, data)
            except OSError as exc:
                with self._lock:
                    self._dead = True
                    self._writing = False
                    self._queued = []
                shut(self._conn)
                self._broke(exc)
                return
            if _traffic.counts is not None:
                _traffic.sent(_traffic.BULK_LANE, len(data))


#: ``SLOW_IN_A_ROW`` calls served inline one after the other that each took longer than
#: ``INLINE_MAX_SECONDS``, or one handed over, send the pipe's calls to the serving pool for
#: ``POOL_SPELL_SECONDS`` (then inline is tried again): slow handlers (a sleep, I/O, a GIL-free
#: kernel) keep the pool's concurrency. One slow call alone does not: on a loaded machine a
#: quick call is slow when the leader is preempted in it.
INLINE_MAX_SECONDS = 0.002
SLOW_IN_A_ROW = 2
POOL_SPELL_SECONDS = 1.0


class ServedPipe(Leading):
    """The callee's end of one lane pipe: its calls read by one thread at a time (the leader,
    a bulk-lane reader), each served inline on it when it may (``inline``), else by the
    serving pool; the replies posted by whichever thread has them (``post``) and written back
    as CALL records (``Outbox``), joined when they come together.

    Serving inline saves the pool's thread wake-up per call (at 32 workers on 2 cores, a
    quarter of a callee's CPU per noop call). A call served inline that blocks
    (``blocking_region``) or runs ``STUCK_SECONDS`` (the worker's ``lane_lead.Watch``) hands the
    reading to a new thread (``hand_over``: the bulk lane's ``_resume``), which serves the calls
    left; the held thread ends with its call. A slow or handed-over call sends the pipe's calls
    to the pool for a while (``POOL_SPELL_SECONDS``), as do calls that are slow one after the
    other.

    Args:
        conn: the connection.
        watch: the worker's watch.
        hand_over: starts a thread that reads the connection from now on.
    """

    def __init__(self, conn: socket.socket, watch: Watch, hand_over: Callable[[], None]) -> None:
        self.conn = conn
        # A failed write: the caller went, and its reader fails what it waits for.
        self._out = Outbox(conn, lambda _exc: None)
        self._watch = watch
        self._hand_over = hand_over
        self._lock = threading.Lock()
        #: what the leader has of a record not yet whole, and the calls read, not yet served
        self.buf = bytearray()
        self.calls: collections.deque[tuple[int, bytes]] = collections.deque()
        self._leader: threading.Thread | None = None
        self._busy_since = 0.0  # when the leader's inline call started (0.0: none)
        self._pool_until = 0.0  # calls go to the pool until then
        self._slow = 0  # inline calls slower than INLINE_MAX_SECONDS in a row, just before

    def post(self, encoded: bytes | None) -> None:
        """A call's encoded reply frame (None: nothing to send)."""
        if encoded is not None:
            self._out.put(CALL, encoded)

    def post_plain(self, message_id: int, data: bytes) -> None:
        """A PLAIN call's plain value, pickled: its PLAIN reply."""
        self._out.put(PLAIN, PLAIN_REPLY.pack(message_id) + data)

    def lead(self) -> threading.Thread:
        """The calling thread reads the pipe from now on (returned)."""
        me = threading.current_thread()
        self._leader = me
        return me

    def leads(self, me: threading.Thread) -> bool:
        """Whether ``me`` still reads the pipe (False: it was handed over)."""
        return self._leader is me

    def inline(self) -> _Inline | None:
        """The context to serve the call just taken inline, on the leader; None: give it to
        the pool (not the leader's thread, or the pipe's inline calls were slow lately)."""
        me = threading.current_thread()
        if self._leader is not me:
            return None
        if self._pool_until and time.monotonic() < self._pool_until:
            return None
        return _Inline(self, me)

    def _hand_over_locked(self) -> None:
        self._busy_since = 0.0
        self._leader = None  # until the new thread leads: the held one reads no more
        self._pool_spell()
        self._hand_over()

    def _pool_spell(self) -> None:
        self._slow = 0
        self._pool_until = time.monotonic() + POOL_SPELL_SECONDS

    def _blocking(self, me: threading.Thread) -> None:
        with self._lock:
            if self._leader is me and self._busy_since:
                self._hand_over_locked()

    def _served(self, me: threading.Thread) -> None:
        with self._lock:
            if self._leader is not me:
                return  # handed over meanwhile
            since, self._busy_since = self._busy_since, 0.0
        if time.monotonic() - since <= INLINE_MAX_SECONDS:
            self._slow = 0
        else:
            self._slow += 1
            if self._slow >= SLOW_IN_A_ROW:
                self._pool_spell()


class _Inline:
    """One call served inline on a pipe's leader: busy for the watch meanwhile, and a
    blocking wait inside hands the reading over before it waits (then the thread's own
    blocking hook, the serving pool's, gives its slot back)."""

    __slots__ = ("_pipe", "_me", "_outer")

    def __init__(self, pipe: ServedPipe, me: threading.Thread) -> None:
        self._pipe = pipe
        self._me = me
        self._outer: Callable[[], contextlib.AbstractContextManager[Any]] | None = None

    def __enter__(self) -> None:
        self._outer = blocking_hook()
        set_blocking_hook(self._blocking)
        self._pipe._busy_since = self._pipe._watch.busy()

    def _blocking(self) -> contextlib.AbstractContextManager[Any]:
        self._pipe._blocking(self._me)
        outer = self._outer
        return contextlib.nullcontext() if outer is None else outer()

    def __exit__(self, *exc: object) -> None:
        set_blocking_hook(self._outer)
        self._pipe._served(self._me)


#: ``serve_pipe(caller name, record kind, its bytes, pipe)``: how the server serves a call that
#: came on a lane pipe, a frame (PIPE) or a plain call (PLAIN, ``read_plain_call``) (inline in
#: ``pipe.inline()`` when that is not None; its reply, then or later, goes to ``pipe.post`` or
#: ``pipe.post_plain``).
ServePipe = Callable[[str, int, bytes, "ServedPipe"], None]
#: What a lane pipe carries each way.
_CALLS = (PIPE, PLAIN)
_REPLIES = (CALL, PLAIN)


def take_records(
    buf: bytearray, kinds: tuple[int, ...], limit: int
) -> tuple[list[tuple[int, bytes]], int]:
    """The whole records at the start of ``buf`` (each ``(kind, bytes)``) and how many bytes
    they took.

    Raises:
        ValueError: a record of a kind not in ``kinds``, or larger than ``limit``.
    """
    records: list[tuple[int, bytes]] = []
    at, end = 0, len(buf)
    while end - at >= RECORD.size:
        record, nbytes = RECORD.unpack_from(buf, at)
        if record not in kinds or nbytes > limit:
            raise ValueError(f"a record {record:#x} of {nbytes} bytes on a lane pipe")
        if end - at - RECORD.size < nbytes:
            break
        start = at + RECORD.size
        records.append((record, bytes(buf[start : start + nbytes])))
        at = start + nbytes
    return records, at


def plain_call(message_id: int, timeout: float, function: str, data: bytes) -> bytes:
    """A PLAIN record's body: the call ``message_id`` (``timeout`` seconds, 0.0: none) of
    ``function`` with the pickle ``data`` (``(self, args, kwargs)``, plain data only)."""
    name = function.encode("utf-8")
    return b"".join((PLAIN_CALL.pack(message_id, timeout, len(name)), name, data))


def read_plain_call(raw: bytes) -> tuple[int, float, str, memoryview]:
    """``(message id, timeout, function, pickle)`` of a PLAIN record's body.

    Raises:
        ValueError: it is shorter than its header says, or the name is not UTF-8.
    """
    if len(raw) < PLAIN_CALL.size:
        raise ValueError(f"a PLAIN record of {len(raw)} bytes")
    message_id, timeout, n = PLAIN_CALL.unpack_from(raw)
    end = PLAIN_CALL.size + n
    if len(raw) < end:
        raise ValueError(f"a PLAIN record of {len(raw)} bytes names a function of {n}")
    return message_id, timeout, raw[PLAIN_CALL.size : end].decode("utf-8"), memoryview(raw)[end:]


class LanePipes:
    """Lane pipes, mixed into ``BulkLane``: the caller's (``pipe_call``: one pipe per peer,
    their replies read by one ``PipeReader``) and the callee's (``_serve_pipe``: a
    connection's calls handed to ``serve_pipe``, the replies written back by its ``ServedPipe``)."""

    # Provided by BulkLane.
    _ctx: Any
    _lock: threading.Lock
    _closed: bool
    _frame_limit: int
    _rest: Any
    _take: Callable[..., socket.socket | None]
    _drop: Callable[..., None]
    _resume: Callable[[socket.socket, str], None]
    serves: Callable[[Any, str], bool]

    def __init__(self) -> None:
        #: ``serve_pipe``, installed by the server (None: pipes are refused).
        self.serve_pipe: ServePipe | None = None
        self._pipes: dict[str, LanePipe] = {}
        self._pipes_lock = threading.Lock()
        self._pipe_reader: PipeReader | None = None
        #: inbound connections that carried a PIPE record -> their served end
        self._pipes_served: dict[socket.socket, ServedPipe] = {}
        self._watch: Watch | None = None  # both ends' (made at the first use)

    # -- the caller's side --------------------------------------------------------------------

    def pipe_call(
        self,
        peer: Any,
        message_id: int,
        encoded: bytes,
        timeout: float | None,
        done: LaneDone,
        watchdog: Watchdog,
        kind: int = PIPE,
    ) -> bool:
        """Start a one-frame call (``kind`` PIPE: ``encoded`` is its frame; PLAIN: a PLAIN
        record's body, ``plain_call``) on ``peer``'s lane pipe (opened on an idle lane
        connection when there is none; never waits for one: without, one is opened in the
        background for the next call); ``done`` runs once with its reply or error. False when
        it was not taken (send it on the gRPC pipe)."""
        if not (peer.lane_pipe and self.serves(peer, peer.call_dial)):
            return False
        if kind == PLAIN and not peer.lane_plain:
            return False
        for _ in range(2):
            pipe = self._pipes.get(peer.name)
            if pipe is None or not pipe.alive:
                pipe = self._open_pipe(peer, watchdog)
                if pipe is None:
                    return False
            try:
                pipe.submit(message_id, encoded, timeout, done, kind)
                return True
            except PipeClosed:  # it failed or went idle just now: a new one takes the call
                continue
        return False

    def _open_pipe(self, peer: Any, watchdog: Watchdog) -> LanePipe | None:
        with self._pipes_lock:
            pipe = self._pipes.get(peer.name)
            if pipe is not None and pipe.alive:
                return pipe
            conn = self._take(peer.name, peer.bulk_address, True, None, False)
            if conn is None:
                return None
            set_timeout(conn, bulk.STALL_SECONDS)
            pipe = LanePipe(conn, peer.name, watchdog, self._frame_limit, self._pipe_ended)
            reader = self._pipe_reader
            if reader is None:
                reader = self._pipe_reader = PipeReader(
                    f"gradwire-lane-pipes-{self._ctx.name}", self._lane_watch()
                )
            if not reader.add(pipe):
                self._drop(peer.name, conn, True)
                return None
            self._pipes[peer.name] = pipe
            return pipe

    def _pipe_ended(self, pipe: LanePipe) -> None:
        with self._pipes_lock:
            if self._pipes.get(pipe.peer) is pipe:
                del self._pipes[pipe.peer]
        self._drop(pipe.peer, pipe.conn, True)

    def _lane_watch(self) -> Watch:
        with self._lock:
            if self._watch is None:
                self._watch = Watch(f"gradwire-lane-watch-{self._ctx.name}")
            return self._watch

    def _close_pipes(self) -> None:
        """At close: the reader ends (the connections were shut: what is pending fails), and
        the watch."""
        with self._pipes_lock:
            reader, self._pipe_reader = self._pipe_reader, None
        if reader is not None:
            reader.close()
        with self._lock:
            watch = self._watch
        if watch is not None:
            watch.close()

    # -- the callee's side --------------------------------------------------------------------

    def _serve_pipe(
        self, conn: socket.socket, peer: str, first: tuple[int, int] | None = None
    ) -> bool:
        """Lead the lane pipe on ``conn`` (``first``: the kind and size of the PIPE or PLAIN
        record whose header was just read) until the connection breaks (False), rests (True), or another thread
        leads it (True: a call served here was handed over), as ``_read_transfers``. Each call
        goes to ``serve_pipe`` as it comes; the replies are written by the threads that have
        them."""
        serve = self.serve_pipe
        if serve is None:
            log.warning("bulk lane of %s: %s opened a lane pipe; none served", self._ctx.name, peer)
            return False
        with self._lock:
            served = self._pipes_served.get(conn)
        if served is None:
            watch = self._lane_watch()
            served = ServedPipe(conn, watch, lambda: self._resume(conn, peer))
            with self._lock:
                self._pipes_served[conn] = served
            watch.add(served)
        me = served.lead()
        set_timeout(conn, bulk.STALL_SECONDS)  # the replies' too: one socket, one timeout
        buf, calls = served.buf, served.calls
        if first is not None:
            buf += RECORD.pack(*first)
        while True:
            try:
                records, at = take_records(buf, _CALLS, self._frame_limit)
                del buf[:at]
                calls.extend(records)
                while calls:
                    if not served.leads(me):
                        return True  # handed over: the new leader serves the calls left
                    kind, raw = calls.popleft()
                    serve(peer, kind, raw, served)
            except Exception as exc:  # noqa: BLE001 - a malformed call ends the pipe
                log.warning(
                    "bulk lane of %s: %s broke the lane pipe: %s; connection closed",
                    self._ctx.name,
                    peer,
                    exc,
                )
                return False
            if not served.leads(me):
                return True
            if not buf:
                if not readable(conn, LINGER_SECONDS):
                    if self._rest.add(conn, lambda c: self._resume(c, peer)):
                        return True
                    continue
            elif not readable(conn, bulk.STALL_SECONDS):
                return False  # a record cut short, and nothing more for that long
            try:
                chunk = os.read(conn.fileno(), READ_BYTES)
            except BlockingIOError:
                continue
            except (OSError, ValueError):
                return False
            if not chunk:
                return False
            if _traffic.counts is not None:
                _traffic.received(_traffic.BULK_LANE, len(chunk))
            buf += chunk

    def _served_ended(self, conn: socket.socket) -> None:
        """``conn``'s lane pipe (if it carried one) is over."""
        with self._lock:
            served = self._pipes_served.pop(conn, None)
            watch = self._watch
        if served is not None and watch is not None:
            watch.discard(served)
