"""The profiler's recording core: which thread records into which session, and the raw events.

A profiling session (``profiler.profile``, a profiled call served for a remote caller, a
cluster profile) is a :class:`Recorder`. A thread records into the recorder it pushed
(:func:`push` / :func:`pop`), else into the process-wide one of a cluster profile
(:func:`set_process_recorder`). ``active`` counts the open recorders, so the hot paths (an op's
``record``, the engine running a node) test one module global and pay nothing more while no one
profiles.

Times are ``time.monotonic_ns()``: one clock for every process of a host, so a cluster's events
line up on one host without correction (across hosts the cluster profile estimates offsets).

Example:
    >>> rec = Recorder()
    >>> prev = push(rec)
    >>> try:
    ...     with span("my-block"):
    ...         ...
    ... finally:
    ...     pop(prev)
    >>> [e.name for e in rec.events]
    ['my-block']
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = [
    "Event",
    "Recorder",
    "active",
    "current",
    "push",
    "pop",
    "paused",
    "set_process_recorder",
    "process_recorder",
    "server_profiles",
    "add_server_profile",
    "remove_server_profile",
    "set_node_id",
    "node_id",
    "now_ns",
    "span",
    "traced",
    "op_name",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Recorders open in this process (pushed on some thread, or process-wide).
active = 0
_count_lock = threading.Lock()
_tls = threading.local()
_process: Recorder | None = None
#: Profiles that collect the events of every call this process serves, one list per call
#: (``rpc._server_process_global_profile``); each has ``add_group(events)``.
server_profiles: tuple[Any, ...] = ()


def _no_node() -> int:
    return -1


_node_id: Callable[[], int] = _no_node

now_ns = time.monotonic_ns


class Event:
    """One recorded interval.

    Attributes:
        name: what ran ("aten::add", "rpc_async#f(worker0 -> worker1)", a record_function name).
        start_ns, end_ns: its interval (end_ns is 0 while it runs).
        thread: the recording thread's ``threading.get_ident()``.
        node_id: the worker it ran on (-1 outside an RPC cluster).
        input_shapes: with record_shapes, each input's shape ([] for a non-tensor).
        cpu_memory_usage: with profile_memory, the bytes its outputs hold.
        sequence_nr: an autograd node's forward sequence number, else -1.
        is_remote: recorded by another worker and sent back with a call's reply.
        kind: "op", "backward", "user", "rpc" (a call made), "serve" (a call served).
        flow: for "rpc" and "serve": (caller id, message id), which links a call to its
            serving in a cluster trace; None otherwise.
    """

    __slots__ = (
        "name",
        "start_ns",
        "end_ns",
        "thread",
        "node_id",
        "input_shapes",
        "cpu_memory_usage",
        "sequence_nr",
        "is_remote",
        "kind",
        "flow",
    )

    def __init__(self, name: str, kind: str = "op", start_ns: int | None = None) -> None:
        self.name = name
        self.kind = kind
        self.start_ns = now_ns() if start_ns is None else start_ns
        self.end_ns = 0
        self.thread = threading.get_ident()
        self.node_id = _node_id()
        self.input_shapes: list[list[int]] = []
        self.cpu_memory_usage = 0
        self.sequence_nr = -1
        self.is_remote = False
        self.flow: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return f"<Event {self.name!r} node {self.node_id} {self.start_ns}-{self.end_ns}>"


class Recorder:
    """The events of one profiling session (appended from any thread).

    Args:
        record_shapes: record each op's input shapes.
        profile_memory: record the bytes each op's outputs hold.
    """

    def __init__(self, record_shapes: bool = False, profile_memory: bool = False) -> None:
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.events: list[Event] = []

    def begin(self, name: str, inputs: Any = None, kind: str = "op") -> Event:
        """Start an event (appended now, so events keep their start order)."""
        ev = Event(name, kind)
        if self.record_shapes and inputs is not None:
            ev.input_shapes = [_shape_of(x) for x in inputs]
        self.events.append(ev)  # list.append is atomic: no lock between threads
        return ev

    def end(self, ev: Event, out: Any = None) -> None:
        """End ``ev``; ``out`` (the op's result) counts toward its memory."""
        ev.end_ns = now_ns()
        if self.profile_memory and out is not None:
            ev.cpu_memory_usage = _nbytes(out)

    def add(self, ev: Event) -> None:
        self.events.append(ev)


def _shape_of(x: Any) -> list[int]:
    shape = getattr(getattr(x, "_data", x), "shape", None)  # a Tensor or an array
    return [int(s) for s in shape] if isinstance(shape, tuple) else []


def _nbytes(out: Any) -> int:
    if isinstance(out, (tuple, list)):
        return sum(_nbytes(o) for o in out)
    n = getattr(getattr(out, "_data", out), "nbytes", 0)
    return n if isinstance(n, int) else 0


def _count(delta: int) -> None:
    global active
    with _count_lock:
        active += delta


def current() -> Recorder | None:
    """The recorder this thread records into, or None."""
    rec: Recorder | None = getattr(_tls, "recorder", None)
    if rec is not None:
        return rec
    return None if getattr(_tls, "paused", False) else _process


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """This thread records nothing into the process-wide recorder meanwhile (the calls that
    start and stop a cluster profile are not part of it)."""
    prev = getattr(_tls, "paused", False)
    _tls.paused = True
    try:
        yield
    finally:
        _tls.paused = prev


def push(rec: Recorder) -> Recorder | None:
    """Make ``rec`` this thread's recorder; returns the one to give :func:`pop`."""
    prev: Recorder | None = getattr(_tls, "recorder", None)
    _tls.recorder = rec
    _count(1)
    return prev


def pop(prev: Recorder | None) -> None:
    """Undo the matching :func:`push`."""
    _tls.recorder = prev
    _count(-1)


def thread_recorder() -> Recorder | None:
    """The recorder this thread pushed (not the process-wide one), or None."""
    rec: Recorder | None = getattr(_tls, "recorder", None)
    return rec


def set_process_recorder(rec: Recorder | None) -> Recorder | None:
    """Make ``rec`` the recorder of every thread that pushed none (a cluster profile); None
    ends it. Returns the recorder it replaced."""
    global _process
    prev = _process
    _process = rec
    _count((rec is not None) - (prev is not None))
    return prev


def process_recorder() -> Recorder | None:
    return _process


def add_server_profile(prof: Any) -> None:
    """Start giving ``prof`` the events of each call served (``prof.add_group(events)``)."""
    global server_profiles
    with _count_lock:
        server_profiles = (*server_profiles, prof)
    _count(1)


def remove_server_profile(prof: Any) -> None:
    global server_profiles
    with _count_lock:
        server_profiles = tuple(p for p in server_profiles if p is not prof)
    _count(-1)


def set_node_id(fn: Callable[[], int]) -> None:
    """Where events read their worker id (the RPC agent sets it at init)."""
    global _node_id
    _node_id = fn


def node_id() -> int:
    return _node_id()


@contextlib.contextmanager
def span(name: str, kind: str = "user") -> Iterator[Event | None]:
    """Record the block as one event when this thread records (else nothing)."""
    rec = current() if active else None
    if rec is None:
        yield None
        return
    ev = rec.begin(name, kind=kind)
    try:
        yield ev
    finally:
        rec.end(ev)


def traced(name: str) -> Callable[[F], F]:
    """Decorate a tensor-making function so it is an op event named ``name``."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if active:
                rec = current()
                if rec is not None:
                    ev = rec.begin(name, args)
                    out = None
                    try:
                        out = fn(*args, **kwargs)
                        return out
                    finally:
                        rec.end(ev, out)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


#: Op classes whose PyTorch operator is not their class name in snake case.
_OP_NAMES = {
    "MatMul": "matmul",
    "AddScalar": "add",
    "MulScalar": "mul",
    "DivScalar": "div",
    "RSubScalar": "rsub",
    "RDivScalar": "div",
    "PowScalar": "pow",
    "MaxAll": "max",
    "MaxDim": "max",
    "ToCopy": "_to_copy",
    "CopyFrom": "copy_",
    "Fill": "fill_",
    "EmbeddingLookup": "embedding",
    "EmbeddingScatter": "embedding_dense_backward",
    "EmbeddingSparseGrad": "embedding_sparse_backward",
    "BagSum": "_embedding_bag",
    "BagMax": "_embedding_bag",
    "IndexPut": "index_put_",
    "IndexAddInto": "index_add_",
    "LSTMSeq": "lstm",
    "GRUSeq": "gru",
    "RNNSeq": "rnn_tanh",
    "ArgReduce": "argmax",
    "CopySlices": "copy_",
}
_names: dict[type, str] = {}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def op_name(cls: type, kwargs: dict[str, Any] | None = None) -> str:
    """The operator name an op class records as, PyTorch's where there is one ("aten::add").
    A class whose ``profile_kwarg`` names a keyword argument records as that argument's value
    (a comparison records as "aten::gt")."""
    key = getattr(cls, "profile_kwarg", None)
    if key is not None and kwargs and key in kwargs:
        return f"aten::{kwargs[key]}"
    name = _names.get(cls)
    if name is None:
        plain = cls.__name__.lstrip("_")
        name = _names[cls] = "aten::" + _OP_NAMES.get(plain, _CAMEL.sub("_", plain).lower())
    return name
