"""Worker identities: the public WorkerInfo, the internal Peer record and name rules."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any

from ...errors import RpcInitError, UnknownWorkerError

__all__ = [
    "WorkerInfo",
    "Peer",
    "validate_name",
    "validate_rank",
    "RANK_LIMIT",
    "host_id",
    "resolve_destination",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9_:\-]{1,127}$")

#: Ranks are below 2**15: dist autograd ids are (worker id << 48) + counter in a signed int64.
RANK_LIMIT = 1 << 15


@dataclass(frozen=True)
class WorkerInfo:
    """A worker of the cluster: its unique ``name`` and its ``id`` (= rank). Hashable, picklable."""

    name: str
    id: int

    def __post_init__(self) -> None:
        validate_name(self.name)

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, name={self.name})"


# Pickles by its public path, so it travels under the default callable policy.
WorkerInfo.__module__ = "gradwire.distributed.rpc"


@dataclass(frozen=True)
class Peer:
    """What this worker knows about a member: identity, address and host."""

    name: str
    id: int
    address: str
    host_id: str = ""
    #: Unix socket of the peer's server, when it has one.
    local_address: str = ""
    #: The address this worker dials: the Unix socket for a peer on the same host, else address.
    dial: str = ""
    #: The peer's fast lane (Call, CallStream, Gradients, control messages answered at once):
    #: its Unix socket on this host, else its TCP port; ``dial`` when it has none.
    call_dial: str = ""
    #: ``host:port`` of the peer's bulk lane ("" if none: its tensors go in the messages).
    bulk_address: str = ""
    #: The peer's bulk lane serves lane pipes (``WorkerInfo.lane_pipe``).
    lane_pipe: bool = False
    #: Its lane pipes take PLAIN records (``WorkerInfo.lane_plain``).
    lane_plain: bool = False

    def __post_init__(self) -> None:
        if not self.call_dial:  # no fast lane: Call and Gradients go where everything goes
            object.__setattr__(self, "call_dial", self.dial)

    @property
    def info(self) -> WorkerInfo:
        return WorkerInfo(self.name, self.id)


def validate_rank(rank: int, who: str) -> None:
    """Check that ``who``'s rank fits a worker id (0 <= rank < 2**15).

    Raises:
        RpcInitError: the rank is negative or too large (the message says what to do).
    """
    if rank < 0:
        raise RpcInitError(f"{who} has rank {rank}; a rank must be >= 0")
    if rank >= RANK_LIMIT:
        raise RpcInitError(
            f"{who} has rank {rank}, which is too large: ranks must be below {RANK_LIMIT} "
            "(2**15; a worker id is the top bits of a 64-bit dist autograd id)"
        )


def validate_name(name: Any) -> str:
    """Check a worker name: non-empty, [A-Za-z0-9_:-], under 128 characters (PyTorch's rule).

    Raises:
        RpcInitError: the name breaks the rules (PyTorch's message, then which rule).
    """
    if not isinstance(name, str):
        raise RpcInitError(f"worker name must be a string, got {type(name).__name__}")
    if not _NAME_RE.match(name):
        why = (
            "it is empty"
            if not name
            else f"it has {len(name)} characters"
            if len(name) > 127
            else "it has other characters"
        )
        raise RpcInitError(
            "Worker name must match ^[A-Za-z0-9-_:]*$, and must be non-empty and shorter than "
            f"128 chars, but got {name[:200]!r}: invalid worker name, {why}; use 1 to 127 "
            "characters from A-Z a-z 0-9 _ : -"
        )
    return name


def host_id() -> str:
    """Boot id plus hostname: equal on two workers iff they share a host (and its /dev/shm).

    ``$GRADWIRE_HOST_ID``, when set, replaces it: containers on one machine that do not share
    /dev/shm can set different values, and tests use it to make local workers look remote.
    """
    override = os.environ.get("GRADWIRE_HOST_ID")
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{boot}/{socket.gethostname()}"


def resolve_destination(
    to: Any, by_id: dict[int, Peer], by_name: dict[str, Peer], world_size: int = 0
) -> Peer:
    """Map ``to`` (name, WorkerInfo or rank) to a current member.

    Args:
        to: the destination.
        by_id, by_name: the members.
        world_size: the fixed size of a static group (ranks 0..world_size-1); 0 for a dynamic one.

    Raises:
        UnknownWorkerError: unknown name, rank out of range, or a rank that is not an integer.
    """
    if isinstance(to, WorkerInfo):
        peer = by_name.get(to.name)
        if peer is None or peer.id != to.id:
            raise UnknownWorkerError(f"{to!r} is not a member of this cluster")
        return peer
    if isinstance(to, str):
        peer = by_name.get(to)
        if peer is None:
            known = ", ".join(sorted(by_name)) or "none"
            raise UnknownWorkerError(f"unknown worker {to!r}; known workers: {known}")
        return peer
    if isinstance(to, bool) or not isinstance(to, int):
        if isinstance(to, float) and to.is_integer():
            raise UnknownWorkerError(f"rank must be an int, got the float {to!r}")
        raise UnknownWorkerError(
            f"destination must be a worker name, a WorkerInfo or an int rank, got {to!r}"
        )
    peer = by_id.get(to)
    if peer is None:
        if world_size:
            raise UnknownWorkerError(f"rank {to} is out of range for world size {world_size}")
        known = ", ".join(str(i) for i in sorted(by_id)) or "none"
        raise UnknownWorkerError(f"no worker has rank {to}; known ranks: {known}")
    return peer
