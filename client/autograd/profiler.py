"""gradwire.autograd.profiler: where the time of a program goes, RPC included.

PyTorch's public surface, ``torch.autograd.profiler``: :class:`profile` records every tensor op,
every autograd node a backward pass runs, every :class:`record_function` block and every RPC
(``rpc_sync#fn(worker0 -> worker1)``, ``rpc_async#...``, ``rpc_remote#...``). A profiled call
asks its callee to record the call's own events and send them back with the reply; they appear
with the callee's rank as ``node_id``, named ``<rpc key>#remote_op: <event>``.

Times are in microseconds from the start of the session.

Example:
    >>> with profiler.profile(record_shapes=True) as prof:
    ...     with profiler.record_function("step"):
    ...         rpc.rpc_sync("worker1", gradwire.add, (x, y))
    >>> print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))
    >>> prof.export_chrome_trace("trace.json")   # open in Perfetto or chrome://tracing
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..futures import Future
from . import _profiling

__all__ = [
    "profile",
    "record_function",
    "FunctionEvent",
    "FunctionEventAvg",
    "EventList",
    "Interval",
    "emit_nvtx",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The sort keys of ``table``: the numeric attributes of FunctionEventAvg.
SORT_KEYS = (
    "cpu_time_total",
    "self_cpu_time_total",
    "cpu_time",
    "count",
    "cpu_memory_usage",
    "self_cpu_memory_usage",
    "cuda_time_total",
    "self_cuda_time_total",
    "device_time_total",
    "self_device_time_total",
)


class Interval:
    """A start and an end in microseconds."""

    __slots__ = ("start", "end")

    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.end = end

    def elapsed_us(self) -> float:
        return self.end - self.start

    def __repr__(self) -> str:
        return f"Interval(start={self.start}, end={self.end})"


class FunctionEvent:
    """One recorded event, as PyTorch's ``FunctionEvent`` (times in microseconds).

    Attributes:
        id, name, key (its name), node_id (the worker it ran on, -1 outside a cluster),
        is_remote (recorded by another worker), thread, time_range, input_shapes,
        cpu_memory_usage, cpu_children / cpu_parent (nesting on one thread of one worker),
        count (1), sequence_nr.
    """

    def __init__(self, ev: _profiling.Event, ident: int, origin_ns: int) -> None:
        self.id = ident
        self.name = ev.name
        self.node_id = ev.node_id
        self.is_remote = ev.is_remote
        self.thread = ev.thread
        self.time_range = Interval((ev.start_ns - origin_ns) / 1e3, (ev.end_ns - origin_ns) / 1e3)
        self.input_shapes = [list(s) for s in ev.input_shapes]
        self.cpu_memory_usage = ev.cpu_memory_usage
        self.sequence_nr = ev.sequence_nr
        self.kind = ev.kind
        self.flow = ev.flow
        self.count = 1
        self.cpu_children: list[FunctionEvent] = []
        self.cpu_parent: FunctionEvent | None = None
        self.is_async = False
        self.device_type = "cpu"
        self.cuda_time_total = self.self_cuda_time_total = 0.0
        self.device_time_total = self.self_device_time_total = 0.0

    @property
    def key(self) -> str:
        return self.name

    @property
    def cpu_time_total(self) -> float:
        return self.time_range.elapsed_us()

    @property
    def self_cpu_time_total(self) -> float:
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total

    @property
    def self_cpu_memory_usage(self) -> int:
        return self.cpu_memory_usage - sum(c.cpu_memory_usage for c in self.cpu_children)

    def __repr__(self) -> str:
        return (
            f"<FunctionEvent id={self.id} name={self.name!r} node_id={self.node_id} "
            f"cpu_time_total={self.cpu_time_total:.3f}us is_remote={self.is_remote}>"
        )


class FunctionEventAvg:
    """The events of one key summed (``key_averages``); ``cpu_time`` is the mean."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.count = 0
        self.node_id = -1
        self.is_remote = False
        self.input_shapes: list[list[int]] | None = None
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self.cpu_memory_usage = 0
        self.self_cpu_memory_usage = 0
        self.cuda_time_total = self.self_cuda_time_total = 0.0
        self.device_time_total = self.self_device_time_total = 0.0

    def add(self, ev: FunctionEvent | FunctionEventAvg) -> FunctionEventAvg:
        if self.key is None:
            self.key, self.node_id, self.is_remote = ev.key, ev.node_id, ev.is_remote
            self.input_shapes = ev.input_shapes
        self.count += ev.count
        self.cpu_time_total += ev.cpu_time_total
        self.self_cpu_time_total += ev.self_cpu_time_total
        self.cpu_memory_usage += ev.cpu_memory_usage
        self.self_cpu_memory_usage += ev.self_cpu_memory_usage
        return self

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / self.count if self.count else 0.0

    def __repr__(self) -> str:
        return (
            f"<FunctionEventAvg key={self.key!r} count={self.count} "
            f"cpu_time_total={self.cpu_time_total:.3f}us>"
        )


