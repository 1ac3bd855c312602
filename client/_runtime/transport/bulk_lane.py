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
listener runs one thread that accepts and one per active connection; a connection quiet for
``LINGER_SECONDS`` rests on the one thread of ``lane_rest`` (no thread of its own, no CPU) until
it is readable again; TCP keepalive ends a connection whose sender vanished. Under TLS there is no
bulk lane (the bytes stay in the encrypted gRPC stream).

Calls on the lane (``lane_calls``): ``BulkLane`` mixes in ``LaneCalls``
(``transport/lane_calls.py``), which says why; the bytes on the socket are
``transport/lane_io.py``'s.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..._wire import bulk
from ..._wire.framing import byte_view
from ..cluster.context import WorkerContext
from ..cluster.events import AgentState, ClusterEvents
from .lane_calls import LaneCalls, LaneStatus, Pin
from .lane_io import (
    CALL,
    CANCEL,
    MAGIC,
    MAGIC_V1,
    NAME_LEN,
    NONCE_BYTES,
    PIPE,
    PLAIN,
    RECORD,
    STATUS,
    discard,
    fill,
    keepalive,
    mac,
    readable,
    recv_exact,
    send_parts,
    set_timeout,
    shut,
    still_open,
)
from .lane_pipe import LanePipes
from .lane_rest import LINGER_SECONDS, Rest
from .loop import in_loop_thread

__all__ = [
    "BulkLane",
    "LaneStatus",
    "MAGIC",
    "MAGIC_V1",
    "CALL",
    "STATUS",
    "HANDSHAKE_SECONDS",
    "ConnectBudget",
    "CONNECTIONS_PER_PEER",
    "CALL_CONNECTIONS_PER_PEER",
    "mac",
]

log = logging.getLogger(__name__)

#: Seconds a new connection has to complete its handshake (both sides).
HANDSHAKE_SECONDS = 5.0
#: Connections being authenticated at once; more are closed at accept.
MAX_HANDSHAKES = 64
#: Connections a listener keeps open at once.
MAX_CONNECTIONS = 1024
#: Connections the kernel queues before the listener accepts them: dozens of peers dialing
#: one loaded worker at once (the kernel caps it at ``net.core.somaxconn``).
LISTEN_BACKLOG = 1024
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


class _Conns:
    """This worker's connections to one peer's lane for one use (transfers, or calls)."""

    __slots__ = ("idle", "busy", "open", "limit")

    def __init__(self, limit: int) -> None:
        self.idle: list[socket.socket] = []
        self.busy: set[socket.socket] = set()
        self.open = 0
        self.limit = limit


class ConnectBudget:
    """What a call being encoded may spend waiting on the lane (:meth:`BulkLane.within`): the
    deadline its connections and writes give up by, and the seconds they took (the call's
    own timeout, which starts once it is encoded, loses them: pickling does not count, as in
    PyTorch, but waiting on the network does)."""

    __slots__ = ("deadline", "spent")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.spent = 0.0


