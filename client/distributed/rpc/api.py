"""The rpc verbs: init_rpc, shutdown, rpc_sync, rpc_async, remote and the inspection helpers."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from ..._runtime import agent as _agent
from ..._runtime.calls import profiling as _profiling
from ..._runtime.cluster.options import (
    UNSET_RPC_TIMEOUT,
    BackendType,
    GrpcRpcBackendOptions,
    RpcBackendOptions,
)
from ..._runtime.cluster.workers import RANK_LIMIT, WorkerInfo, validate_name, validate_rank
from ...errors import ArgumentError, RpcInitError
from ...futures import Future
from . import _torch_private
from ._gather import (  # noqa: F401  (rpc.api.*)
    _all_gather,
    _barrier,
    _broadcast_to_followers,
    _wait_all_workers,
)
from ._torch_private import (  # noqa: F401  (PyTorch's private names, rpc.api.*)
    _delete_all_user_and_unforked_owner_rrefs,
    _get_current_rpc_agent,
    _get_debug_info,
    _thread_local_var,
    _track,
    _wait_all,
)
from .rref import RRef

__all__ = [
    "init_rpc",
    "shutdown",
    "rpc_sync",
    "rpc_async",
    "remote",
    "get_worker_info",
    "get_worker_infos",
    "get_rpc_timeout",
    "set_rpc_timeout",
    "is_available",
    "get_debug_info",
    "is_initialized",
]

log = logging.getLogger(__name__)
#: The least a graceful shutdown without a timeout waits for the others, in seconds.
_MIN_DEFAULT_SHUTDOWN = 60.0
_init_lock = threading.Lock()

#: PyTorch's switch for the RRef leak check of a graceful ``shutdown``: True only logs the
#: leaks, False raises RRefLeakError ("Leaking RRef ..."); None (gradwire's default) follows the
#: ``rref_leak_check`` backend option.
_ignore_rref_leak: bool | None = None


def _int_arg(value: Any, env: str, what: str) -> int:
    if value is None:
        raw = os.environ.get(env)
        if raw is None:
            raise RpcInitError(f"init_rpc needs {what} (argument or ${env})")
        try:
            return int(raw)
        except ValueError:
            raise RpcInitError(f"${env}={raw!r} is not an integer") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RpcInitError(f"{what} must be an int, got {value!r}")
    return value


def init_rpc(
    name: str,
    rank: int | None = None,
    world_size: int | None = None,
    rpc_backend_options: GrpcRpcBackendOptions | None = None,
    backend: Any = None,
) -> None:
    """Start this worker's RPC agent and rendezvous with the others.

    Without a world size (neither the argument nor ``$WORLD_SIZE``) the worker joins a
    *dynamic group*, as in PyTorch >= 1.12: rank 0 hosts it (at the init method's address) and
    other workers join and leave it while it runs; ``shutdown()`` of such a worker leaves the
    group without waiting for the others.

    Args:
        name: unique worker name, [A-Za-z0-9_:-], 1 to 127 characters.
        rank: this worker's id in [0, world_size) (default ``$RANK``); in a dynamic group any
            rank in [0, 2**15) no member has, or None (and no ``$RANK``): the group's host
            assigns the lowest free rank at join (``get_worker_info().id``). A gradwire
            extension: PyTorch requires a rank. The host itself is rank 0.
        world_size: number of workers (default ``$WORLD_SIZE``; neither: a dynamic group).
        rpc_backend_options: a GrpcRpcBackendOptions (init method, timeouts, security).
        backend: accepted for PyTorch compatibility; gRPC is the only backend.

    Raises:
        RpcInitError: invalid name, rank or world size, already initialized, or the rendezvous
            failed (duplicate name or rank, world size mismatch, timeout); in a dynamic
            group, a name or rank a member has (the message names that member); a rank
            of 2**15 or more; no rank with a world size.
        TypeError: ``backend`` is not a BackendType, or the options are not backend options.

    Example:
        >>> rpc.init_rpc("trainer0", rank=0, world_size=2)
    """
    validate_name(name)
    dynamic = world_size is None and os.environ.get("WORLD_SIZE") is None
    if rank is None and os.environ.get("RANK") is None and not dynamic:
        raise RpcInitError(
            "rank parameter missing: init_rpc needs a rank (argument or $RANK) with a world "
            "size: give each worker its rank in [0, world_size), or leave out world_size too "
            "to join a dynamic group, whose host assigns a rank"
        )
    if rank is not None or os.environ.get("RANK") is not None:
        rank = _int_arg(rank, "RANK", "rank")
    if dynamic:
        world_size = 0  # a dynamic group; rank None: the host assigns one at join
        if rank is not None:
            validate_rank(rank, f"worker {name!r}")
    else:
        assert rank is not None
        world_size = _int_arg(world_size, "WORLD_SIZE", "world_size")
        if world_size < 1:
            raise RpcInitError(f"world_size must be at least 1, got {world_size}")
        if world_size > RANK_LIMIT:
            raise RpcInitError(
                f"world_size {world_size} is too large: ranks must be below {RANK_LIMIT} "
                "(2**15; a worker id is the top bits of a 64-bit dist autograd id)"
            )
        if not 0 <= rank < world_size:
            raise RpcInitError(f"rank {rank} is out of range for world_size {world_size}")
    if backend is not None and not isinstance(backend, BackendType):
        raise TypeError(f"Argument backend must be a member of BackendType, got {backend!r}")
    if rpc_backend_options is not None and not isinstance(
        rpc_backend_options, GrpcRpcBackendOptions
    ):
        if isinstance(rpc_backend_options, RpcBackendOptions):
            raise TypeError(
                f"Could not infer backend for options {rpc_backend_options}: gradwire's backend "
                "takes GrpcRpcBackendOptions (or PyTorch's TensorPipeRpcBackendOptions), not "
                f"{type(rpc_backend_options).__name__}"
            )
        raise TypeError(
            "Argument rpc_backend_options must be an instance of RpcBackendOptions "
            f"(GrpcRpcBackendOptions), got {type(rpc_backend_options).__name__}"
        )
    options = rpc_backend_options or GrpcRpcBackendOptions()
    from gradwire.server.app import create_server  # L5 wires L4 to L3

    with _init_lock:
        existing = _agent.current_or_none()
        if existing is not None and existing.state != _agent.AgentState.SHUTDOWN:
            raise RpcInitError(
                f"RPC is already initialized as {existing.name!r}; call shutdown() first"
            )
        agent = _agent.Agent(name, rank, world_size, options)
        # Installed before the rendezvous: peers may call this worker as soon as it is ready
        # (inside join()), and the functions they run look up the current agent.
        _agent.set_current(agent)
        try:
            try:
                create_server(agent.plan.listen, agent)
            except OSError as exc:
                raise RpcInitError(
                    f"worker {name!r} cannot listen on {agent.plan.listen}: {exc}"
                ) from exc
            agent.join()
        except BaseException:
            agent.shutdown(graceful=False, timeout=0)
            _agent.set_current(existing, after_shutdown=False)
            raise


def shutdown(graceful: bool = True, timeout: float = UNSET_RPC_TIMEOUT) -> None:
    """Stop this worker's agent.

    A graceful shutdown finishes this worker's pending calls, meets every worker at a barrier,
    then settles the RRef protocol (pending confirmations, child acks, and a delete for every
    UserRRef still alive, RRefs in reference cycles included), meets them again, and checks
    that no owner still knows a fork of its OwnerRRefs (PyTorch's RRef leak; ``rref_leak_check``
    or ``rpc.api._ignore_rref_leak`` say whether to warn or raise: a warning by default). RRefs
    cannot be used afterwards.

    Args:
        graceful: finish pending calls and wait for every worker at a barrier before stopping;
            False stops at once and fails pending calls with RpcShutdownError.
        timeout: seconds for the graceful part (-1: the rpc_timeout, at least 60 s).

    Raises:
        RpcNotInitializedError: RPC is not running.
        RpcTimeoutError: the graceful shutdown timed out (the agent is stopped anyway).
        WorkerUnavailableError: rank 0 vanished before the barrier (stopped anyway).
        RRefLeakError: ``rref_leak_check="error"`` and a fork was still alive ("Leaking
            RRef ..."; the agent is stopped anyway).

    Example:
        >>> rpc.shutdown()
    """
    agent = _agent.current("shutdown()")
    if timeout is None or timeout < 0:
        # Never less than a minute: PyTorch's shutdown waits for the others without a bound,
        # and a short rpc_timeout (its tests set 0.1 s) is for calls, not for this meeting.
        timeout = max(agent.options.rpc_timeout or _MIN_DEFAULT_SHUTDOWN, _MIN_DEFAULT_SHUTDOWN)
    leak_check = None if _ignore_rref_leak is None else "warn" if _ignore_rref_leak else "error"

    def drain_rrefs(deadline: float) -> None:
        # Looked up at call time, so that replacing the module's name (as PyTorch's leak tests
        # do with mock.patch) replaces the deletion of every UserRRef. A replacement is called
        # as PyTorch's shutdown calls it, without arguments.
        drain = _delete_all_user_and_unforked_owner_rrefs
        if drain is _torch_private._delete_all_user_and_unforked_owner_rrefs:
            drain(max(0.0, deadline - time.monotonic()))
        else:
            drain()

    def meet_peers(deadline: float) -> None:
        # PyTorch's shutdown gather, looked up at call time as its tests replace it too.
        _wait_all_workers(max(0.001, deadline - time.monotonic()))

    try:
        agent.shutdown(graceful, timeout, drain_rrefs, leak_check, meet_peers)
    finally:
        _agent.set_current(None)


def _check_args(verb: str, args: Any, kwargs: Any) -> None:
    if args is not None and not isinstance(args, (tuple, list)):
        raise TypeError(f"{verb}: args must be a tuple or list, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"{verb}: kwargs must be a dict, got {type(kwargs).__name__}")


def _invoke(
    to: Any, func: Any, args: Any, kwargs: Any, timeout: float, blocking: bool, verb: str
) -> Future[Any]:
    agent = _agent.current(verb)
    peer = agent.resolve(to)
    _check_args(verb, args, kwargs)
    prof = _profiling.begin("sync" if blocking else "async", func, agent.name, peer.name)
    if prof is None:
        return agent.caller.call(
            peer, func, tuple(args or ()), dict(kwargs or {}), agent.timeout_of(timeout), blocking
        )
    try:
        with _profiling.sending(prof):
            fut = agent.caller.call(
                peer,
                func,
                tuple(args or ()),
                dict(kwargs or {}),
                agent.timeout_of(timeout),
                blocking,
            )
    except BaseException:
        prof.finish()
        raise
    fut.add_done_callback(prof.finish)  # the event ends when the call does, not when it returns
    return fut


def rpc_sync(
    to: Any, func: Any, args: Any = None, kwargs: Any = None, timeout: float = UNSET_RPC_TIMEOUT
) -> Any:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result.

    Encoded, decoded and delivered as ``rpc_async`` is; only the route differs: the caller's
    thread sends the call on an open call stream and waits for its reply there
    (``gradwire._runtime.calls.routes.choose_route``), with no gRPC future in between.

    Args:
        to: worker name, WorkerInfo or rank.
        func: a module-level function, builtin, class, static, class or bound method.
        args, kwargs: arguments (tensors travel as raw bytes, never pickled).
        timeout: seconds; -1 uses the default rpc_timeout, 0 means no timeout.

    Returns:
        What ``func`` returned on ``to``.

    Raises:
        RpcNotInitializedError, UnknownWorkerError, SerializationError, PolicyError,
        RpcTimeoutError, WorkerUnavailableError, AuthenticationError; the remote exception
        (as its own type when rebuildable, and always as a RemoteError).

    Example:
        >>> rpc.rpc_sync("worker1", operator.add, (2, 3))
        5
    """
    return _invoke(to, func, args, kwargs, timeout, True, "rpc_sync()").wait()


def rpc_async(
    to: Any, func: Any, args: Any = None, kwargs: Any = None, timeout: float = UNSET_RPC_TIMEOUT
) -> Future[Any]:
    """Start ``func(*args, **kwargs)`` on worker ``to``; return a Future of its result.

    Args: as :func:`rpc_sync`.

    Returns:
        A gradwire.futures.Future; ``wait()`` raises what :func:`rpc_sync` would.

    Raises:
        At once: RpcNotInitializedError, UnknownWorkerError, SerializationError (the function
        or the arguments cannot be sent), MessageTooLargeError. Everything else via the Future.

    Example:
        >>> fut = rpc.rpc_async("worker1", operator.add, (2, 3))
        >>> fut.wait()
        5
    """
    return _track(_invoke(to, func, args, kwargs, timeout, False, "rpc_async()"))


def remote(
    to: Any, func: Any, args: Any = None, kwargs: Any = None, timeout: float = UNSET_RPC_TIMEOUT
) -> RRef[Any]:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and keep the result there; return at once.

    The result stays on ``to`` (the owner) as the value of an OwnerRRef; the caller gets a
    UserRRef to it (an OwnerRRef when ``to`` is the caller itself, where the function runs on
    the serving pool with the arguments as they are). An error raised by ``func``, or the
    creation timing out, surfaces at the next use of the RRef (to_here, sending it, a proxy
    call) with the original exception type.

    Args:
        to: worker name, WorkerInfo or rank.
        func: a module-level function, builtin, class, static, class or bound method
            (``@rpc.functions.async_execution`` functions keep the value of their Future).
        args, kwargs: arguments (tensors and RRefs included, nested in containers too).
        timeout: seconds for the creation; -1 uses the default rpc_timeout, 0 means none.

    Returns:
        An RRef to the result.

    Raises:
        At once: RpcNotInitializedError, UnknownWorkerError, SerializationError (the function
        or the arguments cannot be sent), MessageTooLargeError, TypeError (bad args).
        Later, at the next use of the RRef: the creation error, RpcTimeoutError ("RRef creation
        timed out"), WorkerUnavailableError.

    Example:
        >>> rref = rpc.remote("worker1", operator.add, (2, 3))
        >>> rref.to_here()
        5
    """
    agent = _agent.current("remote()")
    peer = agent.resolve(to)
    _check_args("remote()", args, kwargs)
    seconds = agent.timeout_of(timeout)
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    prof = _profiling.begin("remote", func, agent.name, peer.name)
    try:
        if peer.id == agent.rank:
            handle = agent.rref.calls.remote_to_self(func, args, kwargs)
            if prof is not None and handle.value is not None:
                handle.value.add_done_callback(prof.finish)  # ends once the value is made
            return RRef._wrap(agent.rref, handle)
        with _profiling.sending(prof):
            handle, creation = agent.rref.calls.remote(peer, func, args, kwargs, seconds)
    except BaseException:
        if prof is not None:
            prof.finish()
        raise
    if prof is not None:  # the event ends when the owner acknowledged the creation
        creation.future.add_done_callback(prof.finish)
    return RRef._wrap(agent.rref, handle, creation)


def get_worker_info(worker_name: str | None = None) -> WorkerInfo:
    """The WorkerInfo of ``worker_name`` (default: this worker).

    In a dynamic group a name not known here is asked of the group's host first, so a worker
    that joined a moment ago is found.

    Raises:
        RpcNotInitializedError: RPC is not running.
        WorkerDepartedError: that worker left its dynamic group.
        UnknownWorkerError: no worker has that name.
    """
    agent = _agent.current("get_worker_info()")
    if worker_name is None:
        return agent.info
    return agent.resolve(worker_name).info


def get_worker_infos() -> list[WorkerInfo]:
    """The WorkerInfo of every current member, this worker included, ordered by rank (in a
    dynamic group: those that joined and did not leave, as this worker heard of them).

    Raises:
        RpcNotInitializedError: RPC is not running.

    Example:
        >>> [w.name for w in rpc.get_worker_infos()]
        ['worker0', 'worker1']
    """
    return [peer.info for peer in _agent.current("get_worker_infos()").peers]


def get_rpc_timeout() -> float:
    """The default timeout of rpc calls, in seconds (0 = none)."""
    return float(_agent.current("get_rpc_timeout()").options.rpc_timeout)


def get_debug_info() -> dict[str, Any]:
    """Counters (calls served, in flight, failed, pending), state and per-peer channel state.

    Raises:
        RpcNotInitializedError: RPC is not running.
    """
    return _agent.current("get_debug_info()").debug_info()


def is_initialized() -> bool:
    """True while this process runs an RPC agent."""
    agent = _agent.current_or_none()
    return agent is not None and agent.state == _agent.AgentState.RUNNING


def set_rpc_timeout(rpc_timeout: float) -> None:
    """Change this worker's default timeout of rpc calls, in seconds (0 = none), at run time.

    Calls already under way keep their deadline; ``get_rpc_timeout()`` returns the new value.

    Raises:
        ArgumentError: a negative timeout (a ValueError and a RuntimeError).
        RpcNotInitializedError: call ``init_rpc`` first.

    Example:
        >>> rpc.set_rpc_timeout(5.0)
    """
    seconds = float(rpc_timeout)
    if seconds < 0:
        raise ArgumentError(f"rpc_timeout must be >= 0 seconds (0 = none), got {rpc_timeout}")
    _agent.current("set_rpc_timeout()").options.rpc_timeout = seconds


#: PyTorch's private spelling, used by its programs and tests.
_set_rpc_timeout = set_rpc_timeout


def is_available() -> bool:
    """True: the RPC framework is always built into gradwire (PyTorch's check)."""
    return True


def _rref_context_get_debug_info() -> dict[str, int]:
    """PyTorch's RRef counters of this worker: ``num_owner_rrefs`` (OwnerRRefs another worker
    holds a fork of: a local ``RRef(value)`` counts once shared), ``num_pending_users``
    (users not yet confirmed by their owner), ``num_forks`` (forks this owner knows),
    ``num_pending_futures`` (forks waiting for a child's acknowledgement)."""
    info = _agent.current("_rref_context_get_debug_info()").rref.debug_info()
    return {
        "num_owner_rrefs": int(info["num_shared_owner_rrefs"]),
        "num_pending_users": int(info["num_pending_users"]),
        "num_forks": int(info["num_forks"]),
        "num_pending_futures": int(info["num_pending_children"]),
    }
