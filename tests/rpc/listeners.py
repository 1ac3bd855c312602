"""Listeners that never answer, for the tests that a call keeps its timeout (issue 37)."""

from __future__ import annotations

import socket
import threading
import time

__all__ = ["silent_listener", "full_listener"]


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
