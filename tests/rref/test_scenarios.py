"""The message flows of the seed's scenarios, exactly, on an in-order network.

Worker 0 is the owner B, worker 1 the user A, worker 2 the user C. Ids are deterministic: each
worker counts from 1, and remote() mints the RRefId before the ForkId.
"""

from __future__ import annotations

from gradwire._runtime.rref.ids import GloballyUniqueId as G
from gradwire._runtime.rref.messages import (
    ChildAck,
    ForkAccepted,
    ForkRequest,
    RemoteAck,
    RRefDelete,
    RRefForkData,
)
from gradwire._runtime.rref.protocol import RRefProtocol

B, A, C = 0, 1, 2


def workers(n: int = 3):
    deleted: list[object] = []
    protos = [RRefProtocol(w, on_owner_deleted=deleted.append) for w in range(n)]
    return protos, deleted


def test_remote_creation_user_shares_with_owner_as_return_value() -> None:
    (b, a, _), deleted = workers()
    h = a.create_remote(B)
    assert (h.rref_id, h.fork_id, h.owner_id) == (G(A, 0), G(A, 1), B)
    assert not a.is_confirmed(h)

    accepted = b.accept_remote_call(h.rref_id, h.fork_id, caller_id=A)
    assert accepted.run and accepted.handle is not None
    assert accepted.messages == [RemoteAck(A, G(A, 0), G(A, 1))]
    accepted.handle.value.set_value("sum")
    assert b.owner_value(h.rref_id).wait(0) == "sum"  # to_here

    assert a.handle(accepted.messages[0]) == []
    assert a.is_confirmed(h)
    assert a.release(h) == [RRefDelete(B, G(A, 0), G(A, 1), user_id=A)]
    assert b.handle(RRefDelete(B, G(A, 0), G(A, 1), A)) == []
    assert deleted == [G(A, 0)]
    assert b.debug_info().num_owner_rrefs == 0


def test_remote_creation_released_before_the_ack_defers_the_delete() -> None:
    (b, a, _), deleted = workers()
    h = a.create_remote(B)
    assert a.release(h) == []  # not confirmed: the owner may not know the fork yet (G1)
    assert a.pending().deferred_deletes == ((G(A, 0), G(A, 1)),)
    ack = b.accept_remote_call(h.rref_id, h.fork_id, A).messages[0]
    assert a.handle(ack) == [RRefDelete(B, G(A, 0), G(A, 1), A)]
    b.handle(RRefDelete(B, G(A, 0), G(A, 1), A))
    assert deleted == [G(A, 0)]


def test_user_shares_with_owner_as_argument() -> None:
    (b, a, _), deleted = workers()
    h = a.create_remote(B)
    ack = b.accept_remote_call(h.rref_id, h.fork_id, A).messages
    a.handle(ack[0])

    data = a.fork(h, dest=B)
    assert data == RRefForkData(B, G(A, 0), G(A, 2), parent_id=A)
    assert a.debug_info().num_pending_children == 1
    assert a.release(h) == []  # held for the child (G2)

    owner_h, msgs = b.receive_fork(data)
    assert owner_h.is_owner and b.is_confirmed(owner_h)
    assert msgs == [ChildAck(A, G(A, 0), G(A, 2), child_id=B)]
    assert a.handle(msgs[0]) == [RRefDelete(B, G(A, 0), G(A, 1), A)]
    assert b.handle(RRefDelete(B, G(A, 0), G(A, 1), A)) == []
    assert deleted == []  # the function on B still holds the OwnerRRef
    assert b.release(owner_h) == []
    assert deleted == [G(A, 0)]


def test_argument_reaching_the_owner_before_the_remote_call() -> None:
    (b, a, _), deleted = workers()
    h = a.create_remote(B)
    owner_h, msgs = b.receive_fork(a.fork(h, dest=B))
    assert b.leaked_owner_rrefs()[0].state == "awaiting_creation"
    assert msgs == [ChildAck(A, G(A, 0), G(A, 2), B)]
    a.handle(msgs[0])
    b.release(owner_h)
    assert deleted == []  # the creator's fork is still unknown: never delete now
    accepted = b.accept_remote_call(h.rref_id, h.fork_id, A)
    assert accepted.run and accepted.handle is not None
    assert accepted.handle.value is owner_h.value  # one OwnerRRef, one value slot
    assert a.handle(accepted.messages[0]) == []
    assert a.release(h) == [RRefDelete(B, G(A, 0), G(A, 1), A)]
    b.handle(RRefDelete(B, G(A, 0), G(A, 1), A))
    assert deleted == [G(A, 0)]


def test_owner_shares_with_user() -> None:
    (b, _, c), deleted = workers()
    h = b.create_owner()
    assert h.rref_id == G(B, 0) and h.is_owner
    data = b.fork(h, dest=C)
    assert data == RRefForkData(B, G(B, 0), G(B, 1), parent_id=B)
    assert b.release(h) == []  # the known fork keeps it alive
    assert deleted == []

    uh, msgs = c.receive_fork(data)
    assert msgs == [] and c.is_confirmed(uh)  # no control message at all
    assert c.release(uh) == [RRefDelete(B, G(B, 0), G(B, 1), C)]
    assert b.handle(RRefDelete(B, G(B, 0), G(B, 1), C)) == []
    assert deleted == [G(B, 0)]


