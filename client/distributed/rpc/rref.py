"""``RRef``: a reference to a value that lives on one worker (its owner), usable from any worker.

An RRef on its owner is an OwnerRRef (it holds the value); anywhere else it is a UserRRef (one
fork of it, counted by the owner). RRefs travel as arguments and return values of
``rpc_sync``, ``rpc_async`` and ``remote`` (nested in containers too): the wire pickler moves
them into the payload's RRef side table, forking them for the receiver, and the receiver
becomes a new UserRRef (or gets the OwnerRRef back, on the owner). The owner deletes the value
once no fork is alive and nothing local refers to it; a UserRRef object tells the owner when
it is garbage collected. See ``gradwire._runtime.rref.protocol`` for the protocol.

Example:
    >>> rref = rpc.remote("worker1", operator.add, (2, 3))
    >>> rref.to_here()
    5
    >>> rpc.rpc_sync("worker2", use_it, (rref,))      # worker2 gets its own UserRRef
    >>> rref.rpc_sync().bit_length()                   # runs int.bit_length on worker1
    3
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..._runtime import agent as _agent
from ..._runtime.calls.callee import ASYNC_EXECUTION_ATTR
from ..._runtime.cluster.workers import WorkerInfo
from ..._runtime.rref.errors import RRefProtocolError
from ..._runtime.rref.outcome import outcome
from ..._runtime.rref.protocol import RRefHandle
from ..._runtime.rref.wire import fork_data_from_pb, fork_data_to_pb
from ..._wire import pickler
from ..._wire.policy import CallablePolicy
from ...errors import RpcTimeoutError, RRefError, SerializationError
from ...futures import Future
from .functions import async_execution

if TYPE_CHECKING:
    from ..._runtime.rref.outcome import Creation
    from ..._runtime.rref.service import RRefService
    from ..._runtime.rref.value import ValueSlot

__all__ = ["RRef"]

T = TypeVar("T")


#: PyTorch's words for a UserRRef used after graceful shutdown deleted it, by use.
_AFTER_DELETION = {
    "to_here()": "Cannot call to_here() on it after deletion.",
    "sending an RRef": "Cannot call fork an UserRRef after deletion.",
}


def _type_name(type_hint: Any, value: Any) -> str:
    cls = type_hint if isinstance(type_hint, type) else type(value)
    return f"{cls.__module__}:{cls.__qualname__}"


class RRef(Generic[T]):
    """A remote reference: ``RRef(value)`` makes a local OwnerRRef holding ``value``.

    Args:
        value: the value to hold on this worker.
        type_hint: the value's type, for ``repr`` and inspection (default: ``type(value)``).

    Raises:
        RpcNotInitializedError: RPC is not running in this process.

    Example:
        >>> rref = RRef([1, 2, 3])
        >>> rref.is_owner(), rref.local_value()
        (True, [1, 2, 3])
    """

    __slots__ = ("_svc", "_handle", "_creation", "_finalizer", "_type", "__weakref__")

    _type: Future[type] | None

    def __init__(self, value: T, type_hint: Any = None) -> None:
        svc = _agent.current("RRef()").rref
        handle = svc.protocol.create_owner(_type_name(type_hint, value))
        assert handle.value is not None
        handle.value.set_value(value)
        self._bind(svc, handle, None)

    @classmethod
    def _wrap(
        cls, svc: RRefService, handle: RRefHandle, creation: Creation | None = None
    ) -> RRef[Any]:
        obj = cls.__new__(cls)
        obj._bind(svc, handle, creation)
        return obj

    def _bind(self, svc: RRefService, handle: RRefHandle, creation: Creation | None) -> None:
        self._svc = svc
        self._handle = handle
        self._creation = creation
        self._type = None
        # G1: the finalizer only enqueues (it may run inside garbage collection).
        self._finalizer = weakref.finalize(self, svc.enqueue_release, handle)
        self._finalizer.atexit = False

    # -- identity ------------------------------------------------------------------------------

    def _live(self, verb: str) -> RRefService:
        svc = self._svc
        if svc.closed:
            # PyTorch's wording first for the uses its tests make of a deleted UserRRef.
            torch_says = _AFTER_DELETION.get(verb) if not self._handle.is_owner else None
            prefix = f"{self} has been deleted. {torch_says}: " if torch_says else ""
            raise RRefError(
                f"{prefix}{verb} on RRef {self._handle.rref_id}: the RPC agent of worker "
                f"{svc.ctx.name!r} that created it has shut down; RRefs do not outlive "
                "rpc.shutdown()"
            )
        return svc

    def is_owner(self) -> bool:
        """Whether this worker owns the value (an OwnerRRef)."""
        return self._handle.is_owner

    def owner(self) -> WorkerInfo:
        """The WorkerInfo of the owner.

        Raises:
            RRefError: used after shutdown.
        """
        return self._live("owner()").ctx.peers[self._handle.owner_id].info

    def owner_name(self) -> str:
        """The name of the owner."""
        return self.owner().name

    def _get_type(self, timeout: float = -1.0, blocking: bool = True) -> Any:
        """The type of the value (PyTorch's private ``RRef._get_type``), remembered once known.

        On a user only the type travels: ``_rref_typeof_on_owner`` runs on the owner once the
        value exists (the class comes back by reference, under this worker's unpickling
        policy). The creation error of a ``remote()`` is raised (or set on the Future) as its
        own type; a failed fetch is not remembered.

        Args:
            timeout: seconds for the fetch; -1 uses the default rpc_timeout, 0 means none.
            blocking: False returns a Future of the type (the same one until it fails).

        Raises:
            RpcTimeoutError: the value did not exist (or the owner did not answer) in time.
        """
        svc = self._live("_get_type()")
        known: Future[type] | None = self._type
        if known is None or known.exception() is not None:
            known = self._type = self._fetch_type(svc, timeout)
        if not blocking:
            return known
        if not self._handle.is_owner:
            return known.wait()  # the call carries the deadline
        seconds = svc.ctx.timeout_of(timeout)
        try:
            return known.wait(seconds)
        except TimeoutError as exc:
            if isinstance(exc, RpcTimeoutError):
                raise
            raise RpcTimeoutError(
                f"_get_type() of RRef {self._handle.rref_id}: the value was not ready after "
                f"{seconds} s",
                svc.ctx.name,
                seconds or 0.0,
            ) from None

    def _fetch_type(self, svc: RRefService, timeout: float) -> Future[type]:
        if self._handle.is_owner:
            fut: Future[type] = Future()
            assert self._handle.value is not None
            self._handle.value.add_done_callback(lambda slot: _settle_from_slot(fut, slot))
            return fut
        from .api import rpc_async

        try:
            return rpc_async(self.owner(), _rref_typeof_on_owner, (self,), timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - the creation error, as the Future's
            failed: Future[type] = Future()
            failed.set_exception(exc)
            return failed

    def _get_future(self) -> Future[None]:
        """PyTorch's private ``RRef._get_future``: a Future of the RRef's creation.

        For a ``remote()`` result, completed with None once the owner acknowledged it, or with
        the creation error, or with RpcTimeoutError ("RPC ran for more than ...") as soon as
        the remote()'s timeout passes first. On the owner, completed once the value is set.

        Raises:
            RRefError: used after shutdown.
        """
        self._live("_get_future()")
        if self._creation is not None:
            return self._creation.as_future()
        out: Future[None] = Future()
        slot = self._handle.value
        if slot is None:
            out.set_result(None)  # a fork received from a payload: its owner created it
        else:
            slot.add_done_callback(lambda s: _settle_from_slot(out, s, lambda _value: None))
        return out

    def _get_profiling_future(self) -> Future[None]:
        """PyTorch's private ``RRef._get_profiling_future``: a Future that completes once the
        profiler recorded the creation of this RRef (its ``rpc_remote#...`` event and the
        owner's events), completed with None whatever the creation's outcome.

        Raises:
            RRefError: used after shutdown.
        """
        created = self._get_future()
        out: Future[None] = Future()
        created.add_done_callback(lambda _f: out.set_result(None))
        return out

    def confirmed_by_owner(self) -> bool:
        """Whether the owner knows this reference (always True on the owner).

        Raises:
            RRefError: used after shutdown.
        """
        return self._live("confirmed_by_owner()").protocol.is_confirmed(self._handle)

    # -- the value -----------------------------------------------------------------------------

    def local_value(self) -> T:
        """The value, on its owner (waits while a remote() to self still computes it).

        Returns:
            The value itself (not a copy).

        Raises:
            RRefError: called on a UserRRef (the message names this worker and the owner), or
                after shutdown.
            Exception: the error that creating the value raised.

        Example:
            >>> RRef(7).local_value()
            7
        """
        svc = self._live("local_value()")
        h = self._handle
        if not h.is_owner:
            # PyTorch's wording first: its tests match the ids and both WorkerInfos.
            raise RRefError(
                f"For UserRRef(rref_id={h.rref_id!r}, fork_id={h.fork_id!r}), can't call "
                f"localValue() on user {svc.ctx.peers[svc.ctx.rank].info!r}. Call it on owner "
                f"{self.owner()!r}: only the owner holds the value; use to_here() to fetch a copy"
            )
        return self._owner_value(svc.ctx.timeout_of(-1.0), "local_value()")

    def _owner_value(self, timeout: float | None, verb: str) -> T:
        assert self._handle.value is not None
        try:
            value = self._handle.value.wait(timeout)
        except TimeoutError as exc:
            if isinstance(exc, RpcTimeoutError):
                raise
            raise RpcTimeoutError(
                f"{verb} of RRef {self._handle.rref_id}: the value was not ready after {timeout} s",
                self._svc.ctx.name,
                timeout or 0.0,
            ) from None
        return outcome(value)

    def to_here(self, timeout: float = -1.0) -> T:
        """A copy of the value, fetched from the owner (the value itself on the owner).

        Args:
            timeout: seconds; -1 uses the default rpc_timeout, 0 means no timeout.

        Returns:
            The value.

        Raises:
            The creation error of a remote() (as its original type); RpcTimeoutError ("RRef
            creation timed out" when the remote() did not complete within its timeout before
            this call, as in PyTorch; a to_here() started earlier waits under its own timeout);
            WorkerUnavailableError; RRefError after shutdown.

        Example:
            >>> rpc.remote("worker1", operator.mul, (6, 7)).to_here()
            42
        """
        svc = self._live("to_here()")
        seconds = svc.ctx.timeout_of(timeout)
        if self._handle.is_owner:
            return self._owner_value(seconds, "to_here()")
        creation = self._creation
        if creation is None or creation.check():
            return svc.fetch.fetch(self._handle, seconds)
        # Still being created, within the creation's deadline: fetch at once (the owner answers
        # when the value is set, or with the creation error) under to_here()'s own timeout, as
        # PyTorch does: remote()'s timeout fails a use that comes after it expired. Right
        # behind the RemoteCall on its lane connection when its answer is still parked there.
        try:
            return svc.fetch.fetch(self._handle, seconds, creation.take_parked())
        except BaseException:
            creation.check()  # the creation error (or timeout) explains the failure best
            raise

    # -- proxies -------------------------------------------------------------------------------

    def rpc_sync(self, timeout: float = -1.0) -> Any:
        """A proxy whose methods run on the owner's value with rpc_sync.

        Example:
            >>> rref.rpc_sync().append(4)       # list.append on the owner
        """
        return _Proxy(self, "rpc_sync", timeout)

    def rpc_async(self, timeout: float = -1.0) -> Any:
        """A proxy whose methods run on the owner's value with rpc_async (they return Futures)."""
        return _Proxy(self, "rpc_async", timeout)

    def remote(self, timeout: float = -1.0) -> Any:
        """A proxy whose methods run on the owner's value with remote() (they return RRefs)."""
        return _Proxy(self, "remote", timeout)

    # -- autograd ------------------------------------------------------------------------------

    def backward(self, dist_autograd_ctx_id: int = -1, retain_graph: bool = False) -> None:
        """Run backward from the value (a scalar tensor) on the owner.

        Args:
            dist_autograd_ctx_id: a distributed autograd context id; -1 runs a local
                ``value.backward()`` on the owner.
            retain_graph: keep the graph(s) for another pass.

        Raises:
            RRefError: a user RRef without a context id (nothing is sent; a RuntimeError).
            RRefError: the value is not a tensor ("RRef should contain a tensor for
                .backward()", PyTorch's words). RuntimeError: as ``Tensor.backward`` or
            ``dist_autograd.backward``.

        Example:
            >>> with dist_autograd.context() as ctx_id:
            ...     loss_rref.backward(ctx_id)
        """
        self._live("backward()")
        if self._handle.is_owner:
            _backward_here(self.local_value(), dist_autograd_ctx_id, retain_graph)
            return
        if dist_autograd_ctx_id == -1:
            raise RRefError(
                "User RRefs require 'dist_autograd_ctx_id' to be specified: backward() of an "
                f"RRef owned by {self.owner_name()!r} runs there, in a distributed autograd "
                "context (with dist_autograd.context() as ctx_id: rref.backward(ctx_id))"
            )
        from .api import rpc_sync

        rpc_sync(self.owner(), _backward_on_owner, (self, dist_autograd_ctx_id, retain_graph))

    # -- protocol ------------------------------------------------------------------------------

    def _check_sendable(self) -> None:
        if self._creation is not None:
            self._creation.check()
        handle = self._handle
        if handle.is_owner and handle.value is not None and handle.value.done():
            outcome(handle.value.wait(0))  # raises the creation error of a remote() to self

    def __reduce__(self) -> Any:
        # PyTorch's wording first (gradwire.save and plain pickle reach here).
        raise RRefError(
            "Can not pickle rref in python pickler, rref can only be pickled when using RPC: "
            f"RRef {self._handle.rref_id} can only be an argument or return value of "
            "rpc_sync / rpc_async / remote (or send rref.to_here())"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RRef):
            return NotImplemented
        return (self._handle.rref_id, self._handle.fork_id, self._svc) == (
            other._handle.rref_id,
            other._handle.fork_id,
            other._svc,
        )

    def __hash__(self) -> int:
        return hash((self._handle.rref_id, self._handle.fork_id))

    def __str__(self) -> str:
        # PyTorch's format (its programs and tests compare it); repr() also names the type.
        h = self._handle
        if h.is_owner:
            return f"OwnerRRef({h.rref_id!r})"
        return f"UserRRef(RRefId = {h.rref_id!r}, ForkId = {h.fork_id!r})"

    def __repr__(self) -> str:
        h = self._handle
        if h.is_owner:
            return f"OwnerRRef(RRefId = {h.rref_id}, type = {h.type_name or '?'})"
        return f"UserRRef(RRefId = {h.rref_id}, ForkId = {h.fork_id}, owner = {h.owner_id})"


# -- the side table: RRefs inside RPC payloads -------------------------------------------------


def _encode(rref: RRef[Any], ctx: pickler.EncodeContext) -> Any:
    try:
        svc = rref._live("sending an RRef")
    except RRefError as exc:
        raise pickler.PropagateError(exc) from None
    peer = svc.ctx.peers.by_name.get(ctx.peer)
    if peer is None:
        raise SerializationError(f"an RRef can only be sent to a worker (not to {ctx.peer!r})")
    try:
        rref._check_sendable()
    except BaseException as exc:  # noqa: BLE001 - the creation error, with its own type
        raise pickler.PropagateError(exc) from None
    try:
        data = svc.fork(rref._handle, peer.id)
    except RRefProtocolError as exc:
        raise pickler.PropagateError(RRefError(f"cannot send {rref!r}: {exc}")) from None
    ctx.rrefs.append(fork_data_to_pb(data))
    ctx.objects.setdefault("R", []).append(data)
    return ("R", len(ctx.rrefs) - 1)


def _decode(pid: Any, ctx: pickler.DecodeContext) -> RRef[Any]:
    index = pid[1] if len(pid) == 2 else None
    if not isinstance(index, int) or not 0 <= index < len(ctx.payload.rrefs):
        raise SerializationError(f"payload refers to RRef {index!r}, which it does not carry")
    agent = _agent.current("receiving an RRef")
    data = fork_data_from_pb(ctx.payload.rrefs[index])
    if not (agent.is_member(data.owner_id) and agent.is_member(data.parent_id)):
        raise SerializationError(
            f"payload from {ctx.peer!r} carries an RRef of worker {data.owner_id} sent by "
            f"worker {data.parent_id}, which are not both members of this cluster"
        )
    handle = agent.rref.receive(data)
    ctx.objects.setdefault("R", []).append(handle)
    return RRef._wrap(agent.rref, handle)


pickler.register_side_table(RRef, "R", _encode, _decode)


# -- proxies and helpers run on the owner ------------------------------------------------------


class _Proxy:
    """``rref.rpc_sync()`` and friends: attribute access yields a caller of that method.

    As in PyTorch, a call first learns the value's type (``RRef._get_type``, fetched once per
    RRef object), so a method the type lacks raises AttributeError on the caller: at once for
    ``rpc_sync`` and ``remote``, through the returned Future for ``rpc_async``.
    """

    __slots__ = ("_rref", "_verb", "_timeout")

    def __init__(self, rref: RRef[Any], verb: str, timeout: float) -> None:
        self._rref = rref
        self._verb = verb
        self._timeout = timeout

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return functools.partial(_proxy_call, self._rref, self._verb, self._timeout, name)

    def __repr__(self) -> str:
        return f"<{self._verb} proxy of {self._rref!r}>"


def _check_member(value_type: type, name: str, rref: RRef[Any]) -> None:
    if not hasattr(value_type, name):
        # PyTorch's wording first (getattr on the type), then which RRef it was.
        raise AttributeError(
            f"type object {value_type.__qualname__!r} has no attribute {name!r} (the type of "
            f"the value of {rref!r})"
        )


def _proxy_call(
    rref: RRef[Any], verb: str, timeout: float, name: str, *args: Any, **kw: Any
) -> Any:
    from . import api

    if verb != "rpc_async":
        _check_member(rref._get_type(timeout), name, rref)
        fn = api.rpc_sync if verb == "rpc_sync" else api.remote
        return fn(rref.owner(), _call_method, (name, rref, *args), kw, timeout)
    out: Future[Any] = Future()

    def typed(type_future: Future[type]) -> None:
        try:
            _check_member(type_future.value(), name, rref)
            call = api.rpc_async(rref.owner(), _call_method, (name, rref, *args), kw, timeout)
        except BaseException as exc:  # noqa: BLE001 - delivered through the Future
            out.set_exception(exc)
            return
        call.add_done_callback(lambda f: _forward(f, out))

    rref._get_type(timeout, blocking=False).add_done_callback(typed)
    return out


def _forward(src: Future[Any], dst: Future[Any]) -> None:
    exc = src.exception()
    if exc is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.value())


def _settle_from_slot(
    fut: Future[Any], slot: ValueSlot, result: Callable[[Any], Any] = type
) -> None:
    """Complete ``fut`` from a filled value slot: ``result(value)``, or the creation error."""
    try:
        value = outcome(slot.wait(0))
    except BaseException as exc:  # noqa: BLE001 - delivered through the Future
        fut.set_exception(exc)
    else:
        fut.set_result(result(value))


@async_execution
def _rref_typeof_on_owner(rref: RRef[Any], blocking: bool = True) -> Future[type]:
    """On the owner: the type of the RRef's value once it exists (``RRef._get_type`` of a
    user; PyTorch's name). Reads no attribute of the value and runs none of its code."""
    if not isinstance(rref, RRef) or not rref.is_owner():
        raise TypeError("_rref_typeof_on_owner needs an RRef owned by this worker")
    return rref._get_type(blocking=False)


@async_execution
def _call_method(name: str, rref: RRef[Any], *args: Any, **kwargs: Any) -> Future[Any]:
    """On the owner: the value's method ``name`` called with the arguments, honouring
    async_execution. The method is resolved through the worker's callable policy
    (``CallablePolicy.resolve_member``: no dunder or private name, no member of a type the
    policy does not allow) and runs guarded when only the default lists allow it."""
    if not isinstance(rref, RRef):
        raise TypeError(f"an RRef method call needs an RRef, got {type(rref).__name__}")
    agent = _agent.current_or_none()
    policy = agent.policy if agent is not None else _LOCAL_POLICY
    worker = agent.name if agent is not None else ""
    value = rref.local_value()
    method, verdict = policy.resolve_member(value, name, worker)
    is_async = bool(getattr(method, ASYNC_EXECUTION_ATTR, False))
    what = f"{type(value).__module__}:{type(value).__qualname__}.{name}"
    result = policy.runnable(method, verdict, what, worker, cache=False)(*args, **kwargs)
    if is_async:
        return result
    out: Future[Any] = Future()
    out.set_result(result)
    return out


#: The policy of a proxy call served with no agent running (only in-process tests).
_LOCAL_POLICY = CallablePolicy()


def _backward_here(value: Any, ctx_id: int, retain_graph: bool) -> None:
    from ..._tensor import Tensor

    if not isinstance(value, Tensor):
        raise RRefError(f"RRef should contain a tensor for .backward(), got {type(value).__name__}")
    if ctx_id == -1:
        value.backward(retain_graph=retain_graph)
        return
    from .. import autograd as dist_autograd

    dist_autograd.backward(ctx_id, [value], retain_graph)


def _backward_on_owner(rref: RRef[Any], ctx_id: int, retain_graph: bool) -> None:
    """On the owner: backward from the RRef's value (RRef.backward on a user)."""
    if not isinstance(rref, RRef):
        raise TypeError(f"RRef.backward needs an RRef, got {type(rref).__name__}")
    _backward_here(rref.local_value(), ctx_id, retain_graph)