class EventList(list[Any]):
    """A list of events (FunctionEvent or FunctionEventAvg) with the profiler's views."""

    #: Averages grouped by input shape (``table`` then shows the shapes).
    by_input_shape = False

    def key_averages(self, group_by_input_shape: bool = False) -> EventList:
        """One FunctionEventAvg per key (and node, and input shapes when asked), in order of
        first appearance."""
        groups: dict[Any, FunctionEventAvg] = {}
        for ev in self:
            k: Any = (ev.key, ev.node_id)
            if group_by_input_shape:
                k = (*k, str(ev.input_shapes))
            groups.setdefault(k, FunctionEventAvg()).add(ev)
        out = EventList(groups.values())
        out.by_input_shape = group_by_input_shape
        return out

    def total_average(self) -> FunctionEventAvg:
        total = FunctionEventAvg()
        for ev in self:
            total.add(ev)
        total.key = "Total"
        return total

    @property
    def self_cpu_time_total(self) -> float:
        return sum(ev.self_cpu_time_total for ev in self)

    def table(
        self,
        sort_by: str | None = None,
        row_limit: int = 100,
        max_name_column_width: int = 55,
        header: str | None = None,
        top_level_events_only: bool = False,
        **_: Any,
    ) -> str:
        """A text table of the events, PyTorch's columns (times in readable units).

        Args:
            sort_by: one of ``SORT_KEYS`` (descending); None keeps the order.
            row_limit: rows at most (-1: all).
            max_name_column_width: names longer than this are cut.
            header: a line printed above the table.
            top_level_events_only: only events with no parent.

        Raises:
            ValueError: an unknown ``sort_by``.
        """
        return _table(
            self, sort_by, row_limit, max_name_column_width, header, top_level_events_only
        )

    def export_chrome_trace(self, path: str) -> None:
        """Write the events as Chrome trace JSON (a list of complete events: load it in
        Perfetto or chrome://tracing); one process per worker, one track per thread."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(chrome_events(self), f)


def chrome_events(events: Iterable[FunctionEvent]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ev in events:
        entry: dict[str, Any] = {
            "name": ev.name,
            "ph": "X",
            "ts": ev.time_range.start,
            "dur": ev.time_range.elapsed_us(),
            "tid": ev.thread,
            "pid": f"worker {ev.node_id}" if ev.node_id >= 0 else "CPU functions",
            "cat": ev.kind,
            "args": {"node_id": ev.node_id, "is_remote": ev.is_remote},
        }
        if ev.input_shapes:
            entry["args"]["input_shapes"] = ev.input_shapes
        if ev.cpu_memory_usage:
            entry["args"]["cpu_memory_usage"] = ev.cpu_memory_usage
        out.append(entry)
    return out


def build_events(raw: Iterable[_profiling.Event], origin_ns: int) -> EventList:
    """FunctionEvents of the ended ``raw`` events, sorted by start (outer first), with each
    event's parent and children on its worker and thread."""
    done = sorted((e for e in raw if e.end_ns), key=lambda e: (e.start_ns, -e.end_ns, e.node_id))
    events = EventList(FunctionEvent(e, i, origin_ns) for i, e in enumerate(done, 1))
    stacks: dict[tuple[int, int, bool], list[FunctionEvent]] = {}
    for ev in events:
        stack = stacks.setdefault((ev.node_id, ev.thread, ev.is_remote), [])
        while stack and stack[-1].time_range.end <= ev.time_range.start:
            stack.pop()
        if stack and ev.time_range.end <= stack[-1].time_range.end:
            ev.cpu_parent = stack[-1]
            stack[-1].cpu_children.append(ev)
        stack.append(ev)
    for ev in reversed(events):  # children first: a block holds what its ops allocated
        if ev.kind != "op" and ev.cpu_children:
            ev.cpu_memory_usage += sum(c.cpu_memory_usage for c in ev.cpu_children)
    return events


