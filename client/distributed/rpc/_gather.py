"""PyTorch's private ``_all_gather``, ``_barrier`` and ``_wait_all_workers`` over gradwire's RPC.

Every participant sends its object to the leader (the first of the sorted names) with
:func:`_gather_put`, which waits on the leader until all have arrived and returns them all;
the leader calls it in-process. Rounds are numbered per group of names in each process, so
the k-th gather of a group on one worker meets the k-th on the others, whichever thread makes it.

Example:
    >>> rpc.api._all_gather(rpc.get_worker_info().id)
    {'worker0': 0, 'worker1': 1}
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from ..._runtime import agent as _agent
from ..._runtime.cluster.options import UNSET_RPC_TIMEOUT
from ...errors import ArgumentError, RpcTimeoutError

__all__ = ["_all_gather", "_barrier", "_wait_all_workers", "_gather_put"]

#: PyTorch's default timeout of the shutdown gather, in seconds.
DEFAULT_SHUTDOWN_TIMEOUT = 5.0

_cond = threading.Condition()
_rounds: dict[tuple[str, ...], int] = {}
_values: dict[tuple[tuple[str, ...], int], dict[str, Any]] = {}
_reads: dict[tuple[tuple[str, ...], int], int] = {}


def _gather_put(
    names: tuple[str, ...], round_id: int, name: str, obj: Any, timeout: float | None
) -> dict[str, Any]:
    """On the leader: add ``name``'s object to the round, wait for the others, return all."""
    key = (tuple(names), int(round_id))
    deadline = None if not timeout else time.monotonic() + timeout
    with _cond:
        values = _values.setdefault(key, {})
        values[name] = obj
        _cond.notify_all()
        while len(values) < len(names):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                _values.pop(key, None)
                _reads.pop(key, None)
                missing = ", ".join(sorted(set(names) - set(values)))
                raise RpcTimeoutError(
                    f"timed out in _all_gather after {timeout:.2f} seconds; "
                    f"workers that did not join: {missing}",
                    name,
                    float(timeout or 0.0),
                )
            _cond.wait(remaining)
        result = dict(values)
        _reads[key] = _reads.get(key, 0) + 1
        if _reads[key] == len(names):
            _values.pop(key, None)
            _reads.pop(key, None)
        return result


def _all_gather(
    obj: Any, worker_names: Iterable[str] | None = None, timeout: float = UNSET_RPC_TIMEOUT
) -> dict[str, Any]:
    """Every participant's ``obj``, by worker name (all workers unless ``worker_names``).

    Raises:
        RpcTimeoutError: not every participant joined within ``timeout`` (-1: rpc_timeout).
        ArgumentError: this worker is not among ``worker_names``.
    """
    agent = _agent.current("_all_gather()")
    me = agent.info.name
    names = tuple(
        sorted(worker_names if worker_names is not None else (p.name for p in agent.peers))
    )
    if me not in names:
        raise ArgumentError(f"_all_gather on {me!r}, which is not among {list(names)}")
    seconds = agent.timeout_of(timeout)
    with _cond:
        round_id = _rounds.get(names, 0)
        _rounds[names] = round_id + 1
    if me == names[0]:
        return _gather_put(names, round_id, me, obj, seconds)
    from .api import rpc_sync

    return rpc_sync(
        names[0], _gather_put, (names, round_id, me, obj, seconds), timeout=seconds or 0
    )


def _barrier(worker_names: Iterable[str]) -> None:
    """Wait until every worker of ``worker_names`` has reached this barrier."""
    _all_gather(None, set(worker_names))


def _wait_all_workers(timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Wait until every worker has called this (PyTorch's shutdown rendezvous)."""
    _all_gather(None, timeout=timeout)
