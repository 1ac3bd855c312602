"""A worker's side of a cluster profile: record everything, process-wide, then hand it over.

``gradwire.distributed.profile_cluster`` starts a session on every worker (an RPC to
``start``) and stops it (``stop``, which returns the worker's events as a ``ProfileDump``);
``gradwire profile`` does the same through the ``Profile`` method for a fixed window. While a
session records, every thread of the worker that has no profile of its own records into it,
including the threads that serve calls (a ``serve#<function>`` event per call, which shares its
flow id with the caller's ``rpc_*`` event).

One session at a time per worker; a session keeps at most ``MAX_EVENTS`` events (the rest are
counted as dropped), so a profile left running cannot exhaust a worker's memory.
"""

from __future__ import annotations

import threading
from typing import Any

from ..._proto import worker_pb2 as pb
from ...autograd import _profiling
from ..calls.profiling import add_events

__all__ = ["MAX_EVENTS", "BoundedRecorder", "start", "stop", "active_session", "dump"]

#: Events one session keeps at most.
MAX_EVENTS = 2_000_000

_lock = threading.Lock()
_session: tuple[str, BoundedRecorder, int] | None = None


class BoundedRecorder(_profiling.Recorder):
    """A recorder that keeps at most ``limit`` events and counts the others."""

    def __init__(self, record_shapes: bool = False, limit: int = MAX_EVENTS) -> None:
        super().__init__(record_shapes)
        self.limit = limit
        self.dropped = 0

    def begin(self, name: str, inputs: Any = None, kind: str = "op") -> _profiling.Event:
        if len(self.events) >= self.limit:
            self.dropped += 1
            return _profiling.Event(name, kind)  # timed, never kept
        return super().begin(name, inputs, kind)

    def add(self, ev: _profiling.Event) -> None:
        if len(self.events) >= self.limit:
            self.dropped += 1
            return
        self.events.append(ev)


def start(session: str, record_shapes: bool = False) -> int:
    """Start recording this worker under ``session``; returns the worker's clock (ns).

    Raises:
        RuntimeError: another session records here.
    """
    global _session
    with _lock:
        if _session is not None:
            raise RuntimeError(
                "a cluster profile is already recording on this worker; stop it first "
                f"(session {_session[0]})"
            )
        rec = BoundedRecorder(record_shapes)
        now = _profiling.now_ns()
        _session = (session, rec, now)
        _profiling.set_process_recorder(rec)
    return now


def stop(session: str, rank: int, name: str) -> pb.ProfileDump:
    """Stop ``session`` and return what it recorded.

    Raises:
        RuntimeError: no session, or another one, records here.
    """
    global _session
    with _lock:
        if _session is None or _session[0] != session:
            raise RuntimeError(f"no cluster profile {session!r} records on this worker")
        _, rec, started = _session
        _session = None
        _profiling.set_process_recorder(None)
    return dump(rec, started, rank, name)


def active_session() -> str | None:
    with _lock:
        return _session[0] if _session is not None else None


def dump(rec: BoundedRecorder, started: int, rank: int, name: str) -> pb.ProfileDump:
    """The ended events of ``rec`` as a ProfileDump (times on this worker's clock)."""
    ended = _profiling.now_ns()
    out = pb.ProfileDump(rank=rank, name=name, started_ns=started, ended_ns=ended)
    out.dropped = rec.dropped
    add_events(out.events, rec.events, with_flow=True)
    out.clock_ns = _profiling.now_ns()
    return out