def test_user_shares_with_user() -> None:
    (b, a, c), deleted = workers()
    h = a.create_remote(B)
    a.handle(b.accept_remote_call(h.rref_id, h.fork_id, A).messages[0])

    data = a.fork(h, dest=C)
    assert data == RRefForkData(B, G(A, 0), G(A, 2), parent_id=A)
    assert a.release(h) == []  # G2: held until C's ChildAck

    uh, msgs = c.receive_fork(data)
    assert not c.is_confirmed(uh)
    assert msgs == [ForkRequest(B, G(A, 0), G(A, 2), child_id=C, parent_id=A)]
    assert b.handle(msgs[0]) == [ForkAccepted(C, G(A, 0), G(A, 2), known=True)]
    assert b.debug_info().num_forks == 2

    ran = []
    c.when_confirmed([uh], lambda err: ran.append((err, c.is_confirmed(uh))))
    assert ran == []
    assert c.handle(ForkAccepted(C, G(A, 0), G(A, 2))) == [ChildAck(A, G(A, 0), G(A, 2), C)]
    assert ran == [(None, True)]  # the function runs only now, confirmed

    assert a.handle(ChildAck(A, G(A, 0), G(A, 2), C)) == [RRefDelete(B, G(A, 0), G(A, 1), A)]
    assert b.handle(RRefDelete(B, G(A, 0), G(A, 1), A)) == []
    assert deleted == []  # C's fork is still known
    assert c.release(uh) == [RRefDelete(B, G(A, 0), G(A, 2), C)]
    b.handle(RRefDelete(B, G(A, 0), G(A, 2), C))
    assert deleted == [G(A, 0)]


def test_child_dropped_before_confirmation_acks_then_deletes() -> None:
    (b, a, c), deleted = workers()
    h = a.create_remote(B)
    uh, msgs = c.receive_fork(a.fork(h, dest=C))
    assert c.release(uh) == []  # pending: defer the delete
    accepted = b.handle(msgs[0])
    assert c.handle(accepted[0]) == [
        ChildAck(A, G(A, 0), G(A, 2), C),
        RRefDelete(B, G(A, 0), G(A, 2), C),
    ]


def test_forwarding_along_a_chain_of_eight_hops() -> None:
    """Each hop receives the RRef, forwards it to the next worker and drops its own, with every
    control message held back until the end: only the ChildAcks release the chain."""
    protos, deleted = workers(5)
    hops = [1, 2, 3, 4, 1, 2, 3, 4, 2]  # 8 hops after the creator, worker 1
    h = protos[1].create_remote(B)
    inbox = list(protos[B].accept_remote_call(h.rref_id, h.fork_id, 1).messages)
    handle = h
    for here, there in zip(hops, hops[1:]):
        data = protos[here].fork(handle, dest=there)
        inbox += protos[here].release(handle)
        handle, msgs = protos[there].receive_fork(data)
        inbox += msgs
    assert sum(p.debug_info().num_pending_children for p in protos) == 8
    assert sum(p.debug_info().num_pending_users for p in protos) == 9  # creator + 8 children
    assert deleted == []

    while inbox:  # deliver in order until quiet
        msg = inbox.pop(0)
        inbox += protos[msg.dest].handle(msg)
        assert deleted == []
    assert sum(p.debug_info().num_pending_children for p in protos) == 0
    assert protos[B].debug_info().num_forks == 1  # only the last hop's fork is left
    last = protos[hops[-1]]
    assert last.is_confirmed(handle)
    (delete,) = last.release(handle)
    protos[B].handle(delete)
    assert deleted == [h.rref_id]
    for p in protos:
        assert p.pending().empty and p.debug_info().num_users == 0


def test_remote_to_self_is_a_local_owner_rref() -> None:
    (b, _, _), deleted = workers()
    h = b.create_remote(B)
    assert h.is_owner and b.is_confirmed(h)
    h.value.set_value(1)
    assert b.release(h) == []
    assert deleted == [G(B, 0)]


def test_owner_sends_its_rref_to_itself() -> None:
    (b, _, _), deleted = workers()
    h = b.create_owner()
    data = b.fork(h, dest=B)
    b.release(h)
    assert deleted == []  # the fork in flight keeps it
    again, msgs = b.receive_fork(data)
    assert msgs == [] and again.rref_id == h.rref_id
    assert b.debug_info().num_forks == 0
    b.release(again)
    assert deleted == [G(B, 0)]


def test_user_sends_to_itself() -> None:
    (b, a, _), deleted = workers()
    h = a.create_remote(B)
    a.handle(b.accept_remote_call(h.rref_id, h.fork_id, A).messages[0])
    h2, msgs = a.receive_fork(a.fork(h, dest=A))
    (accepted,) = b.handle(msgs[0])
    assert a.handle(accepted) == [ChildAck(A, G(A, 0), G(A, 2), A)]
    assert a.handle(ChildAck(A, G(A, 0), G(A, 2), A)) == []
    deletes = a.release(h) + a.release(h2)
    for msg in deletes:
        b.handle(msg)
    assert deleted == [G(A, 0)]
