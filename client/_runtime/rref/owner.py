"""Owner side of the RRef protocol: OwnerRRef records, their known forks and local references.

Invariant kept here: an OwnerRRef is deleted exactly when it is LIVE, the owner knows no fork
of it and nothing local refers to it. The protocol (G1 on users, G2 on parents) guarantees that
at that moment no UserRRef can exist anywhere: every fork the owner does not know yet has a
living ancestor that the owner does know (see the module docstring of ``protocol``).

Not thread-safe on its own: ``RRefProtocol`` calls it under its lock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from ..util.tombstones import Tombstones
from .errors import RRefProtocolError, UnknownRRefError
from .ids import ForkId, IdGenerator, RRefId
from .messages import (
    ChildAck,
    Effects,
    ForkAccepted,
    ForkRequest,
    RemoteAck,
    RRefDelete,
    RRefForkData,
)
from .value import ValueSlot

__all__ = ["OwnerState", "OwnerRecord", "OwnerTable"]


class OwnerState(enum.Enum):
    """Life of an OwnerRRef record on its owner (a deleted record leaves only a tombstone)."""

    # Known through a ForkRequest, a forwarded fork or a to_here that overtook the RemoteCall
    # creating it. The creator's fork is still unknown, so the record must not be deleted even
    # when it has no known fork: deleting it would lose the caller's user (and its descendants).
    AWAITING_CREATION = "awaiting_creation"
    # Created (RemoteCall processed, or created locally). Deleted when forks and local refs are 0.
    LIVE = "live"


class OwnerRecord:
    """One OwnerRRef: its value slot, the forks the owner knows and local reference count."""

    __slots__ = ("rref_id", "type_name", "state", "value", "forks", "local_refs", "deleted_forks")

    def __init__(self, rref_id: RRefId, state: OwnerState, type_name: str = "") -> None:
        self.rref_id = rref_id
        self.type_name = type_name
        self.state = state
        self.value = ValueSlot()
        self.forks: set[ForkId] = set()
        self.local_refs = 0
        # Created lazily: most records never see a fork deleted while still alive.
        self.deleted_forks: Tombstones[ForkId] | None = None


class OwnerTable:
    """The OwnerRRefs of one worker."""

    def __init__(
        self,
        worker_id: int,
        ids: IdGenerator,
        tombstone_ttl: float | None,
        clock: Callable[[], float],
    ) -> None:
        self.worker_id = worker_id
        self._ids = ids
        self._ttl = tombstone_ttl
        self._clock = clock
        self.records: dict[RRefId, OwnerRecord] = {}
        # RRefs deleted here: stale ForkRequests must not resurrect them, nor stale RemoteCalls
        # re-run their function.
        self.deleted: Tombstones[RRefId] = Tombstones(tombstone_ttl, clock)
        # RRefDeletes for an RRef not known yet. The protocol never sends one (a user deletes
        # only once confirmed), but keeping them makes the owner safe against an agent that does.
        self.early_deletes: Tombstones[tuple[RRefId, ForkId]] = Tombstones(tombstone_ttl, clock)

    # -- creation and lookup -----------------------------------------------------------------

    def create_local(self, type_name: str) -> OwnerRecord:
        """A new OwnerRRef minted here (RRef(value), remote() to self), held by the caller."""
        rec = OwnerRecord(self._ids.next_id(), OwnerState.LIVE, type_name)
        rec.local_refs = 1
        self.records[rec.rref_id] = rec
        return rec

    def lookup(self, rref_id: RRefId, create: bool) -> OwnerRecord | None:
        """The record of ``rref_id``; with ``create``, make one if it may simply not exist yet.

        An RRef minted by another worker and never deleted here may be the subject of a
        RemoteCall still in flight, so it is created AWAITING_CREATION. An unknown RRef minted
        here, or one with a tombstone, is gone: None.
        """
        rec = self.records.get(rref_id)
        if rec is not None or not create:
            return rec
        if rref_id.created_on == self.worker_id or rref_id in self.deleted:
            return None
        rec = OwnerRecord(rref_id, OwnerState.AWAITING_CREATION)
        self.records[rref_id] = rec
        return rec

    def accept_remote_call(
        self, rref_id: RRefId, fork_id: ForkId, caller_id: int, type_name: str, fx: Effects
    ) -> tuple[OwnerRecord | None, bool]:
        """Process a RemoteCall; return (record, whether the agent must run the function).

        The RRefId is the idempotency key: a retried or duplicated RemoteCall finds the record
        LIVE (or a tombstone) and is only acknowledged again, so the function runs at most once.
        """
        if rref_id.created_on == self.worker_id:
            raise RRefProtocolError(f"RemoteCall for {rref_id}, minted by the owner itself")
        fx.messages.append(RemoteAck(caller_id, rref_id, fork_id))
        if rref_id in self.deleted:
            return None, False
        rec = self.lookup(rref_id, create=True)
        assert rec is not None  # minted elsewhere and not deleted
        if rec.state is OwnerState.LIVE:
            return rec, False
        rec.state = OwnerState.LIVE
        rec.type_name = type_name or rec.type_name
        if not self._fork_deleted(rec, fork_id):
            rec.forks.add(fork_id)
        self._maybe_delete(rec, fx)
        return rec, True

    # -- forks -------------------------------------------------------------------------------

    def fork(self, rref_id: RRefId, dest: int) -> RRefForkData:
        """Fork an owned RRef for ``dest``: the owner knows the new fork at once (no G2 wait)."""
        rec = self.records.get(rref_id)
        if rec is None:
            raise UnknownRRefError(f"worker {self.worker_id} owns no RRef {rref_id}")
        fork_id = self._ids.next_id()
        rec.forks.add(fork_id)
        return RRefForkData(self.worker_id, rref_id, fork_id, self.worker_id, rec.type_name)

    def receive_own_fork(self, data: RRefForkData, fx: Effects) -> OwnerRecord:
        """A payload brought back one of our RRefs: take a local reference for the receiver.

        From a user parent, acknowledge at once: the local reference now keeps the OwnerRRef
        alive, which is all G2 asks of a confirmed child. From ourselves, the fork recorded when
        sending is replaced by the local reference.
        """
        rec = self.lookup(data.rref_id, create=True)
        if rec is None:
            raise UnknownRRefError(f"worker {self.worker_id} no longer owns RRef {data.rref_id}")
        rec.local_refs += 1
        if data.parent_id == self.worker_id:
            rec.forks.discard(data.fork_id)
        else:
            fx.messages.append(ChildAck(data.parent_id, data.rref_id, data.fork_id, self.worker_id))
        return rec

    def abandon_fork(self, data: RRefForkData, fx: Effects) -> None:
        """The payload carrying our fork was never delivered: forget the fork."""
        rec = self.records.get(data.rref_id)
        if rec is not None:
            rec.forks.discard(data.fork_id)
            self._maybe_delete(rec, fx)

    # -- control messages --------------------------------------------------------------------

    def handle_fork_request(self, msg: ForkRequest, fx: Effects) -> None:
        """Record the child's fork and answer it; a fork already deleted is not re-added."""
        rec = self.lookup(msg.rref_id, create=True)
        if rec is None:
            fx.messages.append(ForkAccepted(msg.child_id, msg.rref_id, msg.fork_id, known=False))
            return
        if not self._fork_deleted(rec, msg.fork_id):
            rec.forks.add(msg.fork_id)
        fx.messages.append(ForkAccepted(msg.child_id, msg.rref_id, msg.fork_id, known=True))

    def handle_delete(self, msg: RRefDelete, fx: Effects) -> None:
        """Forget the fork (G1) and tombstone it; delete the OwnerRRef if nothing is left."""
        rec = self.records.get(msg.rref_id)
        if rec is None:
            if msg.rref_id.created_on != self.worker_id and msg.rref_id not in self.deleted:
                self.early_deletes.add((msg.rref_id, msg.fork_id))
            return
        rec.forks.discard(msg.fork_id)
        self._maybe_delete(rec, fx)
        if rec.rref_id in self.records:
            # Still alive: remember the fork so that a stale ForkRequest cannot re-add it. (Once
            # the record is deleted, the RRef's own tombstone covers its forks.)
            if rec.deleted_forks is None:
                rec.deleted_forks = Tombstones(self._ttl, self._clock)
            rec.deleted_forks.add(msg.fork_id)

    # -- local references --------------------------------------------------------------------

    def acquire(self, rref_id: RRefId) -> None:
        """Local code took one more reference to the OwnerRRef."""
        rec = self.records.get(rref_id)
        if rec is None:
            raise UnknownRRefError(f"worker {self.worker_id} owns no RRef {rref_id}")
        rec.local_refs += 1

    def release(self, rref_id: RRefId, fx: Effects) -> None:
        """Local code dropped one reference; delete the OwnerRRef if nothing is left."""
        rec = self.records.get(rref_id)
        if rec is None or rec.local_refs <= 0:
            raise RRefProtocolError(f"release of RRef {rref_id} without a local reference")
        rec.local_refs -= 1
        self._maybe_delete(rec, fx)

    # -- helpers -----------------------------------------------------------------------------

    def _fork_deleted(self, rec: OwnerRecord, fork_id: ForkId) -> bool:
        if rec.deleted_forks is not None and fork_id in rec.deleted_forks:
            return True
        return (rec.rref_id, fork_id) in self.early_deletes

    def _maybe_delete(self, rec: OwnerRecord, fx: Effects) -> None:
        if rec.state is OwnerState.LIVE and not rec.forks and rec.local_refs == 0:
            del self.records[rec.rref_id]
            self.deleted.add(rec.rref_id)
            fx.deleted.append(rec.rref_id)

    def expire_tombstones(self) -> None:
        """Forget tombstones older than the ttl."""
        self.deleted.prune()
        self.early_deletes.prune()
        for rec in self.records.values():
            if rec.deleted_forks is not None:
                rec.deleted_forks.prune()
