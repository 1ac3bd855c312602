"""Idle lane connections, all waiting on one thread.

A lane listener used to keep a reader thread blocked in ``recv`` on every connection it
accepted: a thread per peer (and per connection) whether the peer sends anything or not. A
connection that has been quiet for ``LINGER_SECONDS`` now *rests* here instead: one thread
waits on every resting socket at once (``selectors``: epoll on Linux, no CPU while idle), and
when one becomes readable (the next record, or the peer closing it), hands it back to its
``resume`` callback, which starts a reader thread for it again. So a worker's lane threads
follow the connections in use, not the number of peers; a busy connection keeps its thread
(no hand-off on the hot path).
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections.abc import Callable

__all__ = ["Rest", "LINGER_SECONDS"]

log = logging.getLogger(__name__)

#: A reader thread whose connection brought nothing for this long lets it rest.
LINGER_SECONDS = 2.0


class Rest:
    """The resting connections of one listener and the one thread that waits on them.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._pending: list[tuple[socket.socket, Callable[[socket.socket], None]]] = []
        self._closed = False
        self._thread: threading.Thread | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    def add(self, conn: socket.socket, resume: Callable[[socket.socket], None]) -> bool:
        """Let ``conn`` rest until it is readable, then call ``resume(conn)`` on the resting
        thread (which must return at once). False when the rest is closed (the caller keeps
        the connection)."""
        with self._lock:
            if self._closed:
                return False
            if self._thread is None:
                try:
                    self._start()
                except (OSError, RuntimeError) as exc:  # no socket pair or thread to be had
                    log.warning("%s: idle lane connections keep their threads: %s", self._name, exc)
                    return False
            self._pending.append((conn, resume))
            wake = self._wake_w
        self._wake(wake)
        return True

    def _start(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        thread.start()
        self._thread = thread

    @staticmethod
    def _wake(wake: socket.socket | None) -> None:
        try:
            if wake is not None:
                wake.send(b"\0")
        except OSError:  # full (a wake is pending anyway) or closed
            pass

    def _run(self) -> None:
        selector, wake_r = self._selector, self._wake_r
        assert selector is not None and wake_r is not None
        try:
            while True:
                for key, _ in selector.select():
                    if key.data is None:
                        try:
                            while wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                        with self._lock:
                            pending, self._pending = self._pending, []
                            closed = self._closed
                        if closed:
                            return
                        for conn, resume in pending:
                            try:
                                selector.register(conn, selectors.EVENT_READ, resume)
                            except (OSError, ValueError, KeyError):  # closed meanwhile
                                conn.close()
                        continue
                    ready = key.fileobj
                    assert isinstance(ready, socket.socket)
                    selector.unregister(ready)
                    try:
                        key.data(ready)
                    except Exception:  # noqa: BLE001 - one connection must not stop the others
                        log.exception("%s: resuming a lane connection failed", self._name)
                        ready.close()
        finally:
            selector.close()
            wake_r.close()

    def resting(self) -> int:
        """How many connections rest now (``debug_info``)."""
        selector = self._selector
        with self._lock:
            pending = len(self._pending)
        try:
            registered = len(selector.get_map()) - 1 if selector is not None else 0
        except (RuntimeError, ValueError):  # changed or closed while counting
            registered = 0
        return max(0, registered) + pending

    def close(self) -> None:
        """End the resting thread (the owner closes the connections themselves)."""
        with self._lock:
            self._closed = True
            wake, self._wake_w = self._wake_w, None
            thread = self._thread
        self._wake(wake)
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)
        if wake is not None:
            wake.close()
