"""What every service of a worker may know about it: the frozen ``WorkerContext``.

The agent builds one context and hands it to each service together with the few other things
that service uses (the transport, the serving pool, the events, a callback); no service holds
the agent. The peer table inside is filled once, by the rendezvous.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..._wire.policy import CallablePolicy
from .device_maps import DeviceMaps
from .options import NO_TIMEOUT, UNSET_RPC_TIMEOUT, GrpcRpcBackendOptions
from .workers import Peer, resolve_destination

__all__ = ["PeerTable", "WorkerContext"]


class PeerTable:
    """The members of the cluster as this worker sees them, by id and by name, and the device
    maps tensors travel by. Empty until the rendezvous fills it (``fill``, once)."""

    def __init__(self, device_maps: DeviceMaps) -> None:
        self.all: list[Peer] = []
        self.by_name: dict[str, Peer] = {}
        #: This worker's maps; after the rendezvous, the peers' inverse maps too.
        self.device_maps = device_maps

    def fill(self, peers: list[Peer], device_maps: DeviceMaps) -> None:
        """Record the rendezvous' members (ordered by id) and the maps built from them."""
        self.all = peers
        self.by_name = {p.name: p for p in peers}
        self.device_maps = device_maps

    def __getitem__(self, worker_id: int) -> Peer:
        return self.all[worker_id]

    def __len__(self) -> int:
        return len(self.all)

    def __iter__(self) -> Iterator[Peer]:
        return iter(self.all)

    def name_of(self, worker_id: int) -> str:
        """Name of worker ``worker_id`` (or ``"#id"`` if unknown)."""
        if 0 <= worker_id < len(self.all):
            return self.all[worker_id].name
        return f"#{worker_id}"

    def resolve(self, to: Any) -> Peer:
        """Destination (name, WorkerInfo or rank) -> Peer; raises UnknownWorkerError."""
        return resolve_destination(to, self.all, self.by_name)


@dataclass(frozen=True)
class WorkerContext:
    """One worker's identity and settings, shared read-only by its services.

    Args:
        name: the worker's name.
        rank: its id in [0, world_size).
        world_size: number of workers.
        options: the backend options.
        policy: the callable policy (``options.policy()``).
        peers: the cluster's members (filled by the rendezvous).
    """

    name: str
    rank: int
    world_size: int
    options: GrpcRpcBackendOptions
    policy: CallablePolicy
    peers: PeerTable = field(compare=False)

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
