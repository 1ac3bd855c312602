"""The bulk lane: a plain TCP listener per worker for the bytes of large tensors, and this
worker's connections to its peers' lanes (the wire half is :mod:`gradwire._wire.bulk`).

Why: over TCP a MiB-scale message through gRPC costs about twice what TensorPipe pays
(docs/architecture.md, "Where a call's time goes"); written straight from the array onto a
socket and read straight into the receiver's array, the bytes cost a copy into the kernel and
one out.

Protocol (docs/wire.md, "The bulk lane"), all integers little-endian:

1. The listener accepts and sends ``MAGIC`` and a fresh 32-byte nonce (``MAGIC_V1`` from a
   listener of the first version, which takes transfers but no calls: a sender then sends
   its calls by gRPC).
2. The sender answers ``[u16 n][n bytes: its worker name][32 bytes: HMAC-SHA256(token, MAGIC +
   nonce + name)]``; the listener checks it (constant time) and answers one byte, 1, or
   closes the connection. Nothing else is read from a connection before that, and the
   handshake has ``HANDSHAKE_SECONDS``; at most ``MAX_HANDSHAKES`` run at once.
3. Then transfers, one after the other: ``[u64 transfer id][u64 nbytes][nbytes bytes]``. The
   listener checks the size against the inbox's bounds before it allocates, and reads the
   bytes straight into the new array; a refused (or cancelled) transfer's bytes are read and
   dropped, so the connection's next transfers still arrive; a size no sender announces (over
   ``MAX_TRANSFER_BYTES``) closes the connection. ``nbytes`` = ``CANCEL`` (2**64 - 1, no bytes
   follow) cancels the transfer of that id: its message will not come (its encoding failed).
4. Calls (docs/wire.md, "Calls on the lane"): ``[u64 CALL][u64 n][n bytes: a frame]`` is a
   one-frame call, served by the listener's thread for that connection as the fast lane serves
   a CallStream frame (``serve_call``, installed by the server); the answer comes back on the
   same connection: the reply's transfers, then ``[u64 CALL][u64 n][the reply frame]``, or
   ``[u64 STATUS][u64 n][u32 code][details]`` for what would have been the call's gRPC
   status. The listener sends nothing else, and only while a call is being answered.

A sender keeps up to ``CONNECTIONS_PER_PEER`` connections to each peer, one transfer at a time
on each; a tensor finding them all busy, a peer whose lane cannot be reached or a connection
that fails mid-transfer, streams in its message's frames instead (nothing is lost). The
listener runs one thread that accepts and one per connection, each blocked in ``recv`` while
idle (no CPU); TCP keepalive ends a connection whose sender vanished. Under TLS there is no
bulk lane (the bytes stay in the encrypted gRPC stream).

Why calls ride it too (issue 19): over gRPC a message costs each side several thread
hand-offs (gRPC's poller, the stream's thread, the waiting caller), and on a 2-core machine
each one costs more than the Python it runs. On a lane connection the caller's own thread
writes the call (its tensors' bytes first, on the same connection, see ``pinned``) and reads
the answer, and the callee's reader thread, woken by the kernel, serves it where it is: one
wake-up per side, as a plain socket echo. A caller keeps at most ``CALL_CONNECTIONS_PER_PEER``
connections for calls to one peer, one call at a time on each; a call finding them all busy,
or a peer whose lane cannot be reached, goes by gRPC as before.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import os
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any

import grpc
import numpy as np

from ..._wire import bulk
from ..._wire.framing import Frame, byte_view, decode_frame, encode_frame
from ..calls.streams import StreamFailed
from ..cluster.context import WorkerContext
from ..cluster.events import AgentState, ClusterEvents
from ..cluster.workers import Peer
from .loop import in_loop_thread

__all__ = [
    "BulkLane",
    "LaneStatus",
    "MAGIC",
    "MAGIC_V1",
    "HANDSHAKE_SECONDS",
    "CONNECTIONS_PER_PEER",
    "CALL_CONNECTIONS_PER_PEER",
    "mac",
]

log = logging.getLogger(__name__)

MAGIC = b"GWBULK2\0"
#: The first version's listener: transfers only (its peers' calls go by gRPC).
MAGIC_V1 = b"GWBULK1\0"
_NONCE_BYTES = 32
_NAME_LEN = struct.Struct("<H")
_TRANSFER = struct.Struct("<QQ")
#: ``nbytes`` of a transfer header that cancels the transfer of that id (no bytes follow).
CANCEL = (1 << 64) - 1
#: The "transfer id" of a record carrying a call's frame (to the listener) or its reply frame
#: (back to the caller).
CALL = (1 << 64) - 2
#: The "transfer id" of a record carrying what would have been a call's gRPC status: ``[u32
#: code][details, UTF-8]`` (the listener's answer when it could not serve the call).
STATUS = (1 << 64) - 3
_CODE = struct.Struct("<I")
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
#: Seconds a new connection has to complete its handshake (both sides).
HANDSHAKE_SECONDS = 5.0
#: Connections being authenticated at once; more are closed at accept.
MAX_HANDSHAKES = 64
#: Connections a listener keeps open at once.
MAX_CONNECTIONS = 1024
#: Connections a sender opens to one peer (a tensor finding all busy streams instead).
CONNECTIONS_PER_PEER = 4
#: Connections a caller keeps for calls to one peer (more calls at once go by gRPC).
CALL_CONNECTIONS_PER_PEER = 8
#: After a peer's lane could not be reached, its tensors stream for this long before a retry.
UNREACHABLE_SECONDS = 30.0
#: Bytes received and not taken yet, at most (the inbox refuses past it).
INBOX_LIMIT_BYTES = 4 << 30
#: A transfer nobody took is dropped after this long (at least; twice the call timeout when
#: that is longer).
STALE_SECONDS = 300.0
_RECV_CHUNK = 1 << 20
_RDHUP = getattr(select, "POLLRDHUP", 0)
#: Parts of a write up to this many bytes are joined into one ``sendall``.
_JOIN_BYTES = 64 << 10


def mac(token: str | None, nonce: bytes, name: bytes, magic: bytes = MAGIC) -> bytes:
    """The handshake's proof that the sender knows the cluster token (over the ``magic`` the
    listener sent)."""
    key = (token or "").encode()
    return hmac.new(key, magic + nonce + name, hashlib.sha256).digest()


def _fill(
    sock: socket.socket,
    view: memoryview,
    deadline: float | None = None,
    progress: Callable[[], None] | None = None,
    cap: float = float("inf"),
) -> int:
    """Read into ``view`` until it is full; the number of bytes read, fewer only when the peer
    closed the connection first. With a ``deadline`` (``time.monotonic()``), TimeoutError past
    it however the bytes trickle in (each wait at most ``cap`` seconds); ``progress()`` after
    each read."""
    got, n = 0, len(view)
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{got} of {n} bytes in the time allowed")
            sock.settimeout(min(left, cap))
        k = sock.recv_into(view[got : got + _RECV_CHUNK])
        if not k:
            return got
        got += k
        if progress is not None:
            progress()
    return got


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes | None:
    """``n`` bytes, or None when the peer closed the connection before the first one; with a
    ``deadline`` (``time.monotonic()``), TimeoutError past it however the bytes trickle in."""
    buf = bytearray(n)
    got = _fill(sock, memoryview(buf), deadline)
    if got < n:
        if got == 0:
            return None
        raise ConnectionError(f"connection closed after {got} of {n} bytes")
    return bytes(buf)


def _discard(sock: socket.socket, nbytes: int) -> None:
    """Read and drop ``nbytes`` (a refused or cancelled transfer; the next one follows)."""
    scratch = memoryview(bytearray(min(nbytes, _RECV_CHUNK) or 1))
    while nbytes:
        k = sock.recv_into(scratch[: min(nbytes, len(scratch))])
        if not k:
            raise ConnectionError("connection closed in a dropped transfer")
        nbytes -= k


def _still_open(sock: socket.socket) -> bool:
    """Whether an idle connection is still usable: the peer neither closed it nor sent on it
    (a lane sends nothing on an idle connection). One ``poll`` with no wait: readable means
    closed, reset, or bytes nobody asked for."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI | _RDHUP)
        return not poller.poll(0)
    except (OSError, ValueError):  # closed here (fileno -1)
        return False


