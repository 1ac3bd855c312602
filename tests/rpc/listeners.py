"""Listeners that never answer, for the tests that a call keeps its timeout (issue 37), and a
proxy that answers late, for the test that a slow peer is not a dead one (issue 38)."""

from __future__ import annotations

import socket
import threading
import time

__all__ = ["silent_listener", "full_listener", "slow_proxy"]


def silent_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A listener that accepts and never says a byte (a frozen or broken lane)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return listener, held


def full_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A listener that never accepts, its backlog filled: a new connection is never made."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(8):  # the kernel takes a few into its queue, then drops the SYNs
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(listener.getsockname())
        except BlockingIOError:
            pass
        fillers.append(s)
    time.sleep(0.2)
    return listener, fillers


def slow_proxy(
    upstream: tuple[str, int], delay: float
) -> tuple[socket.socket, list[socket.socket]]:
    """A TCP proxy to ``upstream`` that holds every connection ``delay`` seconds before it
    passes a byte either way: a server that accepts at once and answers late, as a worker on a
    machine with a load average of hundreds does."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve(client: socket.socket) -> None:
        time.sleep(delay)
        try:
            server = socket.create_connection(upstream, timeout=5)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        held.append(server)
        threading.Thread(target=pump, args=(client, server), daemon=True).start()
        pump(server, client)

    def accept() -> None:
        while True:
            try:
                client = listener.accept()[0]
            except OSError:
                return
            held.append(client)
            threading.Thread(target=serve, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, held
