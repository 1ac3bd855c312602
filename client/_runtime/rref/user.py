"""User side of the RRef protocol: UserRRef records and the pending children held for G2.

Invariants kept here:

- G1: a user record sends exactly one RRefDelete, and only once it is CONFIRMED, dropped by
  local code and holds no pending child. Dropping a PENDING user only marks it; the delete
  leaves when the owner's confirmation arrives, because before that the owner may not know the
  fork and must not be told to forget it.
- G2: forking from a user creates a pending child that keeps the parent record (and hence its
  delete) alive until the child's ChildAck, which the child sends only once the owner confirmed
  it (or once it learnt the owner already lost the RRef).
- Every handler ignores what it does not expect (an acknowledgement for a fork no longer
  pending), which makes duplicates and stale retries harmless.

Not thread-safe on its own: ``RRefProtocol`` calls it under its lock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from .errors import RRefProtocolError, UnknownRRefError
from .ids import ForkId, RRefId
from .messages import (
    ChildAck,
    Effects,
    ForkAccepted,
    ForkRequest,
    RemoteAck,
    RRefDelete,
    RRefForkData,
)

__all__ = ["UserState", "UserRecord", "PendingChild", "UserTable"]


class UserState(enum.Enum):
    """Confirmation state of one UserRRef (a deleted user's record is removed)."""

    # The owner may not know this fork yet: a ForkRequest or the creating RemoteCall is in
    # flight. No RRefDelete may be sent in this state.
    PENDING = "pending"
    # The owner knows this fork (ForkAccepted, RemoteAck, or the parent was the owner).
    CONFIRMED = "confirmed"
    # The owner answered that it no longer knows the RRef (a protocol error surfaced to the
    # user). The owner holds nothing for this fork, so no RRefDelete is sent.
    FAILED = "failed"


class UserRecord:
    """One UserRRef, identified by its ForkId."""

    __slots__ = (
        "rref_id",
        "fork_id",
        "owner_id",
        "parent_id",
        "type_name",
        "state",
        "dropped",
        "pending_children",
        "error",
        "waiters",
    )

    def __init__(
        self,
        rref_id: RRefId,
        fork_id: ForkId,
        owner_id: int,
        parent_id: int | None,
        type_name: str,
        state: UserState,
    ) -> None:
        self.rref_id = rref_id
        self.fork_id = fork_id
        self.owner_id = owner_id
        # The worker that must get our ChildAck; None for the remote() caller's own fork.
        self.parent_id = parent_id
        self.type_name = type_name
        self.state = state
        # Local code released this user (GC or explicit); the delete may still be deferred.
        self.dropped = False
        # Forks made from this user whose ChildAck has not arrived (G2).
        self.pending_children = 0
        self.error: BaseException | None = None
        # Called with the record when it leaves PENDING.
        self.waiters: list[Callable[[UserRecord], None]] = []


@dataclass(frozen=True, slots=True)
class PendingChild:
    """A fork this worker made from its user ``parent_fork_id``, held until the ChildAck."""

    rref_id: RRefId
    fork_id: ForkId
    parent_fork_id: ForkId
    child_id: int


class UserTable:
    """The UserRRefs and pending children of one worker."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self.users: dict[ForkId, UserRecord] = {}
        self.children: dict[ForkId, PendingChild] = {}

    # -- creation ----------------------------------------------------------------------------

    def create_remote(
        self, owner_id: int, rref_id: RRefId, fork_id: ForkId, type_name: str
    ) -> UserRecord:
        """The remote() caller's user: PENDING until the owner's RemoteAck."""
        rec = UserRecord(rref_id, fork_id, owner_id, None, type_name, UserState.PENDING)
        self.users[fork_id] = rec
        return rec

    def receive(self, data: RRefForkData, fx: Effects) -> UserRecord:
        """Become the fork in ``data``; ask the owner to confirm it unless the owner sent it."""
        rec = self.users.get(data.fork_id)
        if rec is not None:  # the same payload delivered twice: one fork, one user
            return rec
        if data.parent_id == data.owner_id:
            # The owner recorded this fork when it forked: nothing to confirm.
            state = UserState.CONFIRMED
        else:
            state = UserState.PENDING
            fx.messages.append(
                ForkRequest(
                    data.owner_id, data.rref_id, data.fork_id, self.worker_id, data.parent_id
                )
            )
        rec = UserRecord(
            data.rref_id, data.fork_id, data.owner_id, data.parent_id, data.type_name, state
        )
        self.users[data.fork_id] = rec
        return rec

    def fork(self, parent_fork_id: ForkId, dest: int, child_fork_id: ForkId) -> RRefForkData:
        """Fork user ``parent_fork_id`` for ``dest``, holding it until the ChildAck (G2)."""
        rec = self._live(parent_fork_id)
        self.children[child_fork_id] = PendingChild(rec.rref_id, child_fork_id, rec.fork_id, dest)
        rec.pending_children += 1
        return RRefForkData(rec.owner_id, rec.rref_id, child_fork_id, self.worker_id, rec.type_name)

    def abandon_remote(self, fork_id: ForkId, error: BaseException, fx: Effects) -> None:
        """The remote() call creating this user certainly never reached its owner."""
        rec = self.users.get(fork_id)
        if rec is None or rec.parent_id is not None or rec.state is not UserState.PENDING:
            raise RRefProtocolError(f"fork {fork_id} is not an unconfirmed remote() result")
        if rec.pending_children:
            # Its children will ask the owner about an RRef that will never be created.
            raise RRefProtocolError(f"RRef {rec.rref_id} was already forked; cannot abandon it")
        del self.users[fork_id]
        rec.state, rec.error = UserState.FAILED, error
        waiters, rec.waiters = rec.waiters, []
        fx.callbacks.extend(_bind(fn, rec) for fn in waiters)

    # -- control messages --------------------------------------------------------------------

    def handle_fork_accepted(self, msg: ForkAccepted, fx: Effects) -> None:
        """The owner confirmed (or disowned) our fork: tell the parent, maybe delete."""
        rec = self.users.get(msg.fork_id)
        if rec is None or rec.state is not UserState.PENDING:
            return
        if msg.known:
            self._settle(rec, UserState.CONFIRMED, None, fx)
        else:
            error = UnknownRRefError(
                f"owner {rec.owner_id} no longer knows RRef {rec.rref_id} (fork {rec.fork_id})"
            )
            self._settle(rec, UserState.FAILED, error, fx)

    def handle_remote_ack(self, msg: RemoteAck, fx: Effects) -> None:
        """The owner processed our remote(): our own fork is confirmed."""
        rec = self.users.get(msg.fork_id)
        if rec is not None and rec.state is UserState.PENDING:
            self._settle(rec, UserState.CONFIRMED, None, fx)

    def handle_child_ack(self, msg: ChildAck, fx: Effects) -> None:
        """A child was confirmed: release the hold on its parent (G2)."""
        self._drop_child(msg.fork_id, fx)

    def abandon_fork(self, data: RRefForkData, fx: Effects) -> None:
        """The payload carrying this fork was never delivered: no child will ever ack."""
        self._drop_child(data.fork_id, fx)

    # -- local references --------------------------------------------------------------------

    def release(self, fork_id: ForkId, fx: Effects) -> None:
        """Local code dropped the user (G1); idempotent."""
        rec = self.users.get(fork_id)
        if rec is None or rec.dropped:
            return
        rec.dropped = True
        self._maybe_delete(rec, fx)

    # -- helpers -----------------------------------------------------------------------------

    def _live(self, fork_id: ForkId) -> UserRecord:
        rec = self.users.get(fork_id)
        if rec is None or rec.dropped:
            raise RRefProtocolError(f"worker {self.worker_id} holds no live fork {fork_id}")
        return rec

    def _settle(
        self, rec: UserRecord, state: UserState, error: BaseException | None, fx: Effects
    ) -> None:
        rec.state, rec.error = state, error
        if rec.parent_id is not None and rec.parent_id != rec.owner_id:
            # Also on FAILED: the parent's hold protects nothing any more, and must not leak.
            fx.messages.append(ChildAck(rec.parent_id, rec.rref_id, rec.fork_id, self.worker_id))
        waiters, rec.waiters = rec.waiters, []
        fx.callbacks.extend(_bind(fn, rec) for fn in waiters)
        self._maybe_delete(rec, fx)

    def _drop_child(self, child_fork_id: ForkId, fx: Effects) -> None:
        child = self.children.pop(child_fork_id, None)
        if child is None:
            return
        parent = self.users[child.parent_fork_id]
        parent.pending_children -= 1
        self._maybe_delete(parent, fx)

    def _maybe_delete(self, rec: UserRecord, fx: Effects) -> None:
        if not rec.dropped or rec.pending_children or rec.state is UserState.PENDING:
            return
        del self.users[rec.fork_id]
        if rec.state is UserState.CONFIRMED:
            fx.messages.append(RRefDelete(rec.owner_id, rec.rref_id, rec.fork_id, self.worker_id))


def _bind(fn: Callable[[UserRecord], None], rec: UserRecord) -> Callable[[], None]:
    return lambda: fn(rec)
