"""PyTorch's private RPC helpers that its tests and some programs use, over gradwire's state.

``_wait_all()`` waits, at the end of its block, for every ``rpc_async`` this thread started in
it (``rpc_async`` appends to ``_thread_local_var.future_list``); ``_get_current_rpc_agent()``
gives the RpcAgent surface (worker infos, debug info) of this worker's running agent.

Example:
    >>> with rpc.api._wait_all():
    ...     fut = rpc.rpc_async("worker1", operator.add, (1, 1))
    >>> fut.value()
    2
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from ..._runtime import agent as _agent
from ..._runtime.cluster.workers import WorkerInfo
from ...futures import Future, wait_all

__all__ = [
    "_thread_local_var",
    "_wait_all",
    "_get_current_rpc_agent",
    "_get_debug_info",
    "_track",
    "_delete_all_user_and_unforked_owner_rrefs",
]

#: Per thread: ``future_list`` while inside :func:`_wait_all` (PyTorch's name).
_thread_local_var = threading.local()


def _track(fut: Future[Any]) -> Future[Any]:
    """Record an ``rpc_async`` future for the enclosing :func:`_wait_all` of this thread."""
    futures = getattr(_thread_local_var, "future_list", None)
    if futures is not None:
        futures.append(fut)
    return fut


@contextlib.contextmanager
def _wait_all() -> Iterator[None]:
    """Wait for the ``rpc_async`` calls of the block when it ends (the first error is raised,
    after an error of the block itself)."""
    _thread_local_var.future_list = []
    try:
        yield
    finally:
        try:
            wait_all(_thread_local_var.future_list)
        finally:
            del _thread_local_var.future_list


class _AgentView:
    """PyTorch's ``RpcAgent`` reads over this worker's running agent."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent

    def get_worker_info(self, worker_name: str | None = None) -> WorkerInfo:
        if worker_name is None:
            return self._agent.info
        return self._agent.resolve(worker_name).info

    def get_worker_infos(self) -> list[WorkerInfo]:
        return [WorkerInfo(peer.name, peer.id) for peer in self._agent.peers]

    def get_debug_info(self) -> dict[str, Any]:
        return self._agent.debug_info()


def _get_current_rpc_agent() -> _AgentView:
    """This worker's agent (PyTorch's RpcAgent surface).

    Raises:
        RpcNotInitializedError: RPC is not running.
    """
    return _AgentView(_agent.current("_get_current_rpc_agent()"))


def _delete_all_user_and_unforked_owner_rrefs(timeout: float | timedelta = 300.0) -> None:
    """Settle the RRef protocol of this worker and delete every UserRRef it holds, waiting up
    to ``timeout`` (seconds or a timedelta) for the owners' answers: what a graceful
    ``shutdown`` does between its barriers (PyTorch's name; an OwnerRRef no other worker holds
    needs nothing). UserRRefs cannot be used afterwards.

    Raises:
        RpcNotInitializedError: RPC is not running.
    """
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    agent = _agent.current("_delete_all_user_and_unforked_owner_rrefs()")
    agent.rref.drain(time.monotonic() + seconds)


def _get_debug_info() -> dict[str, Any]:
    """PyTorch's merged debug info: the RRef counters, the agent's, distributed autograd's.

    Raises:
        RpcNotInitializedError: RPC is not running.
    """
    from ..autograd import _get_debug_info as autograd_debug_info
    from .api import _rref_context_get_debug_info

    info: dict[str, Any] = dict(_rref_context_get_debug_info())
    info.update(_get_current_rpc_agent().get_debug_info())
    info.update(autograd_debug_info())
    return info
