"""Profiling of calls: the caller's event for each RPC, and the callee's events sent back.

The public verbs open a :class:`CallProfile` when their thread records into a profile
(``gradwire.autograd.profiler``): an event named with PyTorch's key,
``rpc_async#fn(worker0 -> worker1)``, that ends when the call's future completes. The call's
header then carries ``CallHeader.profile``; the callee records what the call runs into a
recorder of its own (``serve_scope``), keeps it open until the reply is encoded (an
``@async_execution`` function's nested calls included) and sends its events back in the reply's
``profile``. The caller adds them to its profile as remote events, named
``<key>#remote_op: <event>`` and stamped with the callee's rank.

In a cluster profile (every worker records process-wide) no events travel: each worker keeps
its own, and a call's event and its serving share a flow id (caller rank, message id), which the
merged trace draws as an arrow.

The hooks module calls in here (``on_send_call``, ``on_recv_reply``, ``serve_scope``,
``on_send_reply``) only while something profiles, or for a call whose header asks.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from ..._proto import worker_pb2 as pb
from ...autograd import _profiling

__all__ = [
    "REMOTE_OP",
    "rpc_key",
    "function_key",
    "CallProfile",
    "clock_offset",
    "from_proto",
    "begin",
    "sending",
    "awaiting",
    "serving",
    "on_send_call",
    "on_recv_reply",
    "serve_scope",
    "on_send_reply",
    "discard",
    "to_proto",
    "add_events",
]

#: What joins a call's key and the name of an event its callee recorded (PyTorch's string).
REMOTE_OP = "#remote_op: "
#: Callee recorders kept for replies not sent yet; a call that fails drops its own, this
#: bound keeps a stream of failures from growing the table.
_SERVING_LIMIT = 4096

#: The calls that start and stop a cluster profile: not part of it.
_SESSION_CALLS = "gradwire.distributed.profile:"

_tls = threading.local()
_lock = threading.Lock()
#: (callee id, message id) -> the caller's profile of a call that asked for remote events.
awaiting: dict[tuple[int, int], CallProfile] = {}
#: (caller id, message id) -> (recorder, handling start) of a profiled call being served.
serving: collections.OrderedDict[tuple[int, int], tuple[_profiling.Recorder, int]] = (
    collections.OrderedDict()
)


def rpc_key(verb: str, function: str, src: str, dst: str) -> str:
    """PyTorch's RPC profiling key: ``rpc_{verb}#{function}({src} -> {dst})``."""
    return f"rpc_{verb}#{function}({src} -> {dst})"


def function_key(fn: Any) -> str:
    """How a call's function is named in its key: ``aten::<name>`` for a gradwire tensor
    function (PyTorch names its builtins so), else the function's ``__qualname__``."""
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__name__", None)
    if name and module.startswith("gradwire"):
        import gradwire

        if getattr(gradwire, name, None) is fn:
            return f"aten::{name}"
    return str(getattr(fn, "__qualname__", None) or name or repr(fn))


class CallProfile:
    """The caller's event of one profiled RPC (see the module docstring)."""

    def __init__(self, rec: _profiling.Recorder, key: str, event: _profiling.Event) -> None:
        self.rec = rec
        self.key = key
        self.event = event
        self.ask = rec is not _profiling.process_recorder()  # a cluster profile asks nothing
        self.peer = -1
        self.message_id = -1

    def finish(self, _: Any = None) -> None:
        """End the event (the call's future completed); idempotent."""
        if self.event.end_ns:
            return
        with _lock:
            awaiting.pop((self.peer, self.message_id), None)
        self.rec.end(self.event)

    def take(self, got: pb.ProfileEvents) -> None:
        """Add the callee's events, placed within this call's interval on this clock."""
        offset = clock_offset(
            self.event.start_ns, got.handled_start_ns, got.handled_end_ns, _profiling.now_ns()
        )
        prefix = self.key + REMOTE_OP
        for p in got.events:
            ev = from_proto(p, offset, prefix + p.name)
            ev.is_remote = True
            self.rec.add(ev)


def clock_offset(sent_ns: int, first_ns: int, last_ns: int, received_ns: int) -> int:
    """Another worker's clock minus this one, from a call sent at ``sent_ns`` and answered at
    ``received_ns`` (this clock) that the worker handled from ``first_ns`` to ``last_ns`` (its
    clock): 0 when that interval falls within the round trip (one clock: the same host), else
    the estimate that centres it there (equal latency both ways)."""
    if sent_ns <= first_ns <= last_ns <= received_ns:
        return 0
    return ((first_ns - sent_ns) + (last_ns - received_ns)) // 2


def from_proto(p: pb.ProfileEvent, offset: int, name: str | None = None) -> _profiling.Event:
    """An event another worker recorded, moved onto this clock (``offset``: its clock minus
    this one)."""
    ev = _profiling.Event(p.name if name is None else name, p.kind or "op", p.start_ns - offset)
    ev.end_ns = p.end_ns - offset
    ev.thread = p.thread_id
    ev.node_id = p.node_id
    ev.input_shapes = [list(s.dims) for s in p.input_shapes]
    ev.cpu_memory_usage = p.cpu_memory_usage
    ev.sequence_nr = p.sequence_nr
    return ev


