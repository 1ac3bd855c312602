"""Broken variants of the protocol, each violating one rule, for testing the tests.

Each entry is (class, attribute, replacement) for ``monkeypatch.setattr``.
"""

from __future__ import annotations

from gradwire._runtime.rref import owner as rref_owner
from gradwire._runtime.rref import user as rref_user
from gradwire._runtime.rref.messages import ChildAck, RRefDelete
from gradwire._runtime.rref.owner import OwnerRecord, OwnerState
from gradwire._runtime.rref.user import UserState

__all__ = ["MUTANTS"]


def _delete_ignoring_children(self, rec, fx):  # breaks G2
    if rec.dropped and rec.state is not UserState.PENDING:
        del self.users[rec.fork_id]
        fx.messages.append(RRefDelete(rec.owner_id, rec.rref_id, rec.fork_id, self.worker_id))


def _delete_while_pending(self, rec, fx):  # breaks G1's "only once confirmed"
    if rec.dropped and not rec.pending_children:
        del self.users[rec.fork_id]
        if rec.state is not UserState.FAILED:
            fx.messages.append(RRefDelete(rec.owner_id, rec.rref_id, rec.fork_id, self.worker_id))


def _delete_awaiting_creation(self, rec, fx):  # forgets that the creator's fork is unknown
    if not rec.forks and rec.local_refs == 0:
        del self.records[rec.rref_id]
        self.deleted.add(rec.rref_id)
        fx.deleted.append(rec.rref_id)


def _no_fork_tombstones(self, rec, fork_id):  # a stale ForkRequest re-adds a deleted fork
    return False


_receive = rref_user.UserTable.receive


def _ack_before_confirmation(self, data, fx):  # the child acks its parent too early
    rec = _receive(self, data, fx)
    if data.parent_id != data.owner_id:
        fx.messages.append(ChildAck(data.parent_id, data.rref_id, data.fork_id, self.worker_id))
    return rec


def _no_rref_tombstones(self, rref_id, create):  # a stale message resurrects a deleted RRef
    rec = self.records.get(rref_id)
    if rec is not None or not create or rref_id.created_on == self.worker_id:
        return rec
    rec = OwnerRecord(rref_id, OwnerState.AWAITING_CREATION)
    self.records[rref_id] = rec
    return rec


MUTANTS = {
    "delete_ignoring_children": (rref_user.UserTable, "_maybe_delete", _delete_ignoring_children),
    "delete_while_pending": (rref_user.UserTable, "_maybe_delete", _delete_while_pending),
    "delete_awaiting_creation": (rref_owner.OwnerTable, "_maybe_delete", _delete_awaiting_creation),
    "no_fork_tombstones": (rref_owner.OwnerTable, "_fork_deleted", _no_fork_tombstones),
    "ack_before_confirmation": (rref_user.UserTable, "receive", _ack_before_confirmation),
    "no_rref_tombstones": (rref_owner.OwnerTable, "lookup", _no_rref_tombstones),
}
