"""PyTorch's private ``_all_gather``, ``_barrier`` and ``_wait_all_workers`` over gradwire's RPC.

Two phases, as PyTorch's: every follower sends its object to the leader (the first of the
sorted names) with :func:`_gather_put`, which returns at once; once the leader holds every
object it sends the whole map to each follower (:func:`_deliver_round`, which runs
``rpc.api._broadcast_to_followers`` on the follower), and a follower waits for that map. The
leader fails when a follower did not take the map in time ("Followers [...] timed out in
_all_gather"), a follower when its send to the leader timed out ("RPC ran for more than ...").
Rounds are numbered per group of names in each process, so the k-th gather of a group on one
worker meets the k-th on the others, whichever thread makes it. No serving thread ever waits
in a round: the waits are the callers' own, bounded, and end early when a worker of the round
is lost.

Example:
    >>> rpc.api._all_gather(rpc.get_worker_info().id)
    {'worker0': 0, 'worker1': 1}
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..._runtime import agent as _agent
from ..._runtime.cluster.options import UNSET_RPC_TIMEOUT
from ...errors import ArgumentError, RpcError, RpcTimeoutError, WorkerUnavailableError

__all__ = [
    "_all_gather",
    "_barrier",
    "_wait_all_workers",
    "_gather_put",
    "_broadcast_to_followers",
    "_deliver_round",
    "wait_bound",
]

#: PyTorch's default timeout of the shutdown gather, in seconds.
DEFAULT_SHUTDOWN_TIMEOUT = 5.0
#: Rounds a leader keeps open at once (objects of followers whose own round has not started
#: on the leader yet): a peer cannot make it hold more.
MAX_OPEN_ROUNDS = 256
#: How often a waiting round checks whether a worker of the round was lost.
_POLL_SECONDS = 0.1

Round = tuple[tuple[str, ...], int]

_cond = threading.Condition()
_rounds: dict[tuple[str, ...], int] = {}
#: On the leader: the objects received so far, per round.
_values: dict[Round, dict[str, Any]] = {}
#: On the leader: the rounds its own ``_all_gather`` is in (it takes their objects away).
_local_rounds: set[Round] = set()
#: On a follower: the rounds it waits in, and the map the leader sent for each.
_waiting: set[Round] = set()
_results: dict[Round, dict[str, Any]] = {}


def wait_bound(timeout: Any) -> float:
    """How long a round waits: ``timeout`` seconds, or this worker's rpc_timeout when it is
    None or 0 (60 s when that is 0 too)."""
    if timeout:
        return float(timeout)
    rpc_timeout = _agent.current("_all_gather()").options.rpc_timeout
    return float(rpc_timeout) if rpc_timeout else 60.0


def _check_round(names: Any, round_id: Any, name: Any, timeout: Any) -> tuple[str, ...]:
    """Validate a round a peer names; its tuple of names."""
    agent = _agent.current("_all_gather()")
    members = {p.name for p in agent.peers}
    if (
        not isinstance(names, tuple)
        or not names
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
    ):
        raise ArgumentError(f"_all_gather: a round needs a tuple of worker names, got {names!r}")
    strangers = sorted(set(names) - members)
    if strangers:
        raise ArgumentError(f"_all_gather: {strangers} is not a worker of this cluster")
    if isinstance(round_id, bool) or not isinstance(round_id, int) or round_id < 0:
        raise ArgumentError(f"_all_gather: the round must be an int >= 0, got {round_id!r}")
    if name not in names:
        raise ArgumentError(f"_all_gather: {name!r} is not among {list(names)}")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or math.isnan(timeout)
        or timeout < 0
    ):
        raise ArgumentError(f"_all_gather: the timeout must be seconds >= 0, got {timeout!r}")
    return tuple(sorted(names))


def _gather_put(
    names: tuple[str, ...], round_id: int, name: str, obj: Any, timeout: float | None
) -> dict[str, Any] | None:
    """Phase 1, on the leader (what a follower calls): add ``name``'s object to the round.
    Returns at once: the round's objects when this completed it, else None. A round that no
    ``_all_gather`` of this worker waits for (the leader's own object came from a peer too)
    is forgotten as it completes.

    Raises:
        ArgumentError: a malformed round, one this worker does not lead, a second object from
            ``name``, or too many rounds open.
    """
    return _put(names, round_id, name, obj, timeout, local=False)


def _put(
    names: tuple[str, ...],
    round_id: int,
    name: str,
    obj: Any,
    timeout: float | None,
    local: bool,
) -> dict[str, Any] | None:
    me = _agent.current("_all_gather()").info.name
    group = _check_round(names, round_id, name, timeout)
    if group[0] != me:
        raise ArgumentError(f"_all_gather: worker {me!r} does not lead the round of {list(group)}")
    key = (group, round_id)
    with _cond:
        values = _values.get(key)
        if values is None:
            if len(_values) >= MAX_OPEN_ROUNDS:
                raise ArgumentError(
                    f"_all_gather: worker {me!r} already has {MAX_OPEN_ROUNDS} rounds open"
                )
            values = _values[key] = {}
        if name in values:
            raise ArgumentError(f"_all_gather: {name!r} sent round {round_id} twice")
        values[name] = obj
        if local:
            _local_rounds.add(key)
        _cond.notify_all()
        if len(values) < len(group):
            return None
        if key not in _local_rounds:  # no _all_gather here waits for it: nothing stays behind
            del _values[key]
        return dict(values)


def _broadcast_to_followers(sequence_id: Round, objects_map: dict[str, Any]) -> None:
    """Phase 2, on a follower: the leader's map of every object of round ``sequence_id``
    (PyTorch's name; ``rpc.api._broadcast_to_followers``).

    Raises:
        ArgumentError: this worker waits in no such round, or the map does not hold exactly
            the round's workers.
    """
    if not (isinstance(sequence_id, tuple) and len(sequence_id) == 2):
        raise ArgumentError(f"_all_gather: malformed round {sequence_id!r}")
    names, round_id = sequence_id
    # Every worker of the round, but for followers lost during a shutdown gather (the leader's
    # own object is always there).
    if (
        not isinstance(objects_map, dict)
        or not set(objects_map) <= set(names)
        or names[0] not in objects_map
    ):
        raise ArgumentError(f"_all_gather: the map of round {round_id} must hold {list(names)}")
    with _cond:
        if sequence_id not in _waiting or sequence_id in _results:
            raise ArgumentError(f"_all_gather: no round {round_id} of {list(names)} waits here")
        _results[sequence_id] = dict(objects_map)
        _cond.notify_all()


def _deliver_round(names: tuple[str, ...], round_id: int, objects_map: dict[str, Any]) -> None:
    """What the leader calls on a follower: ``rpc.api._broadcast_to_followers`` (looked up at
    call time, as PyTorch's tests replace it there)."""
    from . import api

    agent = _agent.current("_all_gather()")
    group = _check_round(names, round_id, agent.info.name, None)
    api._broadcast_to_followers((group, round_id), objects_map)


def _wait_for(ready: Any, deadline: float | None, watch: Iterable[str], what: str) -> bool:
    """Wait under ``_cond`` until ``ready()`` (True) or the deadline (False); raise when a
    worker of ``watch`` is lost meanwhile."""
    agent = _agent.current("_all_gather()")
    watched = {p.id: p.name for p in agent.peers if p.name in set(watch)}
    while not ready():
        names = [name for i, name in watched.items() if agent.events.is_lost(i)]
        if names:
            raise WorkerUnavailableError(f"_all_gather: {names} lost while waiting for {what}")
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return False
        _cond.wait(_POLL_SECONDS if remaining is None else min(_POLL_SECONDS, remaining))
    return True


def _all_gather(
    obj: Any,
    worker_names: Iterable[str] | None = None,
    timeout: float = UNSET_RPC_TIMEOUT,
    *,
    skip_lost: bool = False,
) -> dict[str, Any]:
    """Every participant's ``obj``, by worker name (all workers unless ``worker_names``).

    ``timeout`` as PyTorch's: -1 (the default) sends with the rpc_timeout, 5.0 (the shutdown
    gather's) sends with 5 s, and both wait for the others without a bound (until a worker of
    the round is lost); any other value bounds the sends and the wait alike.

    Raises:
        RpcTimeoutError: this follower's send to the leader ran over its timeout, or the other
            workers did not all arrive in time ("timed out in _all_gather").
        RpcError: on the leader, a follower did not take the gathered map ("Followers [...]
            timed out in _all_gather after ... seconds").
        WorkerUnavailableError: a worker of the round was lost (with ``skip_lost``, only the
            leader: the leader goes on without a follower declared lost, whose object is then
            missing from the map).
        ArgumentError: this worker is not among ``worker_names``.
    """
    agent = _agent.current("_all_gather()")
    me = agent.info.name
    names = tuple(
        sorted(worker_names if worker_names is not None else (p.name for p in agent.peers))
    )
    if me not in names:
        raise ArgumentError(f"_all_gather on {me!r}, which is not among {list(names)}")
    rpc_timeout = agent.timeout_of(timeout)
    # PyTorch's rule: -1 and the shutdown default wait for the others without a bound (the
    # wait still ends when a worker of the round is lost); any other value bounds it too.
    unbounded = timeout in (UNSET_RPC_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT)
    wait_seconds = 0.0 if unbounded else wait_bound(rpc_timeout)
    deadline = None if unbounded else time.monotonic() + wait_seconds
    leader = names[0]
    with _cond:
        round_id = _rounds.get(names, 0)
        _rounds[names] = round_id + 1
        key = (names, round_id)
        if me != leader:
            _waiting.add(key)
    from . import api

    if me != leader:
        try:
            api.rpc_sync(
                leader,
                _gather_put,
                (names, round_id, me, obj, rpc_timeout or 0.0),
                timeout=rpc_timeout or 0,
            )
            with _cond:
                if not _wait_for(lambda: key in _results, deadline, (leader,), "the leader"):
                    raise RpcTimeoutError(
                        f"timed out in _all_gather after {wait_seconds:.2f} seconds: leader "
                        f"{leader!r} never sent round {round_id}",
                        leader,
                        wait_seconds,
                    )
                return _results.pop(key)
        finally:
            with _cond:
                _waiting.discard(key)
                _results.pop(key, None)
    _put(names, round_id, me, obj, rpc_timeout or 0.0, local=True)
    lost: set[str] = set()
    ids = {p.id: p.name for p in agent.peers if p.name in set(names)}

    def arrived() -> bool:
        if skip_lost:
            lost.update(name for i, name in ids.items() if agent.events.is_lost(i))
        have = _values.get(key, {})
        return all(name in have or name in lost for name in names)

    with _cond:
        complete = _wait_for(arrived, deadline, () if skip_lost else names, "the followers")
        values = _values.pop(key, {})
        _local_rounds.discard(key)
    if not complete:
        missing = sorted(set(names) - set(values) - lost)
        raise RpcTimeoutError(
            f"timed out in _all_gather after {wait_seconds:.2f} seconds; workers that never "
            f"arrived: {', '.join(missing)}",
            me,
            wait_seconds,
        )
    futures = {
        follower: api.rpc_async(
            follower, _deliver_round, (names, round_id, values), timeout=rpc_timeout or 0
        )
        for follower in names[1:]
        if follower in values
    }
    errors: list[tuple[str, BaseException]] = []
    for follower, fut in futures.items():
        try:
            fut.wait()
        except RuntimeError as exc:
            errors.append((follower, exc))
    if errors:
        raise RpcError(
            f"Followers {[e[0] for e in errors]} timed out in _all_gather after "
            f"{(rpc_timeout or 0.0):.2f} seconds. The first exception is {errors[0][1]}"
        ) from errors[0][1]
    return values


def _barrier(worker_names: Iterable[str]) -> None:
    """Wait until every worker of ``worker_names`` has reached this barrier."""
    _all_gather(None, set(worker_names))


def _wait_all_workers(timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Wait until every worker has called this (PyTorch's shutdown rendezvous). A worker the
    failure detector declared lost is not waited for: the survivors of a crash still shut
    down together (the leader's loss is an error, as the loss of the barrier's host is)."""
    _all_gather(None, timeout=timeout, skip_lost=True)
