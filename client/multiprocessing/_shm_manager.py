"""The file_system strategy's janitor: a small daemon that gives back what dead clients held.

Clients (``_shm_client``) keep one Unix-socket connection each and report ``+name`` / ``-name``
as they take and give back their count on a named segment. The daemon remembers what every
client holds; when a client's connection closes (a normal exit or a ``kill -9``: the kernel
closes the socket either way) it gives back whatever that client still held, removing segments
whose count reaches zero. When the last client is gone it waits ``grace`` seconds for new
connections, then unlinks every ``/dev/shm/gradwire_fs_<token>_*`` still there and exits
(counts held by handles that were never received end there). It runs in its own session, so
signals aimed at the job's process group do not reach it, and accepts only clients of its
own user.

This file runs as a script (``python -I _shm_manager.py FD TOKEN``) and imports only the
standard library, so the daemon starts fast and does not load gradwire.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import selectors
import socket
import struct
import sys

__all__ = ["ENV_VAR", "SHM_DIR", "address", "segment_prefix", "serve", "token_of"]

ENV_VAR = "GRADWIRE_SHM_MANAGER"
SHM_DIR = "/dev/shm"
DEFAULT_GRACE = 0.5
_COUNT = struct.Struct("=q")  # the count at the start of every named segment (see _posix)

log = logging.getLogger(__name__)


def address(token: str) -> str:
    """The manager's abstract Unix socket address (no socket file to clean up)."""
    return "\0gradwire_shm_manager_" + token


def segment_prefix(token: str) -> str:
    """The name prefix of every named segment the manager ``token`` looks after."""
    return f"gradwire_fs_{token}_"


def token_of(name: str) -> str | None:
    """The manager token inside a segment name made by :func:`segment_prefix`, or None."""
    parts = name.split("_")
    return parts[2] if len(parts) == 4 and name.startswith("gradwire_fs_") else None


def _give_back(name: str, n: int) -> None:
    """Subtract ``n`` from a segment's count under flock, unlinking it at zero."""
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (count,) = _COUNT.unpack(os.pread(fd, _COUNT.size, 0))
        count -= n
        os.pwrite(fd, _COUNT.pack(count), 0)
        if count <= 0:
            os.unlink(path)
    finally:
        os.close(fd)


def _cleanup(prefix: str) -> int:
    removed = 0
    for name in os.listdir(SHM_DIR):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed


class _Client:
    __slots__ = ("held", "pending")

    def __init__(self) -> None:
        self.held: collections.Counter[str] = collections.Counter()
        self.pending = b""

    def feed(self, data: bytes, prefix: str) -> None:
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            op, name = line[:1], line[1:].decode(errors="replace")
            if not name.startswith(prefix) or "/" in name:
                continue  # only this manager's segments
            if op == b"+":
                self.held[name] += 1
            elif op == b"-" and self.held[name] > 0:
                self.held[name] -= 1


def serve(listener: socket.socket, token: str, grace: float = DEFAULT_GRACE) -> None:
    """Track clients until none is left for ``grace`` seconds, then remove leftovers."""
    prefix = segment_prefix(token)
    uid = os.getuid()
    creds = struct.Struct("3i")
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    clients: dict[socket.socket, _Client] = {}
    while True:
        events = sel.select(timeout=None if clients else grace)
        if not events and not clients:
            break
        for key, _ in events:
            if key.fileobj is listener:
                conn, _ = listener.accept()
                raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, creds.size)
                if creds.unpack(raw)[1] != uid:
                    conn.close()  # another user's process: not ours to serve
                    continue
                sel.register(conn, selectors.EVENT_READ)
                clients[conn] = _Client()
                continue
            peer = key.fileobj
            assert isinstance(peer, socket.socket)
            try:
                data = peer.recv(65536)
            except OSError:
                data = b""
            if data:
                clients[peer].feed(data, prefix)
                continue
            sel.unregister(peer)  # the client exited or was killed
            peer.close()
            for name, n in clients.pop(peer).held.items():
                if n > 0:
                    _give_back(name, n)
    listener.close()
    removed = _cleanup(prefix)
    log.info("shared-memory manager %s: all clients gone, removed %d segment(s)", token, removed)


if __name__ == "__main__":
    _grace = float(os.environ.get("GRADWIRE_SHM_MANAGER_GRACE", DEFAULT_GRACE))
    serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2], _grace)
