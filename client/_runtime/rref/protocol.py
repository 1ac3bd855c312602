"""The RRef protocol as a transport-free state machine: events in, control messages out.

One ``RRefProtocol`` per worker. The agent calls it when user code creates, forks, receives or
drops an RRef and when a control message arrives; it returns the control messages to send
(``messages``) and never touches the network, so the same object runs under gRPC and
under the simulated network of ``tests/rref/simnet.py``.

State
-----
Owner side (``owner``), per OwnerRRef: a value slot (filled once, with a value or an
error; readers wait), the set of forks the owner knows, a count of local references held by
code on the owner, and a state:

- AWAITING_CREATION: known through a ForkRequest, a fork sent back to the owner, or a to_here
  that overtook the RemoteCall creating it. Never deleted: the creator's fork is still unknown.
- LIVE: created. Deleted, leaving a tombstone, exactly when it knows no fork and has no local
  reference.

User side (``user``), per UserRRef, keyed by its ForkId: PENDING (the owner may not know
the fork yet), CONFIRMED (it does), FAILED (the owner answered that the RRef is gone), plus a
``dropped`` flag (local code released it) and a count of pending children. Pending children are
forks made from a local user for another worker, held until that child's ChildAck.

Messages and flows
------------------
- ``remote()``: the caller mints RRefId and ForkId and holds a PENDING user; the RemoteCall
  carries both; the owner creates (or finishes creating) the OwnerRRef, records the fork and
  answers RemoteAck, which confirms the caller's user. The RRefId makes RemoteCall idempotent:
  a retry is acknowledged again and the function runs at most once.
- Owner -> user: the owner records the new fork before the payload leaves; the receiving user
  is CONFIRMED at once. No control message.
- User -> owner (argument or return value): the parent holds a pending child; the owner takes a
  local reference for the receiving code and answers ChildAck at once.
- User -> user: the parent holds a pending child; the child is PENDING and sends ForkRequest to
  the owner, which records the fork and answers ForkAccepted; the child, now CONFIRMED, sends
  ChildAck to the parent, which releases the pending child. Chains repeat this per hop.
- A dropped user sends RRefDelete once it is CONFIRMED and has no pending child; the owner
  forgets the fork and deletes the OwnerRRef if nothing else holds it.

Invariants
----------
- G1: every CONFIRMED user eventually sends exactly one RRefDelete, after it is dropped. A user
  dropped while PENDING is not forgotten: the delete is deferred until the confirmation, because
  before it the owner may not know the fork, and a delete it cannot match would be lost.
- G2: a parent's delete is deferred while it has pending children, and a child acknowledges only
  after the owner confirmed it (the owner itself acknowledges once it holds a local reference).
- Safety: the owner deletes a LIVE record only when it knows no fork and holds no local
  reference, and then no fork can be alive. Suppose fork X is alive (a record somewhere, or in
  a payload in flight). A fork leaves the known set only through its own RRefDelete (or when
  the owner receives a fork it sent itself, whose local reference then takes over), so if X
  was ever known it still is; hence X was never known, so it is unconfirmed and has not sent
  its ChildAck, so its parent still holds a pending child and has not sent its RRefDelete: the
  parent is alive too, and the argument repeats up the fork tree (a tree: every fork has one
  parent). The climb ends at a fork the owner knows: the creator's fork (known since the
  RemoteCall made the record LIVE) or a fork the owner made itself (known from the moment it
  was made). Either way the known set was not empty. An AWAITING_CREATION record never reaches
  this test, since its creator's fork is not known yet.
- Liveness: once every user is dropped and all messages are delivered, every pending child is
  acknowledged, every user is confirmed and deleted, and every OwnerRRef is deleted. This needs
  the tombstones below: without them a stale message could re-add a deleted fork.

Reordering, duplicates and retries
----------------------------------
Messages between two workers may be processed in any order and more than once. Each handler is
idempotent: an acknowledgement for a fork that is no longer pending is ignored, a fork already
known is a no-op, and a re-delivered payload yields the same user. Two cases need memory on the
owner, because a stale attempt of a message can be processed after a later attempt succeeded:
a ForkRequest for a fork already deleted (it would re-add the fork and leak the RRef) and a
ForkRequest, RemoteCall or to_here for an RRef already deleted (it would resurrect it, or re-run
the function). The owner keeps tombstones of deleted forks (per live record) and of deleted
RRefs (for ``tombstone_ttl`` seconds, which must exceed one attempt's deadline). Messages that
overtake the creation of an RRef minted elsewhere create it AWAITING_CREATION; an unknown RRef
minted by the owner itself was deleted.

What the agent must do
----------------------
- Call ``fork`` before a payload leaves, and embed the returned ``RRefForkData``; deliver
  payloads (user calls and replies) at most once, as gRPC does for calls never retried. Each
  received fork is its own user: release every handle ``receive_fork`` returned.
- Send every returned message, retrying ForkRequest, ChildAck, RRefDelete and RemoteCall until
  answered (each handler is idempotent). ``abandon_fork`` / ``abandon_remote`` only on certain
  non-delivery; when unsure keep retrying, or accept a leak (never an early delete).
- Run a function that received RRefs from ``when_confirmed``; answer a to_here from
  ``owner_value``; fill the value slot of a created OwnerRRef exactly once.

Thread safety: one lock per worker guards all tables; callbacks (confirmation, deletion) run
after it is released, in the thread that delivered the event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from .errors import RRefProtocolError, UnknownRRefError
from .ids import ForkId, IdGenerator, RRefId
from .messages import (
    ChildAck,
    ControlMessage,
    Effects,
    ForkAccepted,
    ForkRequest,
    RemoteAck,
    RRefDelete,
    RRefForkData,
)
from .owner import OwnerRecord, OwnerTable
from .user import UserRecord, UserState, UserTable
from .value import ValueSlot
from .views import OwnerLeak, PendingReport, RemoteCallAccepted, RRefDebugInfo, RRefHandle

__all__ = [
    "RRefProtocol",
    "RRefHandle",
    "RemoteCallAccepted",
    "RRefDebugInfo",
    "PendingReport",
    "OwnerLeak",
]

_log = logging.getLogger(__name__)


class RRefProtocol:
    """The RRef protocol state of one worker.

    Every method that changes state returns the control messages the agent must send (each
    retried until acknowledged; duplicates are harmless).

    Args:
        worker_id: this worker's id (rank).
        tombstone_ttl: seconds the owner remembers deleted RRefs and forks (None: forever);
            must exceed the deadline of one attempt of a control message or RemoteCall.
        clock: monotonic clock in seconds, for tombstones.
        on_owner_deleted: called with the RRefId after an OwnerRRef is deleted.

    Example:
        >>> owner, user = RRefProtocol(0), RRefProtocol(1)
        >>> h = owner.create_owner()
        >>> data = owner.fork(h, dest=1)
        >>> uh, msgs = user.receive_fork(data)
        >>> user.is_confirmed(uh), msgs
        (True, [])
    """

    def __init__(
        self,
        worker_id: int,
        *,
        tombstone_ttl: float | None = 120.0,
        clock: Callable[[], float] = time.monotonic,
        on_owner_deleted: Callable[[RRefId], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._ids = IdGenerator(worker_id)
        self._owner = OwnerTable(worker_id, self._ids, tombstone_ttl, clock)
        self._users = UserTable(worker_id)
        self._on_owner_deleted = on_owner_deleted

    # -- creation ----------------------------------------------------------------------------

    def create_owner(self, type_name: str = "") -> RRefHandle:
        """Mint a local OwnerRRef (``RRef(value)``, ``remote()`` to self) holding one local
        reference; fill ``handle.value`` and ``release`` the handle when its object dies."""
        with self._lock:
            return self._owner_handle(self._owner.create_local(type_name))

    def create_remote(self, owner_id: int, type_name: str = "") -> RRefHandle:
        """Caller side of ``remote(owner_id, ...)``: mint RRefId and ForkId for the RemoteCall.

        Returns a PENDING user handle (its ids go in the CallHeader); the owner's RemoteAck
        confirms it. With ``owner_id`` equal to this worker, same as ``create_owner``.
        """
        if owner_id == self.worker_id:
            return self.create_owner(type_name)
        with self._lock:
            rref_id, fork_id = self._ids.next_id(), self._ids.next_id()
            rec = self._users.create_remote(owner_id, rref_id, fork_id, type_name)
            return _user_handle(rec)

    def abandon_remote(self, handle: RRefHandle, error: BaseException) -> None:
        """The RemoteCall for ``handle`` certainly never reached the owner (it failed before
        sending): forget the caller's user; waiting ``when_confirmed`` callbacks get ``error``.

        Only before the handle was forked. When delivery is uncertain, retry the RemoteCall
        instead: it is idempotent on its RRefId.

        Raises:
            RRefProtocolError: not an unconfirmed remote() result, or already forked.
        """
        if handle.fork_id is None:
            raise RRefProtocolError("an OwnerRRef has no RemoteCall to abandon")
        fx = Effects()
        with self._lock:
            self._users.abandon_remote(handle.fork_id, error, fx)
        self._after(fx)

    def accept_remote_call(
        self, rref_id: RRefId, fork_id: ForkId, caller_id: int, type_name: str = ""
    ) -> RemoteCallAccepted:
        """Owner side of a RemoteCall (first delivery, retry or duplicate).

        Run the function only when ``run`` is True and fill ``handle.value`` with its result or
        error; always answer with ``messages`` (the RemoteAck).
        """
        fx = Effects()
        with self._lock:
            rec, run = self._owner.accept_remote_call(rref_id, fork_id, caller_id, type_name, fx)
            handle = None if rec is None else self._owner_handle(rec)
        self._after(fx)
        return RemoteCallAccepted(handle, run, fx.messages)

    # -- forks -------------------------------------------------------------------------------

    def fork(self, handle: RRefHandle, dest: int) -> RRefForkData:
        """Fork ``handle`` for a payload to worker ``dest``; call before sending the payload.

        On the owner the new fork is recorded as known; on a user it becomes a pending child
        (G2). Embed the returned data in the payload.

        Raises:
            RRefProtocolError: the handle was released, or its OwnerRRef is gone.
        """
        with self._lock:
            if handle.is_owner:
                return self._owner.fork(handle.rref_id, dest)
            assert handle.fork_id is not None
            return self._users.fork(handle.fork_id, dest, self._ids.next_id())

    def receive_fork(self, data: RRefForkData) -> tuple[RRefHandle, list[ControlMessage]]:
        """Become the fork a payload carried: returns the handle and the messages to send.

        On the owner the handle is the OwnerRRef with one more local reference (release it
        when the object dies). On a user, call ``when_confirmed`` before running user code.

        Raises:
            UnknownRRefError: this worker owns the RRef and has already deleted it.
        """
        fx = Effects()
        with self._lock:
            if data.owner_id == self.worker_id:
                handle = self._owner_handle(self._owner.receive_own_fork(data, fx))
            else:
                handle = _user_handle(self._users.receive(data, fx))
        self._after(fx)
        return handle, fx.messages

    def abandon_fork(self, data: RRefForkData) -> list[ControlMessage]:
        """The payload carrying ``data`` was certainly not delivered: drop the parent's hold.

        Only on certain non-delivery; when unsure, do nothing (a leak, never a premature
        delete).
        """
        fx = Effects()
        with self._lock:
            if data.owner_id == self.worker_id:
                self._owner.abandon_fork(data, fx)
            else:
                self._users.abandon_fork(data, fx)
        self._after(fx)
        return fx.messages

    # -- control messages --------------------------------------------------------------------

    def handle(self, msg: ControlMessage) -> list[ControlMessage]:
        """Process a received control message (idempotent); return the messages to send.

        A ForkRequest yields its ForkAccepted response among the returned messages.
        """
        if msg.dest != self.worker_id:
            raise RRefProtocolError(f"{msg!r} delivered to worker {self.worker_id}")
        fx = Effects()
        with self._lock:
            if isinstance(msg, ForkRequest):
                self._owner.handle_fork_request(msg, fx)
            elif isinstance(msg, RRefDelete):
                self._owner.handle_delete(msg, fx)
            elif isinstance(msg, ForkAccepted):
                self._users.handle_fork_accepted(msg, fx)
            elif isinstance(msg, ChildAck):
                self._users.handle_child_ack(msg, fx)
            elif isinstance(msg, RemoteAck):
                self._users.handle_remote_ack(msg, fx)
            else:
                raise RRefProtocolError(f"not an RRef control message: {msg!r}")
        self._after(fx)
        return fx.messages

    # -- references --------------------------------------------------------------------------

    def acquire(self, handle: RRefHandle) -> None:
        """Owner only: local code took another reference to the OwnerRRef."""
        if not handle.is_owner:
            raise RRefProtocolError("acquire is for OwnerRRefs; each UserRRef is one fork")
        with self._lock:
            self._owner.acquire(handle.rref_id)

    def release(self, handle: RRefHandle) -> list[ControlMessage]:
        """Local code dropped ``handle`` (GC or explicit): G1 on a user, one reference less on
        the owner. Idempotent for users."""
        fx = Effects()
        with self._lock:
            if handle.is_owner:
                self._owner.release(handle.rref_id, fx)
            else:
                assert handle.fork_id is not None
                self._users.release(handle.fork_id, fx)
        self._after(fx)
        return fx.messages

    def owner_value(self, rref_id: RRefId) -> ValueSlot:
        """The value slot a to_here (FetchRRef) waits on; may create the record if the fetch
        overtook the RemoteCall.

        Raises:
            UnknownRRefError: this worker owned the RRef and deleted it, or never owned it.
        """
        with self._lock:
            rec = self._owner.lookup(rref_id, create=True)
            if rec is None:
                raise UnknownRRefError(f"worker {self.worker_id} owns no RRef {rref_id}")
            return rec.value

    # -- confirmation ------------------------------------------------------------------------

    def is_confirmed(self, handle: RRefHandle) -> bool:
        """Whether the owner knows this reference (always True on the owner)."""
        if handle.is_owner:
            return True
        with self._lock:
            return self._user(handle).state is UserState.CONFIRMED

    def when_confirmed(
        self, handles: Iterable[RRefHandle], callback: Callable[[BaseException | None], None]
    ) -> None:
        """Call ``callback(None)`` once every handle is confirmed by its owner (at once if they
        are), or ``callback(error)`` if an owner disowned one. Run RRef-taking user functions
        from this callback."""
        waiting: list[UserRecord] = []
        error: BaseException | None = None
        with self._lock:
            for handle in handles:
                if handle.is_owner:
                    continue
                rec = self._user(handle)
                if rec.state is UserState.PENDING:
                    waiting.append(rec)
                elif rec.error is not None and error is None:
                    error = rec.error
            if waiting:
                waiter = _Waiter(len(waiting), error, callback)
                for rec in waiting:
                    rec.waiters.append(waiter.settled)
                return
        callback(error)

    # -- inspection and shutdown -------------------------------------------------------------

    def debug_info(self) -> RRefDebugInfo:
        """Counters for ``get_debug_info()``."""
        with self._lock:
            owners = self._owner.records.values()
            users = self._users.users.values()
            return RRefDebugInfo(
                num_owner_rrefs=len(self._owner.records),
                num_shared_owner_rrefs=sum(bool(o.forks) for o in owners),
                num_pending_users=sum(u.state is UserState.PENDING for u in users),
                num_pending_children=len(self._users.children),
                num_forks=sum(len(o.forks) for o in owners),
                num_users=len(self._users.users),
                num_tombstones=len(self._owner.deleted) + len(self._owner.early_deletes),
            )

    def pending(self) -> PendingReport:
        """Confirmations, child acks and deferred deletes still outstanding on this worker."""
        with self._lock:
            users = sorted(self._users.users.values(), key=lambda u: u.fork_id)
            return PendingReport(
                pending_users=tuple(
                    (u.rref_id, u.fork_id) for u in users if u.state is UserState.PENDING
                ),
                pending_children=tuple(
                    sorted(self._users.children.values(), key=lambda c: c.fork_id)
                ),
                deferred_deletes=tuple((u.rref_id, u.fork_id) for u in users if u.dropped),
            )

    def leaked_owner_rrefs(self) -> list[OwnerLeak]:
        """OwnerRRefs still held (by a fork or local code): the shutdown leak check."""
        with self._lock:
            return [
                OwnerLeak(r.rref_id, r.state.value, tuple(sorted(r.forks)), r.local_refs)
                for r in sorted(self._owner.records.values(), key=lambda r: r.rref_id)
            ]

    def release_all_users(self) -> list[ControlMessage]:
        """Shutdown: drop every UserRRef still held here (G1 for each, deferred as usual)."""
        fx = Effects()
        with self._lock:
            for fork_id in list(self._users.users):
                self._users.release(fork_id, fx)
        self._after(fx)
        return fx.messages

    def expire_tombstones(self) -> None:
        """Forget tombstones older than ``tombstone_ttl`` (also done as new ones are added)."""
        with self._lock:
            self._owner.expire_tombstones()

    def snapshot(self) -> tuple[object, ...]:
        """A hashable, deterministic picture of the whole state (tests, model checking)."""
        with self._lock:
            owners = tuple(
                (
                    r.rref_id,
                    r.state.value,
                    tuple(sorted(r.forks)),
                    r.local_refs,
                    tuple(sorted(r.deleted_forks or ())),
                    r.value.done(),
                )
                for r in sorted(self._owner.records.values(), key=lambda r: r.rref_id)
            )
            users = tuple(
                (u.fork_id, u.rref_id, u.state.value, u.dropped, u.pending_children)
                for u in sorted(self._users.users.values(), key=lambda u: u.fork_id)
            )
            children = tuple(sorted(self._users.children.values(), key=lambda c: c.fork_id))
            tombs = (tuple(sorted(self._owner.deleted)), tuple(sorted(self._owner.early_deletes)))
            return (owners, users, children, tombs)

    # -- helpers -----------------------------------------------------------------------------

    def _owner_handle(self, rec: OwnerRecord) -> RRefHandle:
        return RRefHandle(rec.rref_id, self.worker_id, None, rec.type_name, rec.value)

    def _user(self, handle: RRefHandle) -> UserRecord:
        assert handle.fork_id is not None
        rec = self._users.users.get(handle.fork_id)
        if rec is None:
            raise RRefProtocolError(f"worker {self.worker_id} holds no fork {handle.fork_id}")
        return rec

    def _after(self, fx: Effects) -> None:
        # Outside the lock. A failing callback must not lose the messages of this event.
        for rref_id in fx.deleted:
            if self._on_owner_deleted is not None:
                _call_logged(self._on_owner_deleted, rref_id)
        for fn in fx.callbacks:
            _call_logged(fn)


class _Waiter:
    """Counts down the PENDING users one ``when_confirmed`` call waits for."""

    def __init__(
        self, remaining: int, error: BaseException | None, callback: Callable[..., None]
    ) -> None:
        self._lock = threading.Lock()
        self._remaining = remaining
        self._error = error
        self._callback = callback

    def settled(self, rec: UserRecord) -> None:
        with self._lock:
            self._remaining -= 1
            if rec.error is not None and self._error is None:
                self._error = rec.error
            if self._remaining:
                return
        self._callback(self._error)


def _user_handle(rec: UserRecord) -> RRefHandle:
    return RRefHandle(rec.rref_id, rec.owner_id, rec.fork_id, rec.type_name)


def _call_logged(fn: Callable[..., None], *args: object) -> None:
    try:
        fn(*args)
    except Exception:
        _log.exception("RRef protocol callback %r failed", fn)
