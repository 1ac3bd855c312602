"""The watch over threads that read a lane pipe and run what they read themselves.

Both ends of a lane pipe save a thread wake-up per message by running work on the thread that
read it: the caller's reader completes futures with callbacks (``lane_pipe.PipeReader``), the
callee's reader serves calls inline (``lane_pipe.ServedPipe``). Such a thread is the pipe's
*leader*: while it runs a callback or a call, nothing else is read. If what it runs blocks (a
``blocking_region``) the leader hands its reading to a new thread at once; if it runs long, one
``Watch`` per worker does it: it looks every ``WATCH_TICK_SECONDS`` while leaders run things,
and a leader busy for ``STUCK_SECONDS`` hands over. Once nothing has run for
``WATCH_IDLE_SECONDS`` the watch sleeps with no wake-ups (an idle worker costs nothing).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = [
    "STUCK_SECONDS",
    "WATCH_IDLE_SECONDS",
    "WATCH_TICK_SECONDS",
    "Lead",
    "Leading",
    "Watch",
]

#: A leader busy this long hands its reading over (the watch looks every WATCH_TICK_SECONDS).
STUCK_SECONDS = 0.02
WATCH_TICK_SECONDS = 0.02
#: The watch stops looking once nothing has run for this long.
WATCH_IDLE_SECONDS = 1.0


class Lead(Protocol):
    """What the watch looks at: a pipe's (or a reader's) leader."""

    def unstick(self, after: float = STUCK_SECONDS) -> bool:
        """Hand the reading over if the leader has been busy ``after`` seconds; whether it
        did."""
        ...  # pragma: no cover - a protocol


class Leading:
    """What the leaders of both ends share: ``unstick``, for the watch (and a deadline)."""

    _lock: threading.Lock
    #: when the leader started running what it runs (0.0: it runs nothing)
    _busy_since: float

    def _hand_over_locked(self) -> None:
        raise NotImplementedError

    def unstick(self, after: float = STUCK_SECONDS) -> bool:
        """Whether the leader has been busy (in a callback, a call served inline) for
        ``after`` seconds or more; if so a new thread takes the reading over (the held one
        finishes what it runs, then stops). Under the lock the leader clears its busy time
        with: never two threads reading."""
        with self._lock:
            since = self._busy_since
            if not since or time.monotonic() - since < after:
                return False
            self._hand_over_locked()
        return True


class Watch:
    """One thread that hands over the leaders held too long (started at the first ``busy``).

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._leads: list[Lead] = []
        self._watching = False  # looking every tick (else asleep until ``busy``)
        self._last = 0.0  # when a leader last started running something
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, lead: Lead) -> None:
        """Look at ``lead`` from now on."""
        with self._lock:
            self._leads.append(lead)

    def discard(self, lead: Lead) -> None:
        """Stop looking at ``lead``."""
        with self._lock:
            try:
                self._leads.remove(lead)
            except ValueError:
                pass

    def busy(self) -> float:
        """A leader starts running something: the watch looks (if asleep, it wakes). Returns
        the time (``time.monotonic()``), the leader's busy-since."""
        now = time.monotonic()
        self._last = now
        if not self._watching:
            self._start()
        return now

    def close(self) -> None:
        """End the thread."""
        with self._lock:
            self._closed = True
            self._wake.notify()

    def _start(self) -> None:
        with self._lock:
            if self._closed or self._watching:
                return
            self._watching = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            else:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watching and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                self._wake.wait(WATCH_TICK_SECONDS)
                if self._closed:
                    return
                leads = list(self._leads)
                if time.monotonic() - self._last >= WATCH_IDLE_SECONDS:
                    self._watching = False
                    # ``busy`` sets the time before it looks at the flag: one that saw the flag
                    # still set has set a time read here (no sleep past a leader just started).
                    if time.monotonic() - self._last < WATCH_IDLE_SECONDS:
                        self._watching = True
            for lead in leads:  # outside the lock: a leader takes its own
                lead.unstick(STUCK_SECONDS)
