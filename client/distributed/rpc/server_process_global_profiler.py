"""PyTorch's ``rpc._server_process_global_profile``: profile every call this worker serves.

Entered on the worker to profile, it records the events of each RPC the worker serves, one
group per call; any thread of the worker may enter and exit it, and profiles may nest.
PyTorch's tests enter one on another worker through an RRef (``rref.rpc_sync().__enter__()``);
gradwire's callable policy refuses a peer's call of a special method (docs/security.md), so a
peer cannot start profiling a worker: enter it on the worker itself.

Example (on worker1):
    >>> with rpc._server_process_global_profile() as prof:
    ...     time.sleep(5)                  # the calls worker1 serves meanwhile
    >>> print(prof.key_averages().table())
"""

from __future__ import annotations

import threading
from typing import Any

from ...autograd import _profiling
from ...autograd.profiler import EventList, build_events, profile

__all__ = ["_server_process_global_profile", "MAX_CALLS"]

#: Calls a profile keeps at most: a peer may enter one and never exit it.
MAX_CALLS = 100_000


class _server_process_global_profile(profile):
    """A :class:`gradwire.autograd.profiler.profile` of the calls this worker serves.

    Attributes (once exited):
        process_global_function_events: one EventList per call served while entered.
        function_events: all of them in one EventList.

    Raises:
        RuntimeError: entered twice.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._groups: list[list[_profiling.Event]] = []
        self._lock = threading.Lock()
        self._open = False
        self.process_global_function_events: list[EventList] = []

    def add_group(self, events: list[_profiling.Event]) -> None:
        with self._lock:
            if self._open and len(self._groups) < MAX_CALLS:
                self._groups.append(events)

    def __enter__(self) -> _server_process_global_profile:
        if not self.enabled:
            return self
        if self.entered:
            raise RuntimeError("autograd profiler traces are not reentrant")
        self.entered = True
        self._origin_ns = _profiling.now_ns()
        self._open = True
        _profiling.add_server_profile(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled or not self._open:
            return
        _profiling.remove_server_profile(self)
        with self._lock:
            self._open = False
            groups = list(self._groups)
        self.process_global_function_events = [build_events(g, self._origin_ns) for g in groups]

    @property
    def function_events(self) -> EventList:
        if self._open:
            raise RuntimeError("Profiler didn't finish running: read its events after __exit__")
        return EventList(ev for group in self.process_global_function_events for ev in group)