class _PeerLinks:
    """This worker's connections to one peer's lane."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.transfers = _Conns(CONNECTIONS_PER_PEER)
        self.calls = _Conns(CALL_CONNECTIONS_PER_PEER)
        self.unreachable_until = 0.0
        #: False once the peer's listener said it takes no calls (``MAGIC_V1``).
        self.takes_calls = True
        #: A connection is being opened in the background (``BulkLane._warm``).
        self.warming = False

    def pool(self, calls: bool) -> _Conns:
        return self.calls if calls else self.transfers

    def conns(self) -> list[socket.socket]:
        """Every connection to the peer, idle or in use."""
        return [c for pool in (self.transfers, self.calls) for c in (*pool.idle, *pool.busy)]


class BulkLane(LaneCalls, LanePipes):
    """One worker's bulk lane: its listener (with the inbox) and its connections to peers.

    Args:
        ctx: the worker's identity, options and peers.
        events: its state changes (serve the route while running; close everything at the end).
        token: the cluster token as known now (it may come from the rendezvous).
    """

    def __init__(self, ctx: WorkerContext, events: ClusterEvents, token: Any) -> None:
        LaneCalls.__init__(self)
        LanePipes.__init__(self)
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
        #: Set once the agent runs: the token it checks proofs with is known only after its
        #: rendezvous (a follower learns a made-up token from rank 0's reply), and a peer that
        #: joined first may dial this lane before then.
        self._running = threading.Event()
        #: Quiet inbound connections wait here, on one thread for all of them.
        self._rest = Rest(f"gradwire-bulk-rest-{ctx.name}")
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
            sock.listen(LISTEN_BACKLOG)
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
        """Accept until the lane closes. Out of file descriptors or memory (EMFILE, ENFILE,
        ENOBUFS, ENOMEM), it backs off (up to a second) and tries again, logging once, and
        recovers when resources return; only the closing flag ends it."""
        pause = 0.0
        while True:
            try:
                conn, _ = listener.accept()
            except OSError as exc:
                if self._closed or listener.fileno() == -1:
                    return  # closed at shutdown
                if pause == 0.0:
                    log.warning(
                        "%s: the bulk lane's listener cannot accept a connection (%s); it tries "
                        "again until resources return (peers use gRPC meanwhile)",
                        self._ctx.name,
                        exc,
                    )
                pause = min(1.0, max(0.01, pause * 2))
                time.sleep(pause)
                continue
            if pause:
                log.info("%s: the bulk lane's listener accepts connections again", self._ctx.name)
                pause = 0.0
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
                if self._closed:
                    return
                continue
            try:
                threading.Thread(
                    target=self._serve, args=(conn,), name="gradwire-bulk-reader", daemon=True
                ).start()
            except RuntimeError as exc:  # no thread to be had: drop this one, go on
                log.warning("%s: bulk lane cannot serve a connection: %s", self._ctx.name, exc)
                with self._lock:
                    self._handshakes -= 1
                    self._conns.discard(conn)
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        peer = ""
        try:
            peer = self._handshake(conn)
        except (OSError, ValueError) as exc:
            log.debug("bulk lane of %s: handshake failed: %r", self._ctx.name, exc)
        finally:
            with self._lock:
                self._handshakes -= 1
            if not peer:  # refused, failed, or an unexpected error: nothing more on it
                self._drop_inbound(conn)
        if peer:
            self._reading(conn, peer)

    def _reading(self, conn: socket.socket, peer: str) -> None:
        """Read ``peer``'s records on ``conn`` until it breaks or rests (``lane_rest``)."""
        rested = False
        try:
            rested = self._read_transfers(conn, peer)
        finally:
            if not rested:
                self.inbox.disconnected(peer)
                self._drop_inbound(conn)

    def _resume(self, conn: socket.socket, peer: str) -> None:
        """A resting connection became readable: a reader thread for it again."""
        try:
            threading.Thread(
                target=self._reading, args=(conn, peer), name="gradwire-bulk-reader", daemon=True
            ).start()
        except RuntimeError as exc:  # no thread to be had: the peer's next use reconnects
            log.warning("bulk lane of %s: cannot read from %s: %s", self._ctx.name, peer, exc)
            self.inbox.disconnected(peer)
            self._drop_inbound(conn)

    def _drop_inbound(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.discard(conn)
        self._served_ended(conn)
        conn.close()

    def _handshake(self, conn: socket.socket) -> str:
        """The sender's name once it proved it knows the token, else ""."""
        deadline = time.monotonic() + HANDSHAKE_SECONDS  # for the whole handshake
        set_timeout(conn, HANDSHAKE_SECONDS)
        nonce = os.urandom(NONCE_BYTES)
        conn.sendall(MAGIC + nonce)
        head = recv_exact(conn, NAME_LEN.size, deadline)
        if head is None:
            return ""
        (n,) = NAME_LEN.unpack(head)
        if not 0 < n < 128:
            raise ValueError(f"a worker name of {n} bytes")
        name = recv_exact(conn, n, deadline)
        proof = recv_exact(conn, 32, deadline)
        if name is None or proof is None:
            return ""
        if not self._running.wait(max(0.0, deadline - time.monotonic())):
            return ""  # still joining when the handshake's time ran out: not a wrong token
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
        keepalive(conn)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # answers go back on it
        return peer

    def _read_transfers(self, conn: socket.socket, peer: str) -> bool:
        """Serve the records of ``peer`` on ``conn``; True once the connection rests (quiet
        for ``LINGER_SECONDS``: its thread ends, ``_resume`` starts another when it is
        readable), False when it broke or the peer broke the protocol."""
        inbox = self.inbox
        if conn in self._pipes_served:  # back from resting, or handed over: a lane pipe's
            return self._serve_pipe(conn, peer)
        while True:
            if not readable(conn, LINGER_SECONDS) and self._rest.add(
                conn, lambda c: self._resume(c, peer)
            ):
                return True
            try:
                set_timeout(conn, None)  # wait for the whole record (keepalive ends dead peers)
                head = recv_exact(conn, RECORD.size)
            except (OSError, ConnectionError):
                return False
            if head is None:
                return False
            transfer_id, nbytes = RECORD.unpack(head)
            if transfer_id == CALL:
                if not self._answer(conn, peer, nbytes):
                    return False
                continue
            if transfer_id in (PIPE, PLAIN):  # a lane pipe's: nothing else comes on it
                return self._serve_pipe(conn, peer, (transfer_id, nbytes))
            if transfer_id == STATUS:  # only a listener sends those
                log.warning(
                    "bulk lane of %s: %s sent a status record; connection closed",
                    self._ctx.name,
                    peer,
                )
                return False
            if nbytes == CANCEL:
                inbox.cancel(peer, transfer_id)
                continue
            if not self._receive(conn, peer, transfer_id, nbytes, None):
                return False

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
        set_timeout(conn, bulk.STALL_SECONDS)
        try:
            if buf is None:  # refused (a take says why) or cancelled: read and drop
                discard(conn, nbytes)
                return True
            got = fill(
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
        parts = (RECORD.pack(transfer_id, arr.nbytes), byte_view(arr))
        return transfer_id if self._write(peer_name, address, parts) else None

    def cancel(self, peer_name: str, transfer_ids: list[int]) -> None:
        """The wire's cancel: tell ``peer_name`` to drop transfers no message will name (on
        any connection; one that cannot be had leaves them to the peer's stale sweep)."""
        peer = self._ctx.peers.by_name.get(peer_name)
        if peer is not None and peer.bulk_address:
            headers = b"".join(RECORD.pack(i, CANCEL) for i in transfer_ids)
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
            self._send_parts(conn, parts)
        except OSError as exc:
            log.info("bulk lane to %s: a write failed (%r); the tensors stream", peer_name, exc)
            self._drop(peer_name, conn, calls=False)
            return False
        self._give_back(peer_name, conn, calls=False)
        return True

    def _send_parts(self, conn: socket.socket, parts: tuple[Any, ...]) -> None:
        """``send_parts``, given up by this thread's :meth:`within` deadline (a link cut under
        a call's tensors must not hold the call past its timeout), then the connection's
        usual stall limit again."""
        budget: ConnectBudget | None = getattr(self._local, "budget", None)
        if budget is None or budget.deadline is None:
            send_parts(conn, parts)
            return
        started = time.monotonic()
        set_timeout(conn, max(0.001, min(bulk.STALL_SECONDS, budget.deadline - started)))
        try:
            send_parts(conn, parts)
        finally:
            set_timeout(conn, bulk.STALL_SECONDS)
            budget.spent += time.monotonic() - started

    def _write_pinned(self, pin: Pin, parts: tuple[Any, ...]) -> bool:
        conn = pin.conn
        if conn is None:  # the connection being answered on broke
            return False
        try:
            self._send_parts(conn, parts)
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
        pin = self._local.pin = Pin(peer_name, None, False)
        try:
            yield
        finally:
            self._local.pin = prev
            if pin.conn is not None:
                self._give_back(peer_name, pin.conn, calls=True)

    @contextmanager
    def within(self, budget: ConnectBudget) -> Iterator[ConnectBudget]:
        """Connections this thread opens in the block, and its writes, give up by
        ``budget.deadline`` (a call's, in ``time.monotonic()``), so a call to a frozen or
        unreachable peer keeps its timeout; the time they take is added to ``budget.spent``."""
        prev = getattr(self._local, "budget", None)
        self._local.budget = budget
        try:
            yield budget
        finally:
            self._local.budget = prev

    def _connect_seconds(self, timeout: float | None) -> float:
        """How long a connection opened now may take: ``HANDSHAKE_SECONDS``, or less when the
        call (``timeout``, or the budget of :meth:`within`) has less left."""
        limit = HANDSHAKE_SECONDS if timeout is None else min(HANDSHAKE_SECONDS, timeout)
        budget: ConnectBudget | None = getattr(self._local, "budget", None)
        if budget is not None and budget.deadline is not None:
            limit = min(limit, budget.deadline - time.monotonic())
        return limit

    def _take(
        self,
        peer_name: str,
        address: str,
        calls: bool = False,
        timeout: float | None = None,
        connect: bool = True,
    ) -> socket.socket | None:
        """An idle connection to ``peer_name``'s lane, or a new one (within ``timeout`` and the
        thread's :meth:`within` deadline; not at all unless ``connect``: housekeeping never
        waits on a peer's handshake); None when none can be had."""
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
                if still_open(conn):
                    pool.busy.add(conn)
                    return conn
                conn.close()  # the peer closed it (it restarted, or refused us): open another
                pool.open -= 1
            if pool.open >= pool.limit or time.monotonic() < links.unreachable_until:
                return None
            seconds = self._connect_seconds(timeout)
            if not connect:
                if not links.warming:  # open one meanwhile, off this thread, for the next call
                    links.warming = True
                    threading.Thread(
                        target=self._warm,
                        args=(peer_name, address, calls, links),
                        name=f"gradwire-bulk-connect-{peer_name}",
                        daemon=True,
                    ).start()
                return None
            if seconds <= 0:
                return None
            pool.open += 1
        budget: ConnectBudget | None = getattr(self._local, "budget", None)
        started = time.monotonic()
        try:
            conn, takes_calls = self._connect(address, seconds)
        except (OSError, ValueError) as exc:
            if budget is not None:
                budget.spent += time.monotonic() - started
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
        if budget is not None:
            budget.spent += time.monotonic() - started
        with self._lock:
            if calls and not takes_calls:  # a first-version listener: no calls on its lane
                links.takes_calls = False
                pool.open -= 1
            else:
                pool.busy.add(conn)
                return conn
        conn.close()
        return None

    def _warm(self, peer_name: str, address: str, calls: bool, links: _PeerLinks) -> None:
        """Open a connection to ``peer_name``'s lane and leave it idle (for housekeeping, whose
        senders never wait on a handshake)."""
        try:
            conn = self._take(peer_name, address, calls)
            if conn is not None:
                self._give_back(peer_name, conn, calls)
        finally:
            links.warming = False

    def _connect(self, address: str, seconds: float) -> tuple[socket.socket, bool]:
        """An authenticated connection to the lane at ``address`` within ``seconds`` (connect
        and greeting together), and whether that lane takes calls (not a first-version one)."""
        host, _, port = address.rpartition(":")
        deadline = time.monotonic() + seconds
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=seconds)
        try:
            conn.settimeout(max(0.001, deadline - time.monotonic()))
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = recv_exact(conn, len(MAGIC) + NONCE_BYTES)
            magic = b"" if hello is None else hello[: len(MAGIC)]
            if hello is None or magic not in (MAGIC, MAGIC_V1):
                raise ValueError("the listener is not a gradwire bulk lane")
            name = self._ctx.name.encode()
            proof = mac(self._token(), hello[len(MAGIC) :], name, magic)
            conn.sendall(NAME_LEN.pack(len(name)) + name + proof)
            if recv_exact(conn, 1) != b"\x01":
                raise ValueError("the peer refused this worker's cluster token")
            keepalive(conn)
            set_timeout(conn, bulk.STALL_SECONDS)
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
        for conn in links.conns():
            shut(conn)  # a thread using one wakes and closes it
        for conn in (*links.transfers.idle, *links.calls.idle):
            conn.close()
        self._fail_parked(peer_name, f"worker {peer_name!r} was lost")

    # -- life cycle ----------------------------------------------------------------------------

    def _on_state(self, state: AgentState) -> None:
        if state == AgentState.RUNNING:
            bulk.install(self.route, self.cancel, self.inbox)
            self._running.set()
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
        self._rest.close()
        for conn in [c for link in links for c in link.conns()] + conns:
            shut(conn)
            conn.close()
        self._close_pipes()
        self._fail_parked(None, "the bulk lane closed")
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
        resting = self._rest.resting()
        return {
            "bulk_lane": {
                "counters": bulk.stats(),
                "inbox": self.inbox.info(),
                "connections_out": links,
                "connections_in": inbound,
                "connections_resting": resting,
                "parked": self.parked_count(),
            }
        }