def _status(code: grpc.StatusCode, details: str) -> tuple[bytes, bytes]:
    """A STATUS record: what a call's gRPC status would have been."""
    body = _CODE.pack(code.value[0]) + details.encode("utf-8", "replace")
    return _TRANSFER.pack(STATUS, len(body)), body


def _send_parts(conn: socket.socket, parts: tuple[Any, ...]) -> None:
    """Write ``parts`` in order; a small message in one segment (headers and frames are
    joined: with TCP_NODELAY each ``sendall`` would be a packet of its own)."""
    if len(parts) > 1 and sum(len(p) for p in parts[1:]) <= _JOIN_BYTES:
        conn.sendall(b"".join(parts))
        return
    for part in parts:
        conn.sendall(part)


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class _Conns:
    """This worker's connections to one peer's lane for one use (transfers, or calls)."""

    __slots__ = ("idle", "busy", "open", "limit")

    def __init__(self, limit: int) -> None:
        self.idle: list[socket.socket] = []
        self.busy: set[socket.socket] = set()
        self.open = 0
        self.limit = limit


class _PeerLinks:
    """This worker's connections to one peer's lane."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.transfers = _Conns(CONNECTIONS_PER_PEER)
        self.calls = _Conns(CALL_CONNECTIONS_PER_PEER)
        self.unreachable_until = 0.0
        #: False once the peer's listener said it takes no calls (``MAGIC_V1``).
        self.takes_calls = True

    def pool(self, calls: bool) -> _Conns:
        return self.calls if calls else self.transfers


class _Pin:
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

    def __init__(self, conn: socket.socket, pin: _Pin | None, deadline: float | None) -> None:
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


class BulkLane:
    """One worker's bulk lane: its listener (with the inbox) and its connections to peers.

    Args:
        ctx: the worker's identity, options and peers.
        events: its state changes (serve the route while running; close everything at the end).
        token: the cluster token as known now (it may come from the rendezvous).
    """

    def __init__(self, ctx: WorkerContext, events: ClusterEvents, token: Any) -> None:
        self._ctx = ctx
        self._token = token
        options = ctx.options
        self.inbox = bulk.Inbox(
            INBOX_LIMIT_BYTES,
            options.max_message_bytes,
            max(STALE_SECONDS, 2 * options.rpc_timeout),
        )
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._links: dict[str, _PeerLinks] = {}
        self._conns: set[socket.socket] = set()
        self._handshakes = 0
        self._closed = False
        self._local = threading.local()
        #: Largest frame a call record may carry (as the gRPC servers' message limit).
        self._frame_limit = max(options.chunk_bytes, options.single_frame_bytes) + (1 << 20)
        #: ``serve_call(caller name, raw frame) -> encoded reply frame`` (raises LaneStatus):
        #: how the server serves a call that came on the lane (None: calls are refused).
        self.serve_call: Callable[[str, bytes], bytes] | None = None
        # Transfer ids: from a random start, so a restarted worker of the same name does not
        # reuse the ids of its predecessor that a receiver may still remember.
        self._ids = itertools.count(secrets.randbits(62))
        events.on_state(self._on_state)

    # -- the listener --------------------------------------------------------------------------

    def listen(self, host: str, advertise_host: str) -> str:
        """Bind a listener on ``host`` (any free port) and start accepting; returns the
        ``host:port`` to advertise, or "" when it cannot be bound (tensors then stream)."""
        bind = host.strip("[]") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((bind, self._ctx.options.bulk_port))
            sock.listen(128)
        except OSError as exc:
            log.warning("%s: no bulk lane, cannot listen on %s: %s", self._ctx.name, bind, exc)
            return ""
        self._listener = sock
        port = sock.getsockname()[1]
        threading.Thread(
            target=self._accept, args=(sock,), name=f"gradwire-bulk-accept-{port}", daemon=True
        ).start()
        adv = advertise_host.strip("[]")
        return f"[{adv}]:{port}" if ":" in adv else f"{adv}:{port}"

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed at shutdown
                return
            with self._lock:
                refuse = (
                    self._closed
                    or self._handshakes >= MAX_HANDSHAKES
                    or len(self._conns) >= MAX_CONNECTIONS
                )
                if not refuse:
                    self._handshakes += 1
                    self._conns.add(conn)
            if refuse:
                conn.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="gradwire-bulk-reader", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        peer = ""
        try:
            peer = self._handshake(conn)
        except (OSError, ValueError) as exc:
            log.debug("bulk lane of %s: handshake failed: %r", self._ctx.name, exc)
        finally:
            with self._lock:
                self._handshakes -= 1
        try:
            if peer:
                try:
                    self._read_transfers(conn, peer)
                finally:
                    self.inbox.disconnected(peer)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handshake(self, conn: socket.socket) -> str:
        """The sender's name once it proved it knows the token, else ""."""
        deadline = time.monotonic() + HANDSHAKE_SECONDS  # for the whole handshake
        conn.settimeout(HANDSHAKE_SECONDS)
        nonce = os.urandom(_NONCE_BYTES)
        conn.sendall(MAGIC + nonce)
        head = _recv_exact(conn, _NAME_LEN.size, deadline)
        if head is None:
            return ""
        (n,) = _NAME_LEN.unpack(head)
        if not 0 < n < 128:
            raise ValueError(f"a worker name of {n} bytes")
        name = _recv_exact(conn, n, deadline)
        proof = _recv_exact(conn, 32, deadline)
        if name is None or proof is None:
            return ""
        token = self._token()
        if not hmac.compare_digest(proof, mac(token, nonce, name)):
            log.warning(
                "bulk lane of %s: refused a connection: wrong cluster token", self._ctx.name
            )
            return ""
        peer = name.decode("utf-8", "replace")
        self.inbox.connected(peer)  # before the sender may send a message naming a transfer
        try:
            conn.sendall(b"\x01")
        except OSError:
            self.inbox.disconnected(peer)
            raise
        _keepalive(conn)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # answers go back on it
        return peer

    def _read_transfers(self, conn: socket.socket, peer: str) -> None:
        inbox = self.inbox
        while True:
            conn.settimeout(None)  # idle: wait for the next record (keepalive ends dead peers)
            try:
                head = _recv_exact(conn, _TRANSFER.size)
            except (OSError, ConnectionError):
                return
            if head is None:
                return
            transfer_id, nbytes = _TRANSFER.unpack(head)
            if transfer_id == CALL:
                if not self._answer(conn, peer, nbytes):
                    return
                continue
            if transfer_id == STATUS:  # only a listener sends those
                log.warning(
                    "bulk lane of %s: %s sent a status record; connection closed",
                    self._ctx.name,
                    peer,
                )
                return
            if nbytes == CANCEL:
                inbox.cancel(peer, transfer_id)
                continue
            if not self._receive(conn, peer, transfer_id, nbytes, None):
                return

    def _receive(
        self,
        conn: socket.socket,
        peer: str,
        transfer_id: int,
        nbytes: int,
        deadline: float | None,
    ) -> bool:
        """Read the bytes of the transfer whose header just came into the inbox; False when
        the connection cannot be used any more (it broke, or the peer broke the protocol).
        Raises TimeoutError past ``deadline`` (the transfer then failed)."""
        inbox = self.inbox
        if nbytes > bulk.MAX_TRANSFER_BYTES:  # no sender announces that: not a lane peer
            inbox.begin(peer, transfer_id, nbytes)  # refused: a take says why
            log.warning(
                "bulk lane of %s: %s announced a transfer of %d bytes; connection closed",
                self._ctx.name,
                peer,
                nbytes,
            )
            return False
        buf = inbox.begin(peer, transfer_id, nbytes)
        conn.settimeout(bulk.STALL_SECONDS)
        try:
            if buf is None:  # refused (a take says why) or cancelled: read and drop
                _discard(conn, nbytes)
                return True
            got = _fill(
                conn,
                byte_view(buf),
                deadline,
                lambda: inbox.progress(peer, transfer_id),
                bulk.STALL_SECONDS,
            )
            if got < nbytes:
                raise ConnectionError(f"connection closed after {got} of {nbytes} bytes")
        except (OSError, ConnectionError) as exc:
            inbox.fail(peer, transfer_id, str(exc) or type(exc).__name__)
            if deadline is not None and isinstance(exc, TimeoutError):
                raise
            return False
        inbox.complete(peer, transfer_id)
        return True

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
            raw = _recv_exact(conn, nbytes)
        except (OSError, ConnectionError):
            return False
        if raw is None:
            return False
        serve = self.serve_call
        if serve is None:
            answer = _status(grpc.StatusCode.UNIMPLEMENTED, "this worker serves no calls here")
        else:
            prev = getattr(self._local, "pin", None)
            # The reply's tensors go on this connection, before the reply that names them.
            self._local.pin = _Pin(peer, conn, inbound=True)
            try:
                reply = serve(peer, raw)
                answer = (_TRANSFER.pack(CALL, len(reply)), reply)
                bulk.count("calls_served")
            except LaneStatus as st:
                answer = _status(st.code, st.details)
            except Exception as exc:  # noqa: BLE001 - the caller gets it as INTERNAL
                log.error("bulk lane of %s: serving a call failed: %r", self._ctx.name, exc)
                answer = _status(grpc.StatusCode.INTERNAL, f"serving the call failed: {exc!r}")
            finally:
                pin, self._local.pin = self._local.pin, prev
            if pin.conn is None:  # a write of the reply's tensors failed: the connection broke
                return False
        try:
            conn.settimeout(bulk.STALL_SECONDS)
            _send_parts(conn, answer)
        except OSError:
            return False
        return True

    # -- the sending side ----------------------------------------------------------------------

    def route(self, peer_name: str, nbytes: int) -> bulk.Send | None:
        """The wire's route: how to send ``nbytes`` to ``peer_name``, or None to stream them."""
        if nbytes < self._ctx.options.bulk_threshold_bytes or peer_name == self._ctx.name:
            return None
        peer = self._ctx.peers.by_name.get(peer_name)
        if peer is None or not peer.bulk_address:
            return None
        return lambda arr: self._send(peer_name, peer.bulk_address, arr)

    def _send(self, peer_name: str, address: str, arr: np.ndarray) -> int | None:
        transfer_id = next(self._ids) & 0xFFFF_FFFF_FFFF_FFFF
        parts = (_TRANSFER.pack(transfer_id, arr.nbytes), byte_view(arr))
        return transfer_id if self._write(peer_name, address, parts) else None

    def cancel(self, peer_name: str, transfer_ids: list[int]) -> None:
        """The wire's cancel: tell ``peer_name`` to drop transfers no message will name (on
        any connection; one that cannot be had leaves them to the peer's stale sweep)."""
        peer = self._ctx.peers.by_name.get(peer_name)
        if peer is not None and peer.bulk_address:
            headers = b"".join(_TRANSFER.pack(i, CANCEL) for i in transfer_ids)
            self._write(peer_name, peer.bulk_address, (headers,))

    def _write(self, peer_name: str, address: str, parts: tuple[Any, ...]) -> bool:
        """Write ``parts`` on a connection to ``peer_name``'s lane (this thread's pinned one,
        if any); False when none could be had (or the I/O loop asked: it never waits on a
        socket) or the write failed."""
        if in_loop_thread():
            return False
        pin = getattr(self._local, "pin", None)
        if pin is not None and pin.peer == peer_name:
            if pin.conn is None and not pin.inbound:
                pin.conn = self._take(peer_name, address, calls=True)
            if pin.conn is not None or pin.inbound:
                return self._write_pinned(pin, parts)
            # No connection for calls (all busy, or the peer takes none): a transfer's own.
        conn = self._take(peer_name, address, calls=False)
        if conn is None:
            return False
        try:
            _send_parts(conn, parts)
        except OSError as exc:
            log.info("bulk lane to %s: a write failed (%r); the tensors stream", peer_name, exc)
            self._drop(peer_name, conn, calls=False)
            return False
        self._give_back(peer_name, conn, calls=False)
        return True

    def _write_pinned(self, pin: _Pin, parts: tuple[Any, ...]) -> bool:
        conn = pin.conn
        if conn is None:  # the connection being answered on broke
            return False
        try:
            _send_parts(conn, parts)
        except OSError as exc:
            log.info("bulk lane to %s: a write failed (%r); the tensors stream", pin.peer, exc)
            pin.conn = None
            if not pin.inbound:
                self._drop(pin.peer, conn, calls=True)
            return False
        return True

    @contextmanager
    def pinned(self, peer_name: str) -> Iterator[None]:
        """Within the block, this thread's transfers to ``peer_name`` and the call it sends
        with :meth:`exchange` go on one connection (taken at the first write): the callee's
        reader reads the tensors' bytes before the frame that names them, with no wait for
        another connection's reader. Blocks nest (the innermost one for a peer counts)."""
        prev = getattr(self._local, "pin", None)
        pin = self._local.pin = _Pin(peer_name, None, False)
        try:
            yield
        finally:
            self._local.pin = prev
            if pin.conn is not None:
                self._give_back(peer_name, pin.conn, calls=True)

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
        found: _Pin | None = getattr(self._local, "pin", None)
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
        self, peer: Peer, raw: bytes, timeout: float | None, pin: _Pin | None
    ) -> _Sent | None:
        """Write the call record of ``raw`` on a call connection to ``peer`` (``pin``'s, if
        any); None when it could not be (nothing of it reached the callee as a call)."""
        if in_loop_thread():
            return None
        name = peer.name
        conn = pin.conn if pin is not None else None
        if conn is None:
            conn = self._take(name, peer.bulk_address, calls=True)
            if conn is None:
                return None
            if pin is not None:
                pin.conn = conn  # given back when the pin ends
        sent = _Sent(conn, pin, None if timeout is None else time.monotonic() + timeout)
        try:
            conn.settimeout(bulk.STALL_SECONDS if timeout is None else max(timeout, 0.001))
            _send_parts(conn, (_TRANSFER.pack(CALL, len(raw)), raw))
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
            self._give_back(name, sent.conn, calls=True)
        bulk.count("calls")
        return reply

    def _failed(self, name: str, sent: _Sent, connected: bool = True) -> None:
        """The call ``sent`` ended without its answer: its connection goes."""
        if connected:
            self.inbox.disconnected(name)
        self._drop(name, sent.conn, calls=True)
        if sent.pin is not None:
            sent.pin.conn = None

    def _read_reply(self, conn: socket.socket, peer: str, deadline: float | None) -> Frame:
        """The answer of the call just sent on ``conn``: its transfers into the inbox, then
        the reply frame (or the status, raised as StreamFailed)."""
        while True:
            if deadline is None:
                conn.settimeout(None)  # as a stream with no deadline: until the connection ends
            head = _recv_exact(conn, _TRANSFER.size, deadline)
            if head is None:
                raise ConnectionError("the peer closed the connection")
            record, nbytes = _TRANSFER.unpack(head)
            if record == CALL or record == STATUS:
                if nbytes > self._frame_limit:
                    raise ConnectionError(f"an answer of {nbytes} bytes")
                body = _recv_exact(conn, nbytes, deadline) if nbytes else b""
                if body is None:
                    raise ConnectionError("the peer closed the connection")
                if record == CALL:
                    return decode_frame(body)
                (code,) = _CODE.unpack_from(body)
                status = _STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN)
                raise StreamFailed(status, body[_CODE.size :].decode("utf-8", "replace"))
            if nbytes == CANCEL:
                self.inbox.cancel(peer, record)
            elif not self._receive(conn, peer, record, nbytes, deadline):
                raise ConnectionError("a transfer of the answer failed")

    def _take(self, peer_name: str, address: str, calls: bool = False) -> socket.socket | None:
        with self._lock:
            if self._closed:
                return None
            links = self._links.get(peer_name)
            if links is None or links.address != address:
                links = self._links[peer_name] = _PeerLinks(address)
            if calls and not links.takes_calls:
                return None
            pool = links.pool(calls)
            while pool.idle:
                conn = pool.idle.pop()
                if _still_open(conn):
                    pool.busy.add(conn)
                    return conn
                conn.close()  # the peer closed it (it restarted, or refused us): open another
                pool.open -= 1
            if pool.open >= pool.limit or time.monotonic() < links.unreachable_until:
                return None
            pool.open += 1
        try:
            conn, takes_calls = self._connect(address)
        except (OSError, ValueError) as exc:
            log.warning(
                "%s: cannot reach the bulk lane of %s at %s (%s); for %.0f s its tensors "
                "stream in the messages and its calls go by gRPC",
                self._ctx.name,
                peer_name,
                address,
                exc,
                UNREACHABLE_SECONDS,
            )
            with self._lock:
                pool.open -= 1
                links.unreachable_until = time.monotonic() + UNREACHABLE_SECONDS
            return None
        with self._lock:
            if calls and not takes_calls:  # a first-version listener: no calls on its lane
                links.takes_calls = False
                pool.open -= 1
            else:
                pool.busy.add(conn)
                return conn
        conn.close()
        return None

    def _connect(self, address: str) -> tuple[socket.socket, bool]:
        """An authenticated connection to the lane at ``address``, and whether that lane
        takes calls (not a first-version one)."""
        host, _, port = address.rpartition(":")
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=HANDSHAKE_SECONDS)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = _recv_exact(conn, len(MAGIC) + _NONCE_BYTES)
            magic = b"" if hello is None else hello[: len(MAGIC)]
            if hello is None or magic not in (MAGIC, MAGIC_V1):
                raise ValueError("the listener is not a gradwire bulk lane")
            name = self._ctx.name.encode()
            proof = mac(self._token(), hello[len(MAGIC) :], name, magic)
            conn.sendall(_NAME_LEN.pack(len(name)) + name + proof)
            if _recv_exact(conn, 1) != b"\x01":
                raise ValueError("the peer refused this worker's cluster token")
            _keepalive(conn)
            conn.settimeout(bulk.STALL_SECONDS)
        except BaseException:
            conn.close()
            raise
        return conn, magic == MAGIC

    def _give_back(self, peer_name: str, conn: socket.socket, calls: bool = False) -> None:
        with self._lock:
            links = self._links.get(peer_name)
            if links is not None and not self._closed:
                pool = links.pool(calls)
                if conn in pool.busy:
                    pool.busy.discard(conn)
                    pool.idle.append(conn)
                    return
        conn.close()  # dropped meanwhile (the peer was lost, or the lane closed)

    def _drop(self, peer_name: str, conn: socket.socket, calls: bool = False) -> None:
        conn.close()
        with self._lock:
            links = self._links.get(peer_name)
            if links is not None:
                pool = links.pool(calls)
                if conn in pool.busy:
                    pool.busy.discard(conn)
                    pool.open -= 1

    def drop_peer(self, peer_name: str) -> None:
        """End every connection to ``peer_name`` (it was lost): a call waiting on one fails
        at once instead of waiting for TCP keepalive."""
        with self._lock:
            links = self._links.pop(peer_name, None)
        if links is None:
            return
        for pool in (links.transfers, links.calls):
            for conn in pool.idle + list(pool.busy):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                if conn in pool.idle:
                    conn.close()

    # -- life cycle ----------------------------------------------------------------------------

    def _on_state(self, state: AgentState) -> None:
        if state == AgentState.RUNNING:
            bulk.install(self.route, self.cancel, self.inbox)
        elif state == AgentState.SHUTDOWN:
            self.close()

    def close(self) -> None:
        """Stop listening, end every connection, and fail what waits for a transfer."""
        with self._lock:
            self._closed = True
            links, self._links = list(self._links.values()), {}
            conns = list(self._conns)
        bulk.uninstall(self.inbox)
        if self._listener is not None:
            self._listener.close()
        outbound = [
            c
            for link in links
            for pool in (link.transfers, link.calls)
            for c in pool.idle + list(pool.busy)
        ]
        for conn in outbound + conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self.inbox.close()

    def debug_info(self) -> dict[str, Any]:
        """The ``bulk_lane`` entry of ``Agent.debug_info()``."""
        with self._lock:
            links = {
                name: {
                    "open": link.transfers.open,
                    "idle": len(link.transfers.idle),
                    "call_connections": link.calls.open,
                }
                for name, link in self._links.items()
            }
            inbound = len(self._conns)
        return {
            "bulk_lane": {
                "counters": bulk.stats(),
                "inbox": self.inbox.info(),
                "connections_out": links,
                "connections_in": inbound,
            }
        }
