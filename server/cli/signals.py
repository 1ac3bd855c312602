"""SIGTERM / SIGINT handling shared by gradwire-worker and gradwire run."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Interrupted", "StopSignals", "EXIT_SIGNALLED"]

#: Exit status of a process stopped by a signal it could not handle gracefully (128 + number).
EXIT_SIGNALLED: dict[int, int] = {
    int(signal.SIGTERM): 128 + int(signal.SIGTERM),
    int(signal.SIGINT): 128 + int(signal.SIGINT),
}


class Interrupted(BaseException):
    """Raised in the main thread by a stop signal while ``raising()`` is active.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in user code does not
    swallow it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class StopSignals:
    """Records SIGTERM/SIGINT; raises :class:`Interrupted` while in a ``raising()`` block.

    A second signal after the first calls ``on_second`` (default: nothing), which lets a
    process abandon a graceful shutdown that hangs.

    Example:
        >>> stops = StopSignals().install()
        >>> with stops.raising():
        ...     join()            # a signal here raises Interrupted
        >>> stops.event.wait(1.0)  # afterwards signals only set the event
    """

    def __init__(self, on_second: Callable[[int], None] | None = None) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._raise = False
        self._on_second = on_second

    def install(self) -> StopSignals:
        """Install the handlers (main thread only)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        first = not self.event.is_set()
        self.signum = self.signum or signum
        self.event.set()
        if not first and self._on_second is not None:
            self._on_second(signum)
        if self._raise:
            self._raise = False
            raise Interrupted(signum)

    @contextmanager
    def raising(self) -> Iterator[None]:
        """Within the block, a stop signal raises Interrupted in the main thread."""
        if self.event.is_set():
            assert self.signum is not None
            raise Interrupted(self.signum)
        self._raise = True
        try:
            yield
        finally:
            self._raise = False
