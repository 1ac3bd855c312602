"""Distributed autograd, transport-free: contexts, send/recv functions, and the FAST-mode engine.

The agent drives this module; nothing here imports gRPC. Outgoing messages go through a
``DistTransport`` (``send_gradients`` / ``release_context`` returning futures), incoming ones
arrive at ``DistAutogradEngine.on_gradients`` / ``DistAutogradContainer.release``.

Recording (forward pass). Inside a context, a message that carries tensors requiring grad gets
a globally unique ``message_id``. The sender attaches a ``SendFunction`` whose edges point at the
sent tensors' graph nodes; the receiver attaches a ``RecvFunction`` as the ``grad_fn`` of the
tensors it rebuilt. Both are kept in the context under the message id.

Backward (FAST mode, as in the design note). The originator computes dependencies from its roots
plus every send function of the context, where each send function waits for exactly one
gradient message; it runs its local engine; a recv function's backward sends its gradients to the
peer's send function (PropagateGradients); a worker that first hears of the pass computes its
dependencies the same way. Gradients of leaves go to the context's store, never to ``.grad``.

Beyond PyTorch: unused RPC outputs never hang a pass, and gradients stay exact. FAST mode stalls
when a recv function is not reachable from its worker's roots and send functions (the RPC output
did not reach the loss): its peer's send function then never gets a gradient, and everything that
also waits on that send function never runs. gradwire fixes this at the source: when a worker
starts a pass, every recv function it cannot reach is fired at once with "no gradient" (its
outputs influence nothing being differentiated there, so their gradient is zero), which releases
the peer's send function with zero gradient. A call that received tensors requiring grad always
answers with a send/recv pair, even when its result carries no such tensor, so every worker that
took part hears of the pass. Such an empty pair is kept apart from the context's send and recv
functions (``empty_sends`` / ``empty_recvs``): it is the autograd function of no tensor, and
PyTorch records nothing there, so ``_send_functions()`` / ``_recv_functions()`` show what
PyTorch's show. Because forward messages are ordered in time, the send/recv pairs form no
cycle, so every send function eventually fires: the pass always finishes.

Calls in flight. A worker starting or joining a pass first waits for the answers of its
context's calls that sent tensors requiring grad and are still unanswered (``inflight``): their
reply pairs tell the pass which workers it must reach.

Completion. A PropagateGradients request is answered once its worker's ready queue is empty and
every gradient message that its processing sent has been answered; so when the originator's own
queue is empty and its messages are answered, the whole distributed pass is quiescent. A failure
anywhere (an exception in a backward function, a dead peer) fails that answer and reaches the
originator, naming the worker where it happened.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..._ops._base import edge_of
from ...autograd import _root_edges
from ...autograd.engine import GraphTask, LeafSink
from ...autograd.graph import Node
from ...errors import ArgumentError, RemoteError
from ...futures import Future
from ..util.tombstones import Tombstones
from .inflight import CallsInFlight

__all__ = [
    "DistTransport",
    "DistAutogradContext",
    "DistAutogradContainer",
    "DistAutogradEngine",
    "SendFunction",
    "RecvFunction",
    "ContextError",
    "record_send",
    "record_recv",
]

_CTX_SHIFT = 48


class ContextError(RuntimeError):
    """A distributed autograd context is unknown, released, nested, or used from the wrong place."""


class DistTransport(Protocol):
    """What the engine needs from the agent."""

    def send_gradients(
        self,
        dst: int,
        context_id: int,
        message_id: int,
        pass_id: int,
        retain_graph: bool,
        grads: list[Any],
        here: bool = False,
    ) -> Future[Any]:
        """Deliver gradients for send function ``message_id`` on worker ``dst``; the future
        completes when ``dst`` finished processing them (or fails with the reason). ``here``:
        the calling thread has nothing else to do until then, so the transport may send and
        wait on it (no hand-off to another thread and back)."""
        ...

    def release_context(self, dst: int, context_id: int) -> Future[Any]:
        """Tell worker ``dst`` to drop the context (idempotent, retried by the agent)."""
        ...


class SendFunction(Node):
    """Sender side of one message: in backward it receives the peer's gradients (as its input
    gradients) and passes them on to the sent tensors' nodes."""

    def __init__(self, message_id: int, dst: int, num_tensors: int) -> None:
        self.message_id = message_id
        self.dst = dst
        self._num_outputs = num_tensors

    def name(self) -> str:
        return "torch::distributed::autograd::SendRpcBackward"  # PyTorch's (C++) name

    def backward(self, *grads: Any) -> Any:
        return grads


