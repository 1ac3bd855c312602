"""The bulk lane: a plain TCP listener per worker for the bytes of large tensors, and this
worker's connections to its peers' lanes (the wire half is :mod:`gradwire._wire.bulk`).

Why: over TCP a MiB-scale message through gRPC costs about twice what TensorPipe pays
(docs/architecture.md, "Where a call's time goes"); written straight from the array onto a
socket and read straight into the receiver's array, the bytes cost a copy into the kernel and
one out.

Protocol (docs/wire.md, "The bulk lane"), all integers little-endian:

1. The listener accepts and sends ``MAGIC`` and a fresh 32-byte nonce.
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

A sender keeps up to ``CONNECTIONS_PER_PEER`` connections to each peer, one transfer at a time
on each; a tensor finding them all busy, a peer whose lane cannot be reached or a connection
that fails mid-transfer, streams in its message's frames instead (nothing is lost). The
listener runs one thread that accepts and one per connection, each blocked in ``recv`` while
idle (no CPU); TCP keepalive ends a connection whose sender vanished. Under TLS there is no
bulk lane (the bytes stay in the encrypted gRPC stream).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import os
import secrets
import socket
import struct
import threading
import time
from typing import Any

import numpy as np

from ..._wire import bulk
from ..._wire.framing import byte_view
from ..cluster.context import WorkerContext
from ..cluster.events import AgentState, ClusterEvents
from .loop import in_loop_thread

__all__ = ["BulkLane", "MAGIC", "HANDSHAKE_SECONDS", "CONNECTIONS_PER_PEER", "mac"]

log = logging.getLogger(__name__)

MAGIC = b"GWBULK1\0"
_NONCE_BYTES = 32
_NAME_LEN = struct.Struct("<H")
_TRANSFER = struct.Struct("<QQ")
#: ``nbytes`` of a transfer header that cancels the transfer of that id (no bytes follow).
CANCEL = (1 << 64) - 1
#: Seconds a new connection has to complete its handshake (both sides).
HANDSHAKE_SECONDS = 5.0
#: Connections being authenticated at once; more are closed at accept.
MAX_HANDSHAKES = 64
#: Connections a listener keeps open at once.
MAX_CONNECTIONS = 1024
#: Connections a sender opens to one peer (a tensor finding all busy streams instead).
CONNECTIONS_PER_PEER = 4
#: After a peer's lane could not be reached, its tensors stream for this long before a retry.
UNREACHABLE_SECONDS = 30.0
#: Bytes received and not taken yet, at most (the inbox refuses past it).
INBOX_LIMIT_BYTES = 4 << 30
#: A transfer nobody took is dropped after this long (at least; twice the call timeout when
#: that is longer).
STALE_SECONDS = 300.0
_RECV_CHUNK = 1 << 20


def mac(token: str | None, nonce: bytes, name: bytes) -> bytes:
    """The handshake's proof that the sender knows the cluster token."""
    key = (token or "").encode()
    return hmac.new(key, MAGIC + nonce + name, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes | None:
    """``n`` bytes, or None when the peer closed the connection before the first one; with a
    ``deadline`` (``time.monotonic()``), TimeoutError past it however the bytes trickle in."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{got} of {n} bytes in the time allowed")
            sock.settimeout(left)
        k = sock.recv_into(view[got:])
        if not k:
            if got == 0:
                return None
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
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
    (a lane never sends after the handshake)."""
    try:
        sock.setblocking(False)
        try:
            sock.recv(1, socket.MSG_PEEK)
        finally:
            sock.settimeout(bulk.STALL_SECONDS)
    except BlockingIOError:  # nothing to read: open and quiet
        return True
    except OSError:
        return False
    return False  # b"" (closed) or unexpected bytes


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class _PeerLinks:
    """This worker's connections to one peer's lane."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.idle: list[socket.socket] = []
        self.open = 0
        self.unreachable_until = 0.0


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
        return peer

    def _read_transfers(self, conn: socket.socket, peer: str) -> None:
        inbox = self.inbox
        while True:
            conn.settimeout(None)  # idle: wait for the next transfer (keepalive ends dead peers)
            try:
                head = _recv_exact(conn, _TRANSFER.size)
            except (OSError, ConnectionError):
                return
            if head is None:
                return
            transfer_id, nbytes = _TRANSFER.unpack(head)
            if nbytes == CANCEL:
                inbox.cancel(peer, transfer_id)
                continue
            if nbytes > bulk.MAX_TRANSFER_BYTES:  # no sender announces that: not a lane peer
                inbox.begin(peer, transfer_id, nbytes)  # refused: a take says why
                log.warning(
                    "bulk lane of %s: %s announced a transfer of %d bytes; connection closed",
                    self._ctx.name,
                    peer,
                    nbytes,
                )
                return
            buf = inbox.begin(peer, transfer_id, nbytes)
            conn.settimeout(bulk.STALL_SECONDS)
            try:
                if buf is None:  # refused (a take says why) or cancelled: read and drop
                    _discard(conn, nbytes)
                    continue
                view = byte_view(buf)
                got = 0
                while got < nbytes:
                    k = conn.recv_into(view[got : got + _RECV_CHUNK])
                    if not k:
                        raise ConnectionError(f"connection closed after {got} of {nbytes} bytes")
                    got += k
                    inbox.progress(peer, transfer_id)
            except (OSError, ConnectionError) as exc:
                inbox.fail(peer, transfer_id, str(exc) or type(exc).__name__)
                return
            inbox.complete(peer, transfer_id)

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
        """Write ``parts`` on a connection to ``peer_name``'s lane; False when none could be
        had (or the I/O loop asked: it never waits on a socket) or the write failed."""
        if in_loop_thread():
            return False
        conn = self._take(peer_name, address)
        if conn is None:
            return False
        try:
            for part in parts:
                conn.sendall(part)
        except OSError as exc:
            log.info("bulk lane to %s: a write failed (%r); the tensors stream", peer_name, exc)
            self._drop(peer_name, conn)
            return False
        self._give_back(peer_name, conn)
        return True

    def _take(self, peer_name: str, address: str) -> socket.socket | None:
        with self._lock:
            if self._closed:
                return None
            links = self._links.get(peer_name)
            if links is None or links.address != address:
                links = self._links[peer_name] = _PeerLinks(address)
            while links.idle:
                conn = links.idle.pop()
                if _still_open(conn):
                    return conn
                conn.close()  # the peer closed it (it restarted, or refused us): open another
                links.open -= 1
            if links.open >= CONNECTIONS_PER_PEER or time.monotonic() < links.unreachable_until:
                return None
            links.open += 1
        try:
            return self._connect(address)
        except (OSError, ValueError) as exc:
            log.warning(
                "%s: cannot reach the bulk lane of %s at %s (%s); its tensors stream in the "
                "messages for %.0f s",
                self._ctx.name,
                peer_name,
                address,
                exc,
                UNREACHABLE_SECONDS,
            )
            with self._lock:
                links.open -= 1
                links.unreachable_until = time.monotonic() + UNREACHABLE_SECONDS
            return None

    def _connect(self, address: str) -> socket.socket:
        host, _, port = address.rpartition(":")
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=HANDSHAKE_SECONDS)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = _recv_exact(conn, len(MAGIC) + _NONCE_BYTES)
            if hello is None or not hello.startswith(MAGIC):
                raise ValueError("the listener is not a gradwire bulk lane")
            name = self._ctx.name.encode()
            conn.sendall(
                _NAME_LEN.pack(len(name)) + name + mac(self._token(), hello[len(MAGIC) :], name)
            )
            if _recv_exact(conn, 1) != b"\x01":
                raise ValueError("the peer refused this worker's cluster token")
            _keepalive(conn)
            conn.settimeout(bulk.STALL_SECONDS)
        except BaseException:
            conn.close()
            raise
        return conn

    def _give_back(self, peer_name: str, conn: socket.socket) -> None:
        with self._lock:
            links = self._links.get(peer_name)
            if links is not None and not self._closed:
                links.idle.append(conn)
                return
        conn.close()

    def _drop(self, peer_name: str, conn: socket.socket) -> None:
        conn.close()
        with self._lock:
            links = self._links.get(peer_name)
            if links is not None:
                links.open -= 1

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
        for conn in [c for link in links for c in link.idle] + conns:
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
                name: {"open": link.open, "idle": len(link.idle)}
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
