"""Ending a gRPC connection that a cut link holds stuck.

When a link is cut under a connection with bytes in flight, gRPC's HTTP/2 transport waits for
writes the kernel cannot deliver; a call cancelled at its deadline waits behind them, and closing
the channel does not help while a call still holds its transport. They all end only when the
kernel gives up on the connection (``TCP_USER_TIMEOUT``, which gRPC sets to its keepalive
timeout: 10 s here). :func:`shut_connections_to` shuts the socket itself down instead: every call
on it fails at once, and the next call opens a new connection. Linux only (``/proc/self/fd``);
elsewhere it does nothing and the kernel's timeout stands.
"""

from __future__ import annotations

import logging
import os
import socket
import stat

__all__ = ["shut_connections_to"]

log = logging.getLogger(__name__)


def _peers_of(address: str) -> set[tuple[str, int]]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit() or host.startswith("unix"):
        return set()
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {(str(info[4][0]), int(port)) for info in infos}


def shut_connections_to(address: str) -> int:
    """Shut down (both ways) this process's TCP connections to ``address`` ("host:port");
    how many. Only sockets whose peer is that very address and port match: connections a
    peer opened to this worker's servers come from its other ports."""
    peers = _peers_of(address)
    if not peers or not os.path.isdir("/proc/self/fd"):
        return 0
    shut = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except (OSError, ValueError):
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6):
                peer = sock.getpeername()
                host = str(peer[0]).removeprefix("::ffff:")  # gRPC's sockets are dual-stack
                if (host, int(peer[1])) in peers:
                    sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
        except OSError:
            pass
        finally:
            sock.close()  # only the duplicate: the connection itself is gRPC's
    return shut
