"""What the RRef state machine hands to the agent: handles, outcomes and reports.

Frozen snapshots, safe to keep and pass between threads; none of them changes the protocol's
state. ``protocol`` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ids import ForkId, RRefId
from .messages import ControlMessage
from .user import PendingChild
from .value import ValueSlot

__all__ = ["RRefHandle", "RemoteCallAccepted", "RRefDebugInfo", "PendingReport", "OwnerLeak"]


@dataclass(frozen=True, slots=True)
class RRefHandle:
    """What the agent's RRef object wraps: ids, and the value slot on the owner."""

    rref_id: RRefId
    owner_id: int
    # None on the owner (an OwnerRRef has no fork of its own).
    fork_id: ForkId | None
    type_name: str = ""
    value: ValueSlot | None = field(default=None, compare=False, repr=False)

    @property
    def is_owner(self) -> bool:
        """Whether this handle is the OwnerRRef (on its owner)."""
        return self.fork_id is None


@dataclass(frozen=True, slots=True)
class RemoteCallAccepted:
    """Outcome of a RemoteCall on the owner."""

    # The OwnerRRef, or None if it was already deleted (a stale duplicate).
    handle: RRefHandle | None
    # True exactly once per RRefId: run the function and fill ``handle.value``.
    run: bool
    # The RemoteAck to answer with.
    messages: list[ControlMessage]


@dataclass(frozen=True, slots=True)
class RRefDebugInfo:
    """Counters for ``get_debug_info()``."""

    num_owner_rrefs: int
    # OwnerRRefs some other worker holds a fork of (PyTorch's ``owners_``: a local RRef(value)
    # enters it when first shared, and leaves it when its last fork is deleted).
    num_shared_owner_rrefs: int
    num_pending_users: int
    num_pending_children: int
    # Forks known by the owner, summed over its OwnerRRefs.
    num_forks: int
    # UserRRef records of any state (including dropped ones whose delete is deferred).
    num_users: int
    num_tombstones: int


@dataclass(frozen=True, slots=True)
class PendingReport:
    """What graceful shutdown must wait for."""

    # (RRefId, ForkId) of users awaiting the owner's confirmation.
    pending_users: tuple[tuple[RRefId, ForkId], ...]
    # Forks held for a child until its ChildAck.
    pending_children: tuple[PendingChild, ...]
    # Dropped users whose RRefDelete waits on a confirmation or on a child.
    deferred_deletes: tuple[tuple[RRefId, ForkId], ...]

    @property
    def empty(self) -> bool:
        """Whether nothing is pending."""
        return not (self.pending_users or self.pending_children or self.deferred_deletes)


@dataclass(frozen=True, slots=True)
class OwnerLeak:
    """An OwnerRRef still referenced, for the shutdown leak check."""

    rref_id: RRefId
    state: str
    forks: tuple[ForkId, ...]
    local_refs: int