def _fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _fmt_bytes(n: int) -> str:
    for unit, size in (("Gb", 1 << 30), ("Mb", 1 << 20), ("Kb", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} b"


def _table(
    events: EventList,
    sort_by: str | None,
    row_limit: int,
    width: int,
    header: str | None,
    top_only: bool,
) -> str:
    if sort_by is not None and sort_by not in SORT_KEYS:
        raise ValueError(f"table(sort_by={sort_by!r}): sort by one of {', '.join(SORT_KEYS)}")
    rows = [e for e in events if not top_only or getattr(e, "cpu_parent", None) is None]
    if sort_by is not None:
        rows.sort(key=lambda e: getattr(e, sort_by), reverse=True)
    if row_limit >= 0:
        rows = rows[:row_limit]
    self_total = sum(e.self_cpu_time_total for e in events) or 1.0
    memory = any(e.cpu_memory_usage for e in events)
    nodes = any(e.node_id >= 0 for e in events)
    shapes = events.by_input_shape
    cols = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if memory:
        cols += ["CPU Mem", "Self CPU Mem"]
    cols.append("# of Calls")
    if nodes:
        cols.append("Node ID")
    if shapes:
        cols.append("Input Shapes")
    table: list[list[str]] = []
    for e in rows:
        name = e.key if len(e.key) <= width else e.key[: width - 3] + "..."
        row = [
            name,
            f"{100 * e.self_cpu_time_total / self_total:.2f}%",
            _fmt_us(e.self_cpu_time_total),
            f"{100 * e.cpu_time_total / self_total:.2f}%",
            _fmt_us(e.cpu_time_total),
            _fmt_us(e.cpu_time_total / max(e.count, 1)),
        ]
        if memory:
            row += [_fmt_bytes(e.cpu_memory_usage), _fmt_bytes(e.self_cpu_memory_usage)]
        row.append(str(e.count))
        if nodes:
            row.append(str(e.node_id))
        if shapes:
            row.append(str(e.input_shapes))
        table.append(row)
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(cols)]
    line = "-" * (sum(widths) + 2 * (len(widths) - 1))

    def fmt(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest])

    out = [header] if header else []
    out += [line, fmt(cols), line, *(fmt(r) for r in table), line]
    out.append(f"Self CPU time total: {_fmt_us(sum(e.self_cpu_time_total for e in events))}")
    return "\n".join(out) + "\n"


