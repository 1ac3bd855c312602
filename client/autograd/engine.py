"""The backward engine: dependency counting, then a reverse sweep in the calling thread.

Each call builds its own ``GraphTask`` (dependencies, input buffers), so concurrent backward
calls from several threads never share bookkeeping. Nodes are executed under their own lock,
and release their saved tensors afterwards unless ``retain_graph``; a second sweep through a
released node raises the "backward through the graph a second time" error, also when two
threads race over a shared graph.

The engine is also the base of distributed autograd: ``execute`` takes explicit root edges
and a ``leaf_sink`` that receives leaf gradients instead of ``.grad``.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .._backend import device_scope_of
from .._sparse_coo import SparseCOO
from . import _profiling
from .anomaly_mode import _anomaly, run_backward
from .grad_mode import set_grad_enabled
from .graph import AccumulateGrad, Node

if TYPE_CHECKING:
    from .._tensor import Tensor

__all__ = [
    "execute",
    "GraphTask",
    "RootEdge",
    "LeafSink",
    "set_multithreading_enabled",
    "is_multithreading_enabled",
]

RootEdge = tuple[Node, int, "Tensor"]
#: ``leaf_sink(leaf, grad, owned)``: receives leaf gradients instead of ``.grad`` (see execute).
LeafSink = Callable[["Tensor", "Tensor", bool], None]
_accumulate_lock = threading.Lock()


class _ThreadingFlag:
    __slots__ = ("enabled",)

    def __init__(self) -> None:
        self.enabled = True


_threading = _ThreadingFlag()


def is_multithreading_enabled() -> bool:
    """The ``set_multithreading_enabled`` setting (True by default).

    Returns:
        Whether backward may use worker threads (gradwire's never does; see the class).
    """
    return _threading.enabled


class set_multithreading_enabled:
    """Allow or forbid backward to use worker threads; acts at once when called, and as a
    context manager restores the previous setting on exit (a process-wide switch, as in
    PyTorch).

    gradwire's engine never starts threads: a local backward runs every node on the thread
    that called it (a distributed backward runs each worker's part on the thread serving the
    gradient message). So the setting is recorded and reported by
    ``is_multithreading_enabled()``, and either value gives the same single-threaded
    schedule: code written for PyTorch that turns it off keeps working.

    Args:
        mode: False to forbid worker threads.

    Raises:
        TypeError: ``mode`` is not a bool.

    Example:
        >>> with gradwire.autograd.set_multithreading_enabled(False):
        ...     loss.backward()
    """

    def __init__(self, mode: bool) -> None:
        if not isinstance(mode, bool):
            raise TypeError(f"set_multithreading_enabled expects a bool, got {type(mode).__name__}")
        self.mode = mode
        self.prev = _threading.enabled
        _threading.enabled = mode

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        _threading.enabled = self.prev

    def clone(self) -> set_multithreading_enabled:
        """A new switch with the same mode (PyTorch's API for re-entering the setting)."""
        return self.__class__(self.mode)


class GraphTask:
    """Bookkeeping of one backward pass: dependencies, input buffers, the ready queue.

    ``execute`` runs one task start to finish. Distributed autograd keeps a task alive across
    incoming gradient messages: ``add_roots`` / ``add_grad`` / ``release`` / ``run`` let it feed
    gradients for send functions as they arrive.
    """

    def __init__(
        self,
        retain_graph: bool,
        create_graph: bool,
        leaf_sink: LeafSink | None = None,
    ) -> None:
        self.retain_graph = retain_graph
        self.create_graph = create_graph
        self.leaf_sink = leaf_sink
        self.dependencies: dict[Node, int] = {}
        self.buffers: dict[Node, list[Any]] = {}
        self.visited: set[Node] = set()
        self.ready: list[Node] = []
        self.queued: set[Node] = set()
        # For autograd.grad / backward(inputs=...): which (node, output_nr) to capture.
        self.capture: dict[tuple[Node, int], int] | None = None
        self.captured: list[Any] = []
        self.needed: set[Node] | None = None
        # The profile of the thread that started the pass: nodes that run later on other
        # threads (a distributed pass's gradients arriving) record into it too.
        self.recorder = _profiling.current() if _profiling.active else None

    def add_roots(self, roots: Iterable[Node]) -> None:
        """Count the dependencies of everything reachable from ``roots`` not seen before."""
        deps = self.dependencies
        stack = [r for r in roots if r not in self.visited]
        self.visited.update(stack)
        while stack:
            node = stack.pop()
            for nxt, _ in node.next_functions:
                if nxt is None:
                    continue
                deps[nxt] = deps.get(nxt, 0) + 1
                if nxt not in self.visited:
                    self.visited.add(nxt)
                    stack.append(nxt)

    def add_grad(self, node: Node, nr: int, grad: Any) -> None:
        _add_to_buffer(self, node, nr, grad)

    def release(self, node: Node, count: int = 1) -> None:
        """Drop ``count`` dependencies of ``node``; queue it when none are left."""
        left = self.dependencies.get(node, 0) - count
        self.dependencies[node] = left
        if left <= 0 and node not in self.queued:
            self.queued.add(node)
            self.ready.append(node)

    def run(self) -> None:
        """Execute ready nodes until none is left (nodes still waiting stay pending)."""
        with set_grad_enabled(self.create_graph):
            ready = self.ready
            while ready:
                node = ready.pop()
                grads = self.buffers.pop(node, None) or [None] * node._num_outputs
                outs = _run_node(self, node, grads, self.leaf_sink)
                for (nxt, nr), g in zip(node.next_functions, outs):
                    if nxt is None:
                        continue
                    if g is not None:
                        _add_to_buffer(self, nxt, nr, g)
                    self.release(nxt)
                # Drop this frame's references so that reference counts tell _unshared the
                # truth about the next gradients.
                grads = outs = g = None  # type: ignore[assignment]


def _needed_nodes(roots: Iterable[Node], targets: set[Node]) -> set[Node]:
    """Nodes from which some target node is reachable (only those must run)."""
    memo: dict[Node, bool] = {}
    order: list[Node] = []
    stack: list[tuple[Node, bool]] = [(r, False) for r in roots]
    while stack:
        node, done = stack.pop()
        if done:
            memo[node] = node in targets or any(
                memo.get(n, False) for n, _ in node.next_functions if n is not None
            )
            continue
        if node in memo:
            continue
        memo[node] = False
        order.append(node)
        stack.append((node, True))
        for n, _ in node.next_functions:
            if n is not None and n not in memo:
                stack.append((n, False))
    return {n for n, ok in memo.items() if ok}


def _add_to_buffer(task: GraphTask, node: Node, nr: int, grad: Any) -> None:
    buf = task.buffers.get(node)
    if buf is None:
        buf = task.buffers[node] = [None] * max(node._num_outputs, nr + 1)
    elif nr >= len(buf):
        buf.extend([None] * (nr + 1 - len(buf)))
    cur = buf[nr]
    buf[nr] = grad if cur is None else cur + grad


def execute(
    roots: list[RootEdge],
    retain_graph: bool,
    create_graph: bool,
    capture: list[tuple[Node | None, int]] | None = None,
    leaf_sink: LeafSink | None = None,
    extra_roots: Iterable[Node] = (),
) -> list[Any]:
    """Run a backward pass from ``roots`` (node, output_nr, gradient).

    Args:
        roots: the starting edges with their gradients.
        retain_graph: keep saved tensors after the pass.
        create_graph: record the backward pass itself (higher-order gradients).
        capture: if given, compute only gradients flowing into these edges and return them
            (``autograd.grad``); leaves are not accumulated.
        leaf_sink: if given, called as ``leaf_sink(leaf, grad, owned)`` instead of
            accumulating into ``leaf.grad`` (distributed autograd's per-context store);
            ``owned``: nothing but the engine holds ``grad`` or its buffer, so the sink may keep
            it without a copy (the rule ``.grad`` follows, see ``_unshared``).
        extra_roots: nodes that start with no gradient but count as roots for dependencies
            (distributed autograd's send functions).

    Returns:
        The captured gradients, in ``capture`` order (empty when capture is None).
    """
    task = GraphTask(retain_graph, create_graph, leaf_sink)
    root_nodes = [n for n, _, _ in roots]
    all_roots = root_nodes + [n for n in extra_roots if n not in root_nodes]
    task.add_roots(all_roots)
    if capture is not None:
        task.capture = {}
        for i, (cnode, cnr) in enumerate(capture):
            if cnode is not None:  # an input outside the graph simply gets no gradient
                task.capture.setdefault((cnode, cnr), i)
        task.captured = [None] * len(capture)
        task.needed = _needed_nodes(all_roots, {n for n, _ in task.capture})
    for node, nr, grad in roots:
        task.add_grad(node, nr, grad)
    for n in all_roots:
        task.release(n, 0)
    task.run()
    return task.captured


def _call_pre_hooks(node: Node, grads: list[Any]) -> list[Any]:
    if node._pre_hooks is None and node._retain_grad_hooks is None:
        return grads
    hooks = node._pre_hooks
    if hooks:
        for nr, fns in hooks.items():
            if nr < 0:
                continue
            for fn in list(fns):
                if grads[nr] is not None:
                    new = fn(grads[nr])
                    if new is not None:
                        grads[nr] = new
        for fn in list(hooks.get(-1, ())):
            new = fn(tuple(grads))
            if new is not None:
                grads = list(new)
    if node._retain_grad_hooks:
        for nr, fn in node._retain_grad_hooks.items():
            if nr < len(grads) and grads[nr] is not None:
                fn(grads[nr])
    return grads


def _run_node(task: GraphTask, node: Node, grads: list[Any], leaf_sink: Any) -> tuple[Any, ...]:
    rec = task.recorder
    if rec is None and _profiling.active:  # one global test while no one profiles
        rec = _profiling.current()
    if rec is not None:
        ev = rec.begin(f"autograd::engine::evaluate_function: {node.name()}", kind="backward")
        try:
            return _run_node_on_device(task, node, grads, leaf_sink)
        finally:
            rec.end(ev)
    return _run_node_on_device(task, node, grads, leaf_sink)


def _run_node_on_device(
    task: GraphTask, node: Node, grads: list[Any], leaf_sink: Any
) -> tuple[Any, ...]:
    scope = device_scope_of(grads)
    if scope is None:
        return _run_node_here(task, node, grads, leaf_sink)
    with scope:  # a backward on a GPU runs on its gradients' device
        return _run_node_here(task, node, grads, leaf_sink)


def _run_node_here(
    task: GraphTask, node: Node, grads: list[Any], leaf_sink: Any
) -> tuple[Any, ...]:
    grads = _call_pre_hooks(node, grads)
    if task.capture is not None:
        for nr, g in enumerate(grads):
            idx = task.capture.get((node, nr))
            if idx is not None:
                task.captured[idx] = g
        if task.needed is not None and node not in task.needed:
            return (None,) * len(node.next_functions)
    if isinstance(node, AccumulateGrad):
        if task.capture is None:
            if grads[0] is not None:
                _accumulate(node.variable, grads[0], task.create_graph, leaf_sink)
            # PyTorch calls them with no outputs (AccumulateGrad has none), also in a
            # distributed pass, where the gradient went to the context instead of .grad.
            for fn in list(node._post_hooks or ()):
                fn((), tuple(grads))
        return ()
    if not node.run_without_grads and all(g is None for g in grads):
        return (None,) * len(node.next_functions)
    with node._lock:
        if _anomaly.enabled:
            out = run_backward(node, grads)  # traces a failure or NaN to the forward op
        else:
            node._check_not_released()
            out = node.backward(*grads)
        if not task.retain_graph:
            node.release_saved()
    if not isinstance(out, tuple):
        out = (out,)
    if len(out) != len(node.next_functions):
        raise RuntimeError(
            f"function {node.name()} returned an incorrect number of gradients "
            f"(expected {len(node.next_functions)}, got {len(out)})"
        )
    if node._post_hooks:
        for fn in list(node._post_hooks):
            new = fn(out, tuple(grads))
            if new is not None:
                out = tuple(new)
    return out


def _refcounts(grad: Any) -> tuple[int, int]:
    """The reference counts of ``grad`` and of its buffer, seen from here."""
    data = grad._data
    return sys.getrefcount(grad), sys.getrefcount(data)


def _unshared(grad: Any) -> bool:
    """True when no one but the engine holds ``grad`` or its buffer, so ``.grad`` may take the
    buffer without a copy (later accumulation writes into it in place). The counts are those
    of a gradient nobody else holds, measured at import (:data:`_FRESH_GRAD_REFS`): what an
    interpreter counts for a call's arguments differs between Python releases. A view
    (``base``), a user-provided gradient, or one gradient object reaching two leaves all count
    more."""
    data = grad._data
    if type(data) is SparseCOO:
        # PyTorch's rule for a sparse gradient: the tensor unshared and its indices and
        # values contiguous. Views of them (``_indices()``, ``_values()``) do not count.
        if not (data.indices.flags.c_contiguous and data.values.flags.c_contiguous):
            return False
    elif getattr(data, "base", 1) is not None:
        return False
    del data
    refs, data_refs = _refcounts(grad)
    return refs <= _FRESH_GRAD_REFS[0] and data_refs <= _FRESH_GRAD_REFS[1]


class _Probe:
    def __init__(self) -> None:
        self._data = _Probe.__new__(_Probe)


def _as_accumulate_calls(leaf: Any, grad: Any, create_graph: bool, leaf_sink: Any) -> Any:
    """Calls :func:`_refcounts` as :func:`_accumulate` calls :func:`_unshared`."""
    return _as_unshared_calls(grad)


def _as_unshared_calls(grad: Any) -> tuple[int, int]:
    return _refcounts(grad)


def _fresh_grad_refs() -> tuple[int, int]:
    """The counts :func:`_unshared` sees for a gradient held only by the engine's list slot
    (``grads[0]`` in :func:`_run_node_here`) and for a buffer held only by its tensor."""
    grads = [_Probe()]
    return _as_accumulate_calls(None, grads[0], False, None)


_FRESH_GRAD_REFS = _fresh_grad_refs()


def _accumulate_sparse(leaf: Tensor, cur: Tensor, grad: Tensor) -> None:
    """PyTorch's rules when either gradient is sparse: sparse + sparse stays sparse (in the
    same ``.grad`` tensor), dense + sparse is added into the dense buffer, and a sparse
    ``.grad`` meeting a dense gradient becomes a new dense ``.grad``."""
    if type(cur._data) is SparseCOO and type(grad._data) is not SparseCOO:
        leaf._grad = grad.detach() + cur.detach()  # a new dense tensor
        return
    cur.add_(grad)


def _accumulate(leaf: Tensor, grad: Tensor, create_graph: bool, leaf_sink: Any) -> None:
    from .._tensor import Tensor

    if leaf._hooks:
        for fn in list(leaf._hooks):
            new = fn(grad)
            if new is not None:
                grad = new
    if grad._data.shape != leaf._data.shape:
        raise RuntimeError(
            f"Function AccumulateGrad returned an invalid gradient - got {list(grad.shape)} but expected shape compatible with {list(leaf.shape)}"
        )
    if leaf_sink is not None:
        owned = _unshared(grad)  # first: the call below holds grad on the stack while it runs
        leaf_sink(leaf, grad, owned)
        return
    with _accumulate_lock:
        cur = leaf._grad
        if cur is None:
            if create_graph:
                leaf._grad = grad
            else:
                if grad._data.dtype != leaf._data.dtype:
                    leaf._grad = Tensor._wrap(grad._data.astype(leaf._data.dtype))
                elif _unshared(grad):
                    leaf._grad = Tensor._wrap(grad._data)  # nothing else can see it: no copy
                else:
                    leaf._grad = Tensor._wrap(grad._data.copy())
        elif create_graph or cur.requires_grad:
            leaf._grad = cur + grad
        elif type(cur._data) is SparseCOO or type(grad._data) is SparseCOO:
            _accumulate_sparse(leaf, cur, grad)
        else:
            cur._data += grad._data
            cur._vc.value += 1