def begin(verb: str, fn: Any, src: str, dst: str) -> CallProfile | None:
    """The profile of a call about to be made from this thread, or None when it records
    nothing (the usual case: one global test)."""
    if not _profiling.active:
        return None
    rec = _profiling.current()
    if rec is None:
        return None
    key = rpc_key(verb, function_key(fn), src, dst)
    return CallProfile(rec, key, rec.begin(key, kind="rpc"))


@contextlib.contextmanager
def sending(prof: CallProfile | None) -> Iterator[None]:
    """While the verb encodes and sends its call: ``on_send_call`` stamps it with ``prof``."""
    if prof is None:
        yield
        return
    prev = getattr(_tls, "pending", None)
    _tls.pending = prof
    try:
        yield
    finally:
        _tls.pending = prev


def on_send_call(header: pb.CallHeader, peer: int) -> None:
    """A call leaves: stamp it with this thread's pending profile (once)."""
    prof: CallProfile | None = getattr(_tls, "pending", None)
    if prof is None or prof.message_id != -1:
        return
    prof.peer, prof.message_id = peer, header.message_id
    prof.event.flow = (header.caller_id, header.message_id)
    if prof.ask:
        rec = prof.rec
        header.profile.record_shapes = rec.record_shapes
        header.profile.profile_memory = rec.profile_memory
        with _lock:
            awaiting[(peer, header.message_id)] = prof


def on_recv_reply(call: pb.CallHeader, reply: Any, peer: int) -> None:
    """A reply arrived (before the caller's future completes): take the callee's events."""
    with _lock:
        prof = awaiting.pop((peer, call.message_id), None)
    if prof is not None and reply.HasField("profile"):
        prof.take(reply.profile)


@contextlib.contextmanager
def serve_scope(call: pb.CallHeader, peer: int) -> Iterator[None]:
    """Around a served call's function: record into the call's own recorder when its header
    asks or a server-process profile is on (``rpc._server_process_global_profile``, which
    gets the call's events as one group), else a serve event into this worker's cluster
    profile, if one records."""
    asked = call.HasField("profile")
    servers = _profiling.server_profiles
    if asked or servers:
        rec = _profiling.Recorder(
            (asked and call.profile.record_shapes) or any(s.record_shapes for s in servers),
            (asked and call.profile.profile_memory) or any(s.profile_memory for s in servers),
        )
        if asked:
            with _lock:
                serving[(call.caller_id, call.message_id)] = (rec, _profiling.now_ns())
                while len(serving) > _SERVING_LIMIT:
                    serving.popitem(last=False)
        prev = _profiling.push(rec)
        try:
            yield
        finally:
            _profiling.pop(prev)
            for server in servers:
                server.add_group(rec.events)
        return
    process = _profiling.process_recorder()
    if process is None or call.function.startswith(_SESSION_CALLS):
        yield
        return
    ev = process.begin(f"serve#{call.function}", kind="serve")
    ev.flow = (call.caller_id, call.message_id)
    try:
        yield
    finally:
        process.end(ev)


def on_send_reply(call: pb.CallHeader, header: Any, peer: int) -> None:
    """The reply to a profiled call is encoded: put the call's events in it."""
    with _lock:
        entry = serving.pop((call.caller_id, call.message_id), None)
    if entry is not None:
        rec, started = entry
        header.profile.CopyFrom(to_proto(rec, started))


def discard(call: pb.CallHeader) -> None:
    """A profiled call failed: its events are not sent (the caller's event ends all the same)."""
    with _lock:
        serving.pop((call.caller_id, call.message_id), None)


def to_proto(rec: _profiling.Recorder, started: int) -> pb.ProfileEvents:
    """The ended events of ``rec`` for a reply (handled from ``started`` until now)."""
    out = pb.ProfileEvents(handled_start_ns=started, handled_end_ns=_profiling.now_ns())
    add_events(out.events, rec.events, with_flow=False)
    return out


def add_events(into: Any, events: list[_profiling.Event], with_flow: bool) -> None:
    """Append the ended ``events`` to the repeated ProfileEvent field ``into``; ``with_flow``
    adds each one's kind and flow id (a cluster profile's dump)."""
    for ev in list(events):
        if not ev.end_ns:
            continue
        p = into.add(
            name=ev.name,
            start_ns=ev.start_ns,
            end_ns=ev.end_ns,
            thread_id=ev.thread & 0x7FFF_FFFF_FFFF_FFFF,
            cpu_memory_usage=ev.cpu_memory_usage,
            node_id=ev.node_id,
            sequence_nr=ev.sequence_nr,
        )
        for shape in ev.input_shapes:
            p.input_shapes.add(dims=shape)
        if with_flow:
            p.kind = ev.kind
            if ev.flow is not None:
                p.flow.extend(ev.flow)