class profile:
    """Record ops, autograd nodes, record_function blocks and RPCs of this thread.

    Args:
        enabled: False makes the context manager do nothing.
        use_cuda, use_device: accepted (PyTorch's); gradwire times host code, and GPU work
            shows inside the op that launched it.
        record_shapes: record each op's input shapes (``input_shapes``; ``key_averages(
            group_by_input_shape=True)``).
        profile_memory: record the bytes each op's outputs hold (``cpu_memory_usage``).
        with_flops, with_stack, with_modules, use_kineto, use_cpu, experimental_config,
            acc_events: accepted for PyTorch programs; they change nothing here.

    Raises:
        RuntimeError: a profile is already recording on this thread (profiles do not nest).

    Example:
        >>> with profile() as prof:
        ...     y = (x * x).sum()
        >>> prof.key_averages().table(sort_by="self_cpu_time_total")
    """

    def __init__(
        self,
        enabled: bool = True,
        *,
        use_cuda: bool = False,
        use_device: str | None = None,
        record_shapes: bool = False,
        with_flops: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_modules: bool = False,
        use_kineto: bool = False,
        use_cpu: bool = True,
        experimental_config: Any = None,
        acc_events: bool = False,
        custom_trace_id_callback: Any = None,
    ) -> None:
        self.enabled = enabled
        self.use_cuda = use_cuda
        self.use_device = use_device
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self._recorder: _profiling.Recorder | None = None
        self._prev: _profiling.Recorder | None = None
        self._origin_ns = 0
        self._events: EventList | None = None
        self.entered = False

    def __enter__(self) -> profile:
        if not self.enabled:
            return self
        if self.entered:
            raise RuntimeError("profiler context manager is not reentrant")
        if _profiling.thread_recorder() is not None:
            raise RuntimeError(
                "Profiler is already enabled on this thread: end the profile that is "
                "recording before starting another"
            )
        self.entered = True
        self._recorder = _profiling.Recorder(self.record_shapes, self.profile_memory)
        self._origin_ns = _profiling.now_ns()
        self._prev = _profiling.push(self._recorder)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled or self._recorder is None:
            return
        _profiling.pop(self._prev)

    @property
    def function_events(self) -> EventList:
        """Every ended event, sorted by start (RPCs that end after the profile are kept once
        they end). Raises RuntimeError while the profile records."""
        self._check_finished()
        assert self._recorder is not None
        return build_events(self._recorder.events, self._origin_ns)

    def _check_finished(self) -> None:
        if self._recorder is None:
            raise RuntimeError("the profiler was not enabled: no events were recorded")
        if _profiling.thread_recorder() is self._recorder:
            raise RuntimeError("Profiler didn't finish running: read its events after the block")

    def key_averages(
        self, group_by_input_shape: bool = False, group_by_stack_n: int = 0
    ) -> EventList:
        """One row per event name (and worker): see :meth:`EventList.key_averages`."""
        return self.function_events.key_averages(group_by_input_shape)

    def table(self, sort_by: str | None = None, row_limit: int = 100, **kwargs: Any) -> str:
        return self.function_events.table(sort_by=sort_by, row_limit=row_limit, **kwargs)

    def total_average(self) -> FunctionEventAvg:
        return self.function_events.total_average()

    @property
    def self_cpu_time_total(self) -> float:
        return self.function_events.self_cpu_time_total

    def export_chrome_trace(self, path: str) -> None:
        """Write the events as Chrome trace JSON (see :meth:`EventList.export_chrome_trace`)."""
        self.function_events.export_chrome_trace(path)

    def __str__(self) -> str:
        return self.key_averages().table()


class record_function:
    """Label a block (or a function, as a decorator) so it is one event of the profile.

    Args:
        name: the event's name.
        args: accepted (PyTorch's); not recorded.

    Example:
        >>> with record_function("forward"):
        ...     out = model(x)
    """

    def __init__(self, name: str, args: str | None = None) -> None:
        self.name = name
        self.args = args
        self._rec: _profiling.Recorder | None = None
        self._ev: _profiling.Event | None = None
        self._lock = threading.Lock()
        self.run_callbacks_on_exit = True

    def __enter__(self) -> record_function:
        rec = _profiling.current() if _profiling.active else None
        if rec is not None:
            self._rec, self._ev = rec, rec.begin(self.name, kind="user")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.run_callbacks_on_exit:
            self._end()

    def _end(self) -> None:
        with self._lock:
            rec, ev, self._rec, self._ev = self._rec, self._ev, None, None
        if rec is not None and ev is not None:
            rec.end(ev)

    def _call_end_callbacks_on_future(self, fut: Future[Any]) -> Future[Any]:
        """End this block's event when ``fut`` completes, not at the end of the ``with``;
        returns a Future of ``fut``'s value that completes after the event ended."""
        if not isinstance(fut, Future):
            raise TypeError(
                f"_call_end_callbacks_on_future needs a Future, got {type(fut).__name__}"
            )
        if not self.run_callbacks_on_exit:
            raise RuntimeError("_call_end_callbacks_on_future can only be called once.")
        self.run_callbacks_on_exit = False

        def ended(f: Future[Any]) -> Any:
            self._end()
            return f.wait()

        return fut.then(ended)

    def __call__(self, fn: F) -> F:
        import functools

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with record_function(self.name, self.args):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class emit_nvtx:
    """PyTorch's NVTX range emitter: accepted, and does nothing (gradwire has no NVTX)."""

    def __init__(self, enabled: bool = True, record_shapes: bool = False) -> None:
        self.enabled = enabled

    def __enter__(self) -> emit_nvtx:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
