"""What every service of a worker may know about it: the frozen ``WorkerContext``.

The agent builds one context and hands it to each service together with the few other things
that service uses (the transport, the serving pool, the events, a callback); no service holds
the agent. The peer table inside is filled once, by the rendezvous.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..._wire.policy import CallablePolicy
from ...errors import UnknownWorkerError, WorkerDepartedError
from .device_maps import DeviceMaps
from .options import NO_TIMEOUT, UNSET_RPC_TIMEOUT, GrpcRpcBackendOptions
from .workers import Peer, WorkerInfo, resolve_destination

__all__ = ["PeerTable", "WorkerContext"]


class PeerTable:
    """The members of the cluster as this worker sees them, by id and by name, and the device
    maps tensors travel by. Empty until the rendezvous fills it (``fill``); in a dynamic group
    (``init_rpc`` without a world size) members are added and removed later (``add``,
    ``remove``), each change replacing the containers whole, so a reader never sees one half
    done. Members that left on purpose stay known as departed, for the errors that name them.
    """

    def __init__(self, device_maps: DeviceMaps, world_size: int = 0) -> None:
        self.all: list[Peer] = []
        self.by_name: dict[str, Peer] = {}
        self.by_id: dict[int, Peer] = {}
        #: Members that left the group with shutdown(), by id and by name.
        self.departed: dict[int, Peer] = {}
        self.departed_names: dict[str, Peer] = {}
        #: This worker's maps; after the rendezvous, the peers' inverse maps too.
        self.device_maps = device_maps
        #: The size of a fixed group (ranks 0..world_size-1); 0 for a dynamic one.
        self.world_size = world_size
        #: worker id -> ``time.monotonic()`` when a call or a reply from it last arrived: a
        #: peer heard from lately is alive, however slowly it answers a health check
        #: (``Liveness``; written without a lock, one float per message).
        self.heard: dict[int, float] = {}
        self._lock = threading.Lock()

    def fill(self, peers: list[Peer], device_maps: DeviceMaps) -> None:
        """Record the rendezvous' members (ordered by id) and the maps built from them."""
        with self._lock:
            self._set({p.id: p for p in peers}, device_maps)

    def add(self, peer: Peer, device_maps: DeviceMaps) -> bool:
        """A member joined (dynamic group); False if it was known already."""
        with self._lock:
            if self.by_id.get(peer.id) == peer:
                return False
            # A worker lost earlier may come back under its name with another rank.
            kept = {i: p for i, p in self.by_id.items() if p.name != peer.name}
            self._set({**kept, peer.id: peer}, device_maps)
            return True

    def remove(self, worker_id: int, device_maps: DeviceMaps) -> Peer | None:
        """A member left the group on purpose (dynamic group): it becomes departed."""
        with self._lock:
            peer = self.by_id.get(worker_id)
            if peer is None:
                return None
            self._set({i: p for i, p in self.by_id.items() if i != worker_id}, device_maps)
            self.departed = {**self.departed, peer.id: peer}
            self.departed_names = {**self.departed_names, peer.name: peer}
            return peer

    def _set(self, by_id: dict[int, Peer], device_maps: DeviceMaps) -> None:
        members = sorted(by_id.values(), key=lambda p: p.id)
        names = {p.name for p in members}
        self.departed = {i: p for i, p in self.departed.items() if i not in by_id}
        self.departed_names = {n: p for n, p in self.departed_names.items() if n not in names}
        self.by_id = by_id
        self.by_name = {p.name: p for p in members}
        self.all = members
        self.device_maps = device_maps

    def __getitem__(self, worker_id: int) -> Peer:
        """The member (or departed member) with id ``worker_id``.

        Raises:
            UnknownWorkerError: no such worker was ever seen.
        """
        peer = self.by_id.get(worker_id) or self.departed.get(worker_id)
        if peer is None:
            raise UnknownWorkerError(f"no worker has rank {worker_id} in this cluster")
        return peer

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self.by_id

    def __len__(self) -> int:
        return len(self.all)

    def __iter__(self) -> Iterator[Peer]:
        return iter(self.all)

    def name_of(self, worker_id: int) -> str:
        """Name of worker ``worker_id`` (or ``"#id"`` if unknown)."""
        peer = self.by_id.get(worker_id) or self.departed.get(worker_id)
        return peer.name if peer is not None else f"#{worker_id}"

    def resolve(self, to: Any) -> Peer:
        """Destination (name, WorkerInfo or rank) -> Peer.

        Raises:
            WorkerDepartedError: it left the group with shutdown().
            UnknownWorkerError: no member is called so (or has that rank).
        """
        try:
            return resolve_destination(to, self.by_id, self.by_name, self.world_size)
        except UnknownWorkerError:
            gone = self.departed_peer(to)
            if gone is not None:
                raise WorkerDepartedError(
                    f"worker {gone.name!r} (rank {gone.id}) has departed: it left the group "
                    "with shutdown() and takes no more calls"
                ) from None
            raise

    def departed_peer(self, to: Any) -> Peer | None:
        """The departed member ``to`` names (name, WorkerInfo or rank), if any."""
        if isinstance(to, WorkerInfo):
            peer = self.departed_names.get(to.name)
            return peer if peer is not None and peer.id == to.id else None
        if isinstance(to, str):
            return self.departed_names.get(to)
        if isinstance(to, int) and not isinstance(to, bool):
            return self.departed.get(to)
        return None


@dataclass(frozen=True)
class WorkerContext:
    """One worker's identity and settings, shared read-only by its services.

    Args:
        name: the worker's name.
        rank: its id (in [0, world_size) in a fixed group).
        world_size: number of workers of a fixed group; 0 in a dynamic group.
        options: the backend options.
        policy: the callable policy (``options.policy()``).
        peers: the cluster's members (filled by the rendezvous, changed by joins and leaves
            in a dynamic group).
    """

    name: str
    rank: int
    world_size: int
    options: GrpcRpcBackendOptions
    policy: CallablePolicy
    peers: PeerTable = field(compare=False)

    @property
    def dynamic(self) -> bool:
        """Whether this worker is in a dynamic group (``init_rpc`` without a world size)."""
        return self.world_size == 0

    @property
    def device_maps(self) -> DeviceMaps:
        """The device maps of requests, replies and gradients (see ``device_maps``)."""
        return self.peers.device_maps

    def peer_name(self, worker_id: int) -> str:
        """Name of worker ``worker_id`` (or ``"#id"`` if unknown)."""
        return self.peers.name_of(worker_id)

    def timeout_of(self, timeout: float | None) -> float | None:
        """A verb's timeout argument -> seconds or None (-1: the default, 0: none)."""
        if timeout is None or timeout == UNSET_RPC_TIMEOUT:
            timeout = self.options.rpc_timeout
        if timeout < 0:
            raise ValueError(f"timeout must be -1 (default), 0 (none) or positive, got {timeout}")
        return None if timeout == NO_TIMEOUT else float(timeout)