class RecvFunction(Node):
    """Receiver side of one message: the rebuilt tensors' grad_fn; in backward it sends their
    gradients to the sender's SendFunction."""

    run_without_grads = True  # must answer its peer even when no gradient reached it
    #: True when the message was the reply to this worker's own call (set by the agent): the
    #: gradients then go back by this worker's device map instead of the inverse of the peer's.
    forward_was_reply = False

    def __init__(self, message_id: int, src: int, num_tensors: int) -> None:
        self.message_id = message_id
        self.src = src
        self._num_outputs = num_tensors
        self.next_functions = ()

    def name(self) -> str:
        return "torch::distributed::autograd::RecvRpcBackward"  # PyTorch's (C++) name

    def backward(self, *grads: Any) -> Any:
        _current_pass().send(self, list(grads))
        return ()


@dataclass
class _PassState:
    """One backward pass of one context on one worker."""

    pass_id: int
    task: GraphTask
    lock: threading.Lock = field(default_factory=threading.Lock)
    failed: BaseException | None = None


class DistAutogradContext:
    """Per-worker state of one distributed autograd context."""

    def __init__(self, context_id: int) -> None:
        self.context_id = context_id
        self.lock = threading.Lock()
        # By message id, in the order they were recorded. Messages that carried tensors
        # requiring grad (what PyTorch records):
        self.send_functions: dict[int, SendFunction] = {}
        self.recv_functions: dict[int, RecvFunction] = {}
        # Empty pairs, replies that carried none (module docstring): they only tell the callee
        # of every pass, so that it releases the caller's send functions.
        self.empty_sends: dict[int, SendFunction] = {}
        self.empty_recvs: dict[int, RecvFunction] = {}
        self.known_workers: set[int] = set()
        #: Calls made here in this context whose answer is outstanding (``inflight``).
        self.calls = CallsInFlight(context_id)
        self._grads: dict[int, tuple[Any, Any]] = {}  # id(tensor) -> (tensor, gradient)
        self.passes: dict[int, _PassState] = {}

    def add_send(self, fn: SendFunction) -> None:
        with self.lock:
            (self.send_functions if fn._num_outputs else self.empty_sends)[fn.message_id] = fn
            self.known_workers.add(fn.dst)

    def add_recv(self, fn: RecvFunction) -> None:
        with self.lock:
            (self.recv_functions if fn._num_outputs else self.empty_recvs)[fn.message_id] = fn
            self.known_workers.add(fn.src)

    def send_function(self, message_id: int) -> SendFunction | None:
        """The send function (empty or not) of message ``message_id``, if recorded here."""
        with self.lock:
            fn = self.send_functions.get(message_id)
            return fn if fn is not None else self.empty_sends.get(message_id)

    def recv_function(self, message_id: int) -> RecvFunction | None:
        """The recv function (empty or not) of message ``message_id``, if recorded here."""
        with self.lock:
            fn = self.recv_functions.get(message_id)
            return fn if fn is not None else self.empty_recvs.get(message_id)

    def accumulate(self, leaf: Any, grad: Any, owned: bool = False) -> None:
        """Add ``grad`` to this context's gradient of ``leaf`` (never to ``leaf.grad``); the
        store keeps it on the leaf's device (a device array, not a host copy).

        PyTorch's rule for the first gradient of a leaf: it is stored without a copy when
        ``owned`` (nothing else holds it or its buffer) and it has the leaf's layout; otherwise
        a copy is stored, so the store never aliases a tensor someone else can see or change."""
        g = grad.detach()
        if g.device != leaf.device:
            g = g.to(leaf.device)  # a new buffer already
        elif not owned or (not g.is_sparse and g._data.strides != leaf._data.strides):
            g = g.clone()
        with self.lock:
            prev = self._grads.get(id(leaf))
            # Out of place: the same gradient tensor may be stored for several leaves.
            self._grads[id(leaf)] = (leaf, g if prev is None else prev[1] + g)

    def gradients(self) -> dict[Any, Any]:
        """{tensor: gradient} for the leaves of this worker that got a gradient."""
        with self.lock:
            return {t: g for t, g in self._grads.values()}


