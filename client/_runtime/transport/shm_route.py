"""Which peers get the shared-memory fast path: the route installed into ``gradwire._wire.shm``.

A destination qualifies when the running worker has ``shm_transfer`` on and the peer advertised
the same ``host_id`` at the rendezvous (so it sees the same /dev/shm). Each such peer gets one
:class:`~gradwire._wire.shm_pool.SegmentPool`, created on first use and closed when the worker
shuts down. The agent builds one :class:`ShmRoutes`; it serves the wire's route while the
agent is RUNNING or SHUTTING_DOWN. Importing this module installs the route
(``gradwire._runtime`` does).
"""

from __future__ import annotations

import threading

from ..._wire import shm
from ..._wire.shm_pool import SegmentPool
from ..cluster.context import WorkerContext
from ..cluster.events import AgentState, ClusterEvents

__all__ = ["ShmRoutes", "route", "pool_stats", "STALE_SECONDS"]

#: A segment whose receiver has not taken it after this long is retired (at least; twice the
#: call timeout when that is longer).
STALE_SECONDS = 300.0

_lock = threading.Lock()
#: The routes of the worker that serves the wire's route (the running agent's), or None.
_active: ShmRoutes | None = None


class ShmRoutes:
    """The shared-memory pools of one worker, one per same-host peer (None for the others).

    Args:
        ctx: the worker's identity, options and peers.
        events: its state changes (serve the route while running; close the pools at the end).
    """

    def __init__(self, ctx: WorkerContext, events: ClusterEvents) -> None:
        self._ctx = ctx
        self._pools: dict[str, SegmentPool | None] = {}
        events.on_state(self._on_state)

    def route(self, peer_name: str) -> SegmentPool | None:
        """The pool for ``peer_name`` when this worker may use shared memory with it."""
        with _lock:
            if peer_name not in self._pools:
                self._pools[peer_name] = self._new_pool(peer_name)
            return self._pools[peer_name]

    def _new_pool(self, peer_name: str) -> SegmentPool | None:
        ctx = self._ctx
        options = ctx.options
        peer = ctx.peers.by_name.get(peer_name)
        me = ctx.peers.by_name.get(ctx.name)
        if not options.shm_transfer or peer is None or me is None:
            return None
        if not peer.host_id or peer.host_id != me.host_id:
            return None
        stale = max(STALE_SECONDS, 2 * options.rpc_timeout)
        return SegmentPool(peer_name, options.shm_threshold_bytes, options.shm_pool_bytes, stale)

    def _on_state(self, state: AgentState) -> None:
        global _active
        if state == AgentState.RUNNING:
            with _lock:
                _active = self
            return
        if state != AgentState.SHUTDOWN:
            return
        with _lock:
            if _active is self:
                _active = None
            pools, self._pools = self._pools, {}
        for pool in pools.values():
            if pool is not None:
                pool.close()
                shm.forget(pool)
        shm.clear_cache()  # the peers' segments this worker kept mapped for the next transfer

    def stats(self) -> dict[str, dict[str, int]]:
        """Per same-host peer, the pool counters (segments, bytes, created, reused, retired,
        full)."""
        with _lock:
            pools = dict(self._pools)
        return {name: pool.stats() for name, pool in pools.items() if pool is not None}

    def debug_info(self) -> dict[str, object]:
        """The ``shm_transfer`` entry of ``Agent.debug_info()``: this process' counters (tensors
        and bytes sent / received through shared memory, ``fallback``, ``mapped``), the pools
        and the peers' segments kept mapped (``receive_cache``)."""
        return {
            "shm_transfer": {
                "counters": shm.stats(),
                "pools": self.stats(),
                "receive_cache": shm.cache_info(),
            }
        }


def route(peer_name: str) -> SegmentPool | None:
    """The wire's route: the running worker's pool for ``peer_name``, if any."""
    routes = _active
    return routes.route(peer_name) if routes is not None else None


def pool_stats() -> dict[str, dict[str, int]]:
    """``ShmRoutes.stats`` of the running worker (empty when none runs)."""
    routes = _active
    return routes.stats() if routes is not None else {}


shm.set_route(route)
