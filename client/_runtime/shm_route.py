"""Which peers get the shared-memory fast path: the route installed into ``gradwire._wire.shm``.

A destination qualifies when the running agent has ``shm_transfer`` on and the peer advertised
the same ``host_id`` at the rendezvous (so it sees the same /dev/shm). Each such peer gets one
:class:`~gradwire._wire.shm_pool.SegmentPool`, created on first use and closed when the agent
shuts down. Importing this module installs the route (``gradwire._runtime`` does).
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import TYPE_CHECKING

from .._wire import shm
from .._wire.shm_pool import SegmentPool

if TYPE_CHECKING:
    from .agent import Agent, AgentState

__all__ = ["route", "pool_stats", "debug_info", "STALE_SECONDS"]

#: A segment whose receiver has not taken it after this long is retired (at least; twice the
#: call timeout when that is longer).
STALE_SECONDS = 300.0

_lock = threading.Lock()
_pools: weakref.WeakKeyDictionary[Agent, dict[str, SegmentPool | None]] = (
    weakref.WeakKeyDictionary()
)


def route(peer_name: str) -> SegmentPool | None:
    """The pool for ``peer_name`` when the current agent may use shared memory with it."""
    from .agent import AgentState, current_or_none

    agent = current_or_none()
    if agent is None or agent.state not in (AgentState.RUNNING, AgentState.SHUTTING_DOWN):
        return None
    with _lock:
        pools = _pools.get(agent)
        if pools is None:
            pools = _pools[agent] = {}
            agent.add_state_listener(functools.partial(_on_state, agent))
        if peer_name not in pools:
            pools[peer_name] = _new_pool(agent, peer_name)
        return pools[peer_name]


def _new_pool(agent: Agent, peer_name: str) -> SegmentPool | None:
    options = agent.options
    peer = agent.by_name.get(peer_name)
    me = agent.by_name.get(agent.name)
    if not options.shm_transfer or peer is None or me is None:
        return None
    if not peer.host_id or peer.host_id != me.host_id:
        return None
    stale = max(STALE_SECONDS, 2 * options.rpc_timeout)
    return SegmentPool(peer_name, options.shm_threshold_bytes, options.shm_pool_bytes, stale)


def _on_state(agent: Agent, state: AgentState) -> None:
    from .agent import AgentState

    if state != AgentState.SHUTDOWN:
        return
    with _lock:
        pools = _pools.pop(agent, {})
    for pool in pools.values():
        if pool is not None:
            pool.close()
            shm.forget(pool)
    shm.clear_cache()  # the peers' segments this worker kept mapped for the next transfer


def pool_stats(agent: Agent | None = None) -> dict[str, dict[str, int]]:
    """Per same-host peer, the pool counters (segments, bytes, created, reused, retired, full)
    of ``agent`` (default: the current one)."""
    from .agent import current_or_none

    agent = agent or current_or_none()
    with _lock:
        pools = dict(_pools.get(agent, {})) if agent is not None else {}
    return {name: pool.stats() for name, pool in pools.items() if pool is not None}


def debug_info(agent: Agent) -> dict[str, object]:
    """The ``shm_transfer`` entry of ``Agent.debug_info()``: this process' counters (tensors and
    bytes sent / received through shared memory, ``fallback``, ``mapped``), the agent's pools
    and the peers' segments kept mapped (``receive_cache``)."""
    return {
        "shm_transfer": {
            "counters": shm.stats(),
            "pools": pool_stats(agent),
            "receive_cache": shm.cache_info(),
        }
    }


shm.set_route(route)