class DistAutogradContainer:
    """All contexts of one worker, and the current context of each thread."""

    def __init__(
        self,
        worker_id: int,
        released_ttl: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            worker_id: this worker's id (the high bits of the context ids it creates).
            released_ttl: seconds a released context id is remembered, so that a late call in
                it is refused instead of re-creating it (None: for ever). It must exceed the
                longest time a call can stay in flight; a soak showed the unbounded set
                growing by a few hundred bytes per context.
            clock: monotonic clock (tests pass a fake one).
        """
        if not 0 <= worker_id < (1 << 15):
            raise ValueError(f"worker id {worker_id} does not fit a context id (0..32767)")
        self.worker_id = worker_id
        self._counter = itertools.count(1)
        self._messages = itertools.count(1)
        self._lock = threading.Lock()
        self._contexts: dict[int, DistAutogradContext] = {}
        self._released: Tombstones[int] = Tombstones(released_ttl, clock)
        self._local = threading.local()

    # -- ids and lookup -------------------------------------------------------------------------
    def new_context(self) -> DistAutogradContext:
        """A new context owned by this worker, made current in this thread.

        Raises:
            ContextError: if this thread already has a current context (nesting).
        """
        if self.current_id() is not None:
            raise ContextError(
                "Already have an autograd context id for this thread: it is inside distributed "
                f"autograd context {self.current_id()}, and contexts do not nest (leave it first)"
            )
        ctx_id = (self.worker_id << _CTX_SHIFT) + next(self._counter)
        ctx = DistAutogradContext(ctx_id)
        with self._lock:
            self._contexts[ctx_id] = ctx
        self._local.ctx = ctx_id
        return ctx

    def next_message_id(self) -> int:
        """A globally unique autograd message id: (worker_id << 48) + counter."""
        return (self.worker_id << _CTX_SHIFT) + next(self._messages)

    def current_id(self) -> int | None:
        return getattr(self._local, "ctx", None)

    def set_current(self, ctx_id: int | None) -> int | None:
        """Make ``ctx_id`` current in this thread (the callee of a call made in a context);
        returns the previous value for restoring."""
        prev = self.current_id()
        self._local.ctx = ctx_id
        return prev

    def get(self, ctx_id: int) -> DistAutogradContext:
        """The context, or a clear error when it is unknown or released."""
        with self._lock:
            ctx = self._contexts.get(ctx_id)
            released = ctx_id in self._released
        if ctx is None:
            state = "it was released" if released else "it is not known on this worker"
            raise ContextError(f"Could not find autograd context with id: {ctx_id} ({state})")
        return ctx

    def get_or_create(self, ctx_id: int) -> DistAutogradContext:
        """The context a call from another worker runs in (created on first use)."""
        with self._lock:
            ctx = self._contexts.get(ctx_id)
            if ctx is None:
                if ctx_id in self._released:
                    raise ContextError(
                        f"distributed autograd context {ctx_id} was already released"
                    )
                ctx = self._contexts[ctx_id] = DistAutogradContext(ctx_id)
            return ctx

    def release(self, ctx_id: int) -> DistAutogradContext | None:
        """Drop a context; returns it (for forwarding the release) or None if already gone."""
        with self._lock:
            ctx = self._contexts.pop(ctx_id, None)
            self._released.add(ctx_id)
        if self.current_id() == ctx_id:
            self._local.ctx = None
        return ctx

    def contexts_of(self, worker_id: int) -> list[int]:
        """Ids of live contexts created by ``worker_id`` (reclaimed when that worker dies)."""
        with self._lock:
            return [c for c in self._contexts if c >> _CTX_SHIFT == worker_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._contexts)


def record_send(
    ctx: DistAutogradContext, tensors: list[Any], dst: int, message_id: int
) -> SendFunction:
    """Attach a send function for ``tensors`` (sent to worker ``dst``) to the context."""
    fn = SendFunction(message_id, dst, len(tensors))
    fn.next_functions = tuple(edge_of(t) if t.requires_grad else (None, 0) for t in tensors)
    ctx.add_send(fn)
    return fn


def record_recv(
    ctx: DistAutogradContext, tensors: list[Any], src: int, message_id: int
) -> RecvFunction:
    """Make a recv function the ``grad_fn`` of ``tensors`` (received from worker ``src``)."""
    fn = RecvFunction(message_id, src, len(tensors))
    for i, t in enumerate(tensors):
        if t._data.dtype.kind in "fc":
            t._requires_grad = False
            t._grad_fn, t._output_nr = fn, i
    fn._output_meta = [(t._data.shape, t._data.dtype, t.device) for t in tensors]
    ctx.add_recv(fn)
    return fn


def _leaf_sink(ctx: DistAutogradContext) -> LeafSink:
    """Where one pass's leaf gradients go: the context's store. A gradient that reached a leaf
    while shared is never stored without a copy for any leaf of the pass, as in PyTorch (whose
    distributed engine holds every gradient until the pass is done): one gradient given to two
    leaves is copied for both, not only for the first."""
    # Data pointers of such gradients (two tensor objects may share one buffer); an address
    # reused later by another buffer only costs a copy.
    shared: set[int] = set()

    def sink(leaf: Any, grad: Any, owned: bool) -> None:
        ptr = (grad._values() if grad.is_sparse else grad).data_ptr()
        if not owned:
            shared.add(ptr)
        elif ptr in shared:
            owned = False
        ctx.accumulate(leaf, grad, owned)

    return sink


def _on_node(exc: BaseException, worker_id: int) -> BaseException:
    """``exc``, raised here while handling a peer's gradients, in PyTorch's form for the peer:
    the same type and traceback, its message prefixed with "Error on Node <worker id>: ". An
    error that came from another worker already names its worker and is kept."""
    if isinstance(exc, RemoteError) or not isinstance(exc, Exception):
        return exc
    try:
        named = copy.copy(exc)
        named.args = (f"Error on Node {worker_id}: {exc}",)
    except Exception:  # noqa: BLE001 - a type that does not copy: sent as it is
        return exc
    named.__cause__, named.__context__ = exc.__cause__, exc.__context__
    named.__suppress_context__ = exc.__suppress_context__
    return named.with_traceback(exc.__traceback__)


_tls = threading.local()


class _Collector:
    """The pass being run by this thread, and the messages its nodes sent."""

    def __init__(
        self, engine: DistAutogradEngine, ctx: DistAutogradContext, state: _PassState, retain: bool
    ) -> None:
        self.engine, self.ctx, self.state, self.retain = engine, ctx, state, retain
        self.futures: list[Future[Any]] = []
        #: The message of a recv function that ran last (nothing was left in the ready queue):
        #: sent by this thread itself once the run is over and the pass's lock is released.
        self.last: tuple[RecvFunction, list[Any]] | None = None

    def send(self, recv: RecvFunction, grads: list[Any]) -> None:
        if self.last is None and not self.state.task.ready:
            # Nothing runs here after this node (a recv function has no next functions), so
            # waiting until the run ends delays nothing, and the answer is what this thread
            # waits for next: one thread, no hand-off to the pool and back.
            self.last = (recv, grads)
            return
        self.futures.append(self._send(recv, grads, here=False))

    def _send(self, recv: RecvFunction, grads: list[Any], here: bool) -> Future[Any]:
        return self.engine.transport.send_gradients(
            recv.src,
            self.ctx.context_id,
            recv.message_id,
            self.state.pass_id,
            self.retain,
            grads,
            here=here,
        )

    def flush(self, here: bool) -> None:
        """Send the held message (call with no lock held): ``here`` on this thread, which
        then waits for its answer, or else handed off (the run failed)."""
        if self.last is not None:
            recv, grads = self.last
            self.last = None
            self.futures.append(self._send(recv, grads, here=here))


def _current_pass() -> _Collector:
    col = getattr(_tls, "collector", None)
    if col is None:
        raise ContextError(
            "a recv function ran outside a distributed backward pass; use "
            "gradwire.distributed.autograd.backward(context_id, roots)"
        )
    return col


class DistAutogradEngine:
    """Runs FAST-mode backward passes of this worker's contexts."""

    def __init__(
        self,
        container: DistAutogradContainer,
        transport: DistTransport,
        worker_name: str = "",
        wrap_error: Callable[[BaseException], BaseException] | None = None,
    ) -> None:
        self.container = container
        self.transport = transport
        self.worker_name = worker_name or f"worker{container.worker_id}"
        self._pass_ids = itertools.count(1)
        self._wrap_error = wrap_error
        self._active_lock = threading.Lock()
        # pass id -> runs of it in progress here (the originator's backward(), the handling of
        # each gradient message); a pass counts once however many messages it is handling.
        self._active: dict[int, int] = {}

    @property
    def active_passes(self) -> int:
        """Backward passes this worker is taking part in now, originated here or joined
        (PyTorch's num_current_backward_passes)."""
        with self._active_lock:
            return len(self._active)

    def _enter(self, pass_id: int) -> None:
        with self._active_lock:
            self._active[pass_id] = self._active.get(pass_id, 0) + 1

    def _leave(self, pass_id: int) -> None:
        with self._active_lock:
            left = self._active[pass_id] - 1
            if left:
                self._active[pass_id] = left
            else:
                del self._active[pass_id]

    # -- the originator --------------------------------------------------------------------------
    def backward(self, context_id: int, roots: list[Any], retain_graph: bool = False) -> None:
        """Run a distributed backward pass from local scalar ``roots``; blocks until it is done.

        Raises:
            ContextError: unknown context.
            RuntimeError / the remote exception: a failure on any worker, naming it.
        """
        ctx = self.container.get(context_id)
        if not roots:
            raise ArgumentError("backward() needs at least one root tensor (got an empty list)")
        edges = _root_edges(list(roots), [None] * len(roots), "roots")
        pass_id = (self.container.worker_id << _CTX_SHIFT) + next(self._pass_ids)
        self._enter(pass_id)
        try:
            ctx.calls.wait()  # every reply pair is recorded before the pass counts them
            state = self._start_pass(ctx, pass_id, retain_graph, [n for n, _, _ in edges])
            col = _Collector(self, ctx, state, retain_graph)
            try:
                with state.lock:
                    for node, nr, grad in edges:
                        state.task.add_grad(node, nr, grad)
                    for node, _, _ in edges:
                        state.task.release(node, 0)
                    self._run(col, ctx, state)
            except BaseException:
                col.flush(here=False)  # a failed run still answers its peers
                raise
            self._finish(col).wait()
        finally:
            self._leave(pass_id)

    # -- a peer's gradients arrive ---------------------------------------------------------------
    def on_gradients(
        self, context_id: int, message_id: int, pass_id: int, retain_graph: bool, grads: list[Any]
    ) -> Future[Any]:
        """Feed gradients into send function ``message_id``; the future completes when this
        worker has processed everything they made ready (and its own messages are answered).
        The engine takes ``grads`` over (its items are replaced by None)."""
        self._enter(pass_id)
        done = self._on_gradients(context_id, message_id, pass_id, retain_graph, grads)
        done.add_done_callback(lambda _: self._leave(pass_id))
        return done

    def _on_gradients(
        self, context_id: int, message_id: int, pass_id: int, retain_graph: bool, grads: list[Any]
    ) -> Future[Any]:
        try:
            ctx = self.container.get(context_id)
            send = ctx.send_function(message_id)
            if send is None:
                raise ContextError(
                    f"distributed autograd context {context_id} on {self.worker_name} has no send "
                    f"function for message {message_id}"
                )
            with ctx.lock:
                state = ctx.passes.get(pass_id)
            if state is None:
                ctx.calls.wait()  # this worker's own calls in flight, as the originator does
                state = self._start_pass(ctx, pass_id, retain_graph, [])
            col = _Collector(self, ctx, state, retain_graph)
            try:
                self._feed(col, ctx, state, send, message_id, grads)
            except BaseException:
                col.flush(here=False)  # a failed run still answers its peers
                raise
        except BaseException as exc:  # noqa: BLE001 - reported to the peer, never swallowed
            fut: Future[Any] = Future()
            fut.set_exception(self._wrap(_on_node(exc, self.container.worker_id)))
            return fut
        return self._finish(col)

    def _feed(
        self,
        col: _Collector,
        ctx: DistAutogradContext,
        state: _PassState,
        send: SendFunction,
        message_id: int,
        grads: list[Any],
    ) -> None:
        """Give a message's gradients to its send function and run what they make ready."""
        with state.lock:
            if state.failed is not None:
                raise state.failed
            if len(grads) != send._num_outputs:
                raise ContextError(
                    f"message {message_id} carries {len(grads)} gradients for a send function of "
                    f"{send._num_outputs} tensors"
                )
            # The task takes the tensors over: with no reference left in ``grads``, a received
            # gradient that reaches a leaf unshared is stored without a copy (``_unshared``).
            for nr in range(len(grads)):
                g, grads[nr] = grads[nr], None
                if g is not None:
                    state.task.add_grad(send, nr, g)
            g = None
            state.task.release(send)
            self._run(col, ctx, state)

    # -- internals ---------------------------------------------------------------------------
    def _start_pass(
        self, ctx: DistAutogradContext, pass_id: int, retain: bool, roots: list[Node]
    ) -> _PassState:
        with ctx.lock:
            state = ctx.passes.get(pass_id)
            if state is not None:
                return state
            task = GraphTask(retain, False, _leaf_sink(ctx))
            state = _PassState(pass_id, task)
            # Publish the pass only with its lock held, so that a concurrent message for the
            # same pass waits until the dependencies below are counted.
            state.lock.acquire()
            ctx.passes[pass_id] = state
            sends = [*ctx.send_functions.values(), *ctx.empty_sends.values()]
            recvs = [*ctx.recv_functions.values(), *ctx.empty_recvs.values()]
        try:
            task.add_roots([*roots, *sends])
            for s in sends:
                task.dependencies[s] = task.dependencies.get(s, 0) + 1  # the gradient message
            # Recv functions nothing here can reach would never run: fire them now with no
            # gradient so their peers' send functions are released (see the module docstring).
            dead = [r for r in recvs if r not in task.visited]
            for r in dead:
                task.visited.add(r)
                task.release(r, 0)
        finally:
            state.lock.release()
        return state

    def _run(self, col: _Collector, ctx: DistAutogradContext, state: _PassState) -> None:
        _tls.collector = col
        prev = self.container.set_current(ctx.context_id)
        try:
            state.task.run()
        except BaseException as exc:
            state.failed = self._wrap(exc)
            if state.failed is exc:
                raise
            raise state.failed from exc
        finally:
            self.container.set_current(prev)
            _tls.collector = None

    def _finish(self, col: _Collector) -> Future[Any]:
        """A future completing once every message sent by this run is answered (the held
        one is sent from this thread first, which waits for its answer)."""
        col.flush(here=True)
        done: Future[Any] = Future()
        pending = list(col.futures)
        if not pending:
            done.set_result(None)
            return done
        remaining = [len(pending)]
        lock = threading.Lock()
        first_error: list[BaseException] = []

        def one(f: Future[Any]) -> None:
            err = f.exception()
            with lock:
                if err is not None and not first_error:
                    first_error.append(err)
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                if first_error:
                    done.set_exception(first_error[0])
                else:
                    done.set_result(None)

        for f in pending:
            f.add_done_callback(one)
        return done

    def _wrap(self, exc: BaseException) -> BaseException:
        if self._wrap_error is not None:
            return self._wrap_error(exc)
        return exc
