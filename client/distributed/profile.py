"""One timeline of the whole cluster: profile every worker at once and merge their events.

:class:`profile_cluster` starts recording on every worker (each records every thread: the ops,
autograd nodes and record_function blocks it runs, each call it makes and each call it
serves), stops them at the end of the block and merges their events into one Chrome-trace /
Perfetto JSON: one process lane per worker, its clock aligned to the caller's (estimated from
the round trips of the start and stop calls; workers of one host share a clock), an arrow from
each call to its serving and back, and a distributed backward as its ``RecvRpcBackward`` /
``SendRpcBackward`` nodes on every worker it touched.

``gradwire profile HOST:PORT --seconds N --out trace.json`` does the same for a running cluster
from outside it (the ``Profile`` method of each worker).

Example:
    >>> with gradwire.distributed.profile_cluster() as prof:
    ...     train_step()
    >>> prof.export_chrome_trace("cluster.json")     # open in https://ui.perfetto.dev
    >>> print(prof.key_averages().table(sort_by="cpu_time_total"))
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from .._proto import worker_pb2 as pb
from .._runtime import agent as _agent
from .._runtime.calls.profiling import clock_offset, from_proto
from .._runtime.cluster import profile_session
from ..autograd import _profiling
from ..autograd.profiler import EventList, build_events
from . import rpc

__all__ = ["profile_cluster", "merge_trace"]


def _start_on_worker(session: str, record_shapes: bool) -> int:
    """Run by profile_cluster on each worker: start recording (returns the worker's clock)."""
    return profile_session.start(session, record_shapes)


def _stop_on_worker(session: str) -> bytes:
    """Run by profile_cluster on each worker: stop recording, return its ProfileDump."""
    agent = _agent.current("profile_cluster")
    return profile_session.stop(session, agent.rank, agent.name).SerializeToString()


class profile_cluster:
    """Profile every worker of the cluster while the block runs (see the module docstring).

    Args:
        record_shapes: record each op's input shapes on every worker.
        workers: the workers to profile (names, ranks or WorkerInfos); default all.

    Attributes (after the block):
        dumps: each worker's ProfileDump (its events on its own clock).
        offsets: worker rank -> its clock minus this worker's, in ns.
        trace: the merged Chrome-trace JSON (a dict).

    Raises:
        RuntimeError: on entry, a worker already records a cluster profile (nothing was
            started), or RPC is not running.
    """

    def __init__(self, record_shapes: bool = False, workers: Sequence[Any] | None = None) -> None:
        self.record_shapes = record_shapes
        self._workers = workers
        self._session = secrets.token_hex(8)
        self._started: list[Any] = []
        self.dumps: list[pb.ProfileDump] = []
        self.offsets: dict[int, int] = {}
        self.trace: dict[str, Any] = {}

    def __enter__(self) -> profile_cluster:
        infos = (
            rpc.get_worker_infos()
            if self._workers is None
            else [rpc.get_worker_info(w) if isinstance(w, str) else w for w in self._workers]
        )
        try:
            with _profiling.paused():
                self._start_all(infos)
        except BaseException:
            with _profiling.paused():
                self._stop_all()
            raise
        return self

    def _start_all(self, infos: Sequence[Any]) -> None:
        for info in infos:
            sent = _profiling.now_ns()
            clock = rpc.rpc_sync(info, _start_on_worker, (self._session, self.record_shapes))
            self.offsets[info.id] = clock_offset(sent, clock, clock, _profiling.now_ns())
            self._started.append(info)

    def _stop_all(self) -> list[pb.ProfileDump]:
        dumps = []
        for info in self._started:
            raw = rpc.rpc_sync(info, _stop_on_worker, (self._session,))
            dumps.append(pb.ProfileDump.FromString(raw))
        self._started = []
        return dumps

    def __exit__(self, *exc: object) -> None:
        with _profiling.paused():
            self.dumps = self._stop_all()
        self.trace = merge_trace((d, self.offsets.get(d.rank, 0)) for d in self.dumps)

    def export_chrome_trace(self, path: str) -> None:
        """Write the merged trace (Chrome trace JSON; Perfetto and chrome://tracing load it)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.trace, f)

    @property
    def function_events(self) -> EventList:
        """Every worker's events as FunctionEvents on this worker's clock (``node_id`` is the
        worker's rank)."""
        raw: list[_profiling.Event] = []
        for d in self.dumps:
            offset = self.offsets.get(d.rank, 0)
            for p in d.events:
                ev = from_proto(p, offset)
                ev.node_id = d.rank
                raw.append(ev)
        origin = min((e.start_ns for e in raw), default=0)
        return build_events(raw, origin)

    def key_averages(self, group_by_input_shape: bool = False) -> EventList:
        return self.function_events.key_averages(group_by_input_shape)


def merge_trace(dumps: Iterable[tuple[pb.ProfileDump, int]]) -> dict[str, Any]:
    """One Chrome trace of several workers' dumps, each with its clock offset (the worker's
    clock minus the reference's, ns): a process per worker, a track per thread, complete
    events, and a flow from each call ("rpc") to its serving ("serve") and back."""
    dumps = list(dumps)
    origin = min((p.start_ns - off for d, off in dumps for p in d.events), default=0)
    events: list[dict[str, Any]] = []
    calls: dict[tuple[int, int], tuple[int, int, float, float]] = {}
    served: dict[tuple[int, int], tuple[int, int, float, float]] = {}
    for d, off in sorted(dumps, key=lambda x: x[0].rank):
        pid = int(d.rank)
        label = f"{d.name} (rank {d.rank})" + (f", {d.dropped} events dropped" if d.dropped else "")
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}})
        events.append(
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}
        )
        tids: dict[int, int] = {}
        for p in d.events:
            tid = tids.get(p.thread_id)
            if tid is None:
                tid = tids[p.thread_id] = len(tids) + 1
                events.append(
                    {
                        "name": "thread_name",
                        "ph": "M",
                        "pid": pid,
                        "tid": tid,
                        "args": {"name": f"thread {tid}"},
                    }
                )
            ts = (p.start_ns - off - origin) / 1e3
            dur = (p.end_ns - p.start_ns) / 1e3
            entry: dict[str, Any] = {
                "name": p.name,
                "cat": p.kind or "op",
                "ph": "X",
                "ts": ts,
                "dur": dur,
                "pid": pid,
                "tid": tid,
            }
            if p.input_shapes:
                entry["args"] = {"input_shapes": [list(s.dims) for s in p.input_shapes]}
            events.append(entry)
            if len(p.flow) == 2:
                key = (int(p.flow[0]), int(p.flow[1]))
                if p.kind == "rpc":
                    calls[key] = (pid, tid, ts, ts + dur)
                elif p.kind == "serve":
                    served[key] = (pid, tid, ts, ts + dur)
    n = 0
    for key, (cpid, ctid, cstart, cend) in calls.items():
        there = served.get(key)
        if there is None:
            continue
        spid, stid, sstart, send = there
        n += 1
        flow = {"cat": "rpc", "name": "call"}
        events.append({**flow, "ph": "s", "id": 2 * n, "pid": cpid, "tid": ctid, "ts": cstart})
        events.append(
            {**flow, "ph": "f", "bp": "e", "id": 2 * n, "pid": spid, "tid": stid, "ts": sstart}
        )
        back = {"cat": "rpc", "name": "reply"}
        events.append({**back, "ph": "s", "id": 2 * n + 1, "pid": spid, "tid": stid, "ts": send})
        events.append(
            {**back, "ph": "f", "bp": "e", "id": 2 * n + 1, "pid": cpid, "tid": ctid, "ts": cend}
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"flows": n}}
