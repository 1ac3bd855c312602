"""The bulk lane's bytes on the socket (docs/wire.md, "The bulk lane" and "Calls on the
lane"): the handshake's magic and proof, the record header ``[u64 id][u64 n]`` and its special
ids (CANCEL, CALL, STATUS), and the socket helpers both ends use. No state: the connections,
the inbox and the calls live in ``bulk_lane`` and ``lane_calls``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import grpc

from ... import _traffic

__all__ = [
    "MAGIC",
    "MAGIC_V1",
    "NONCE_BYTES",
    "NAME_LEN",
    "RECORD",
    "CANCEL",
    "CALL",
    "STATUS",
    "PIPE",
    "PLAIN",
    "PLAIN_CALL",
    "PLAIN_REPLY",
    "CODE",
    "STATUS_CODES",
    "RECV_CHUNK",
    "mac",
    "set_timeout",
    "fill",
    "recv_exact",
    "discard",
    "still_open",
    "readable",
    "status_record",
    "send_parts",
    "write_all",
    "keepalive",
    "shut",
]

MAGIC = b"GWBULK2\0"
#: The first version's listener: transfers only (its peers' calls go by gRPC).
MAGIC_V1 = b"GWBULK1\0"
NONCE_BYTES = 32
NAME_LEN = struct.Struct("<H")
RECORD = struct.Struct("<QQ")
#: ``nbytes`` of a transfer header that cancels the transfer of that id (no bytes follow).
CANCEL = (1 << 64) - 1
#: The "transfer id" of a record carrying a call's frame (to the listener) or its reply frame
#: (back to the caller).
CALL = (1 << 64) - 2
#: The "transfer id" of a record carrying what would have been a call's gRPC status: ``[u32
#: code][details, UTF-8]`` (the listener's answer when it could not serve the call).
STATUS = (1 << 64) - 3
#: The "transfer id" of a record carrying a call on a lane pipe (``lane_pipe``): answered by a
#: CALL record, in any order, the reply frame naming its call.
PIPE = (1 << 64) - 4
#: The "transfer id" of a record carrying a *plain* call on a lane pipe, without a protobuf
#: header: ``[i64 message id][f64 timeout seconds, 0: none][u16 n][n bytes: the function's
#: name, UTF-8][its pickle]`` (``PLAIN_CALL``), to a worker whose ``WorkerInfo.lane_plain``
#: says it takes them; answered
#: by a PLAIN record ``[i64 message id][the value's pickle]`` (``PLAIN_REPLY``) when the value
#: is plain, else by a CALL record (docs/wire.md, "Pipes on the lane").
PLAIN = (1 << 64) - 5
PLAIN_CALL = struct.Struct("<qdH")
PLAIN_REPLY = struct.Struct("<q")
CODE = struct.Struct("<I")
STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
RECV_CHUNK = 1 << 20
_RDHUP = getattr(select, "POLLRDHUP", 0)
#: Parts of a write up to this many bytes are joined into one ``sendall``.
_JOIN_BYTES = 64 << 10


def mac(token: str | None, nonce: bytes, name: bytes, magic: bytes = MAGIC) -> bytes:
    """The handshake's proof that the sender knows the cluster token (over the ``magic`` the
    listener sent)."""
    key = (token or "").encode()
    return hmac.new(key, magic + nonce + name, hashlib.sha256).digest()


def set_timeout(sock: socket.socket, seconds: float | None) -> None:
    """``sock.settimeout(seconds)`` unless it is set so already: each ``settimeout`` is a
    system call, and a lane call would make about ten of them, mostly to the same value."""
    if sock.gettimeout() != seconds:
        sock.settimeout(seconds)


def fill(
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
            set_timeout(sock, min(left, cap))
        k = sock.recv_into(view[got : got + RECV_CHUNK])
        if not k:
            break
        got += k
        if progress is not None:
            progress()
    if _traffic.counts is not None:
        _traffic.received(_traffic.BULK_LANE, got)
    return got


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes | None:
    """``n`` bytes, or None when the peer closed the connection before the first one; with a
    ``deadline`` (``time.monotonic()``), TimeoutError past it however the bytes trickle in."""
    buf = bytearray(n)
    got = fill(sock, memoryview(buf), deadline)
    if got < n:
        if got == 0:
            return None
        raise ConnectionError(f"connection closed after {got} of {n} bytes")
    return bytes(buf)


def discard(sock: socket.socket, nbytes: int) -> None:
    """Read and drop ``nbytes`` (a refused or cancelled transfer; the next one follows)."""
    scratch = memoryview(bytearray(min(nbytes, RECV_CHUNK) or 1))
    while nbytes:
        k = sock.recv_into(scratch[: min(nbytes, len(scratch))])
        if not k:
            raise ConnectionError("connection closed in a dropped transfer")
        nbytes -= k
        if _traffic.counts is not None:
            _traffic.received(_traffic.BULK_LANE, k)


def still_open(sock: socket.socket) -> bool:
    """Whether an idle connection is still usable: the peer neither closed it nor sent on it
    (a lane sends nothing on an idle connection). One ``poll`` with no wait: readable means
    closed, reset, or bytes nobody asked for."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI | _RDHUP)
        return not poller.poll(0)
    except (OSError, ValueError):  # closed here (fileno -1)
        return False


def readable(sock: socket.socket, seconds: float) -> bool:
    """Whether ``sock`` has bytes (or an end) to read within ``seconds`` (at once when it has
    them already; a closed socket counts as readable: the read says what happened)."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI | _RDHUP)
        return bool(poller.poll(int(seconds * 1000)))
    except (OSError, ValueError):
        return True


def status_record(code: grpc.StatusCode, details: str) -> tuple[bytes, bytes]:
    """A STATUS record: what a call's gRPC status would have been."""
    body = CODE.pack(code.value[0]) + details.encode("utf-8", "replace")
    return RECORD.pack(STATUS, len(body)), body


def send_parts(conn: socket.socket, parts: tuple[Any, ...]) -> None:
    """Write ``parts`` in order; a small message in one segment (headers and frames are
    joined: with TCP_NODELAY each ``sendall`` would be a packet of its own)."""
    if _traffic.counts is not None:
        _traffic.sent(_traffic.BULK_LANE, sum(memoryview(p).nbytes for p in parts))
    if len(parts) > 1 and sum(len(p) for p in parts[1:]) <= _JOIN_BYTES:
        conn.sendall(b"".join(parts))
        return
    for part in parts:
        conn.sendall(part)


def write_all(sock: socket.socket, data: bytes) -> None:
    """Write ``data`` on ``sock`` (a socket with a timeout): one ``write`` when the kernel
    takes it all, as it does for a few records (the socket's own ``sendall`` polls before each
    write), the rest by ``sendall`` within the socket's timeout.

    Raises:
        OSError: the connection broke, or stalled past the timeout.
    """
    try:
        n = os.write(sock.fileno(), data)
    except BlockingIOError:
        n = 0
    if n < len(data):
        sock.sendall(memoryview(data)[n:])


def shut(sock: socket.socket) -> None:
    """Shut both directions of ``sock`` (a thread blocked on it wakes); closed already: nothing."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
