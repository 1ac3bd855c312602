"""Duplicates and stale retries of every message kind are harmless, at any later point."""

from __future__ import annotations

from gradwire._runtime.rref.ids import GloballyUniqueId as G
from gradwire._runtime.rref.messages import (
    ChildAck,
    ForkAccepted,
    ForkRequest,
    RemoteAck,
    RRefDelete,
)
from gradwire._runtime.rref.protocol import RRefProtocol

B, A, C = 0, 1, 2


def setup_user_to_user():
    """A created R on B, forked it to C; every message so far delivered once."""
    deleted: list[object] = []
    b, a, c = (RRefProtocol(w, on_owner_deleted=deleted.append) for w in (B, A, C))
    h = a.create_remote(B)
    remote_ack = b.accept_remote_call(h.rref_id, h.fork_id, A).messages[0]
    a.handle(remote_ack)
    uh, (fork_request,) = c.receive_fork(a.fork(h, dest=C))
    (accepted,) = b.handle(fork_request)
    (child_ack,) = c.handle(accepted)
    return b, a, c, h, uh, deleted, remote_ack, fork_request, accepted, child_ack


def states(*protos: RRefProtocol) -> tuple[object, ...]:
    return tuple(p.snapshot() for p in protos)


def test_fork_request_duplicate_is_answered_again_without_change() -> None:
    b, a, c, *_, fork_request, accepted, _ = setup_user_to_user()
    before = states(b)
    assert b.handle(fork_request) == [accepted]
    assert states(b) == before


def test_stale_fork_request_after_the_fork_was_deleted_does_not_resurrect_it() -> None:
    b, a, c, h, uh, deleted, _, fork_request, _, child_ack = setup_user_to_user()
    a.handle(child_ack)
    (delete_c,) = c.release(uh)
    b.handle(delete_c)
    assert b.debug_info().num_forks == 1  # A's own fork
    assert b.handle(fork_request) == [ForkAccepted(C, G(A, 0), G(A, 2), known=True)]
    assert b.debug_info().num_forks == 1  # the tombstone kept C's fork out
    (delete_a,) = a.release(h)
    b.handle(delete_a)
    assert deleted == [G(A, 0)]


def test_stale_fork_request_after_the_rref_was_deleted_does_not_resurrect_it() -> None:
    b, a, c, h, uh, deleted, _, fork_request, _, child_ack = setup_user_to_user()
    a.handle(child_ack)
    for msg in c.release(uh) + a.release(h):
        b.handle(msg)
    assert deleted == [G(A, 0)]
    assert b.handle(fork_request) == [ForkAccepted(C, G(A, 0), G(A, 2), known=False)]
    assert b.debug_info().num_owner_rrefs == 0
    # The stale answer reaches nobody pending: ignored.
    assert c.handle(ForkAccepted(C, G(A, 0), G(A, 2), known=False)) == []


def test_fork_accepted_duplicate_sends_no_second_child_ack() -> None:
    b, a, c, *_, accepted, _ = setup_user_to_user()
    before = states(c)
    assert c.handle(accepted) == []
    assert states(c) == before


def test_child_ack_duplicate_before_and_after_the_parent_is_gone() -> None:
    b, a, c, h, *_, child_ack = setup_user_to_user()
    assert a.handle(child_ack) == []
    before = states(a)
    assert a.handle(child_ack) == []
    assert states(a) == before
    (delete,) = a.release(h)
    assert a.handle(child_ack) == []  # parent deleted: still nothing
    assert delete == RRefDelete(B, G(A, 0), G(A, 1), A)


def test_rref_delete_duplicate_and_after_deletion() -> None:
    b, a, c, h, uh, deleted, *_, child_ack = setup_user_to_user()
    a.handle(child_ack)
    (delete_a,) = a.release(h)
    b.handle(delete_a)
    before = states(b)
    assert b.handle(delete_a) == []
    assert states(b) == before
    (delete_c,) = c.release(uh)
    b.handle(delete_c)
    assert deleted == [G(A, 0)]
    b.handle(delete_c)
    b.handle(delete_a)
    assert deleted == [G(A, 0)]  # deleted once, never re-created
    assert b.debug_info().num_owner_rrefs == 0


def test_remote_ack_duplicate() -> None:
    b, a, c, h, *_, remote_ack, _, _, _ = setup_user_to_user()
    before = states(a)
    assert a.handle(remote_ack) == []
    assert states(a) == before


def test_remote_call_retry_runs_the_function_once() -> None:
    b = RRefProtocol(B)
    a = RRefProtocol(A)
    h = a.create_remote(B)
    first = b.accept_remote_call(h.rref_id, h.fork_id, A)
    again = b.accept_remote_call(h.rref_id, h.fork_id, A)
    assert first.run and not again.run
    assert again.messages == first.messages == [RemoteAck(A, G(A, 0), G(A, 1))]
    for msg in a.release(h) + a.handle(first.messages[0]):
        b.handle(msg)
    late = b.accept_remote_call(h.rref_id, h.fork_id, A)  # after deletion
    assert late.handle is None and not late.run and late.messages == first.messages
    assert b.debug_info().num_owner_rrefs == 0


def test_payload_delivered_twice_is_one_user() -> None:
    b, c = RRefProtocol(B), RRefProtocol(C)
    h = b.create_owner()
    data = b.fork(h, dest=C)
    first, _ = c.receive_fork(data)
    second, msgs = c.receive_fork(data)
    assert first == second and msgs == []
    assert c.debug_info().num_users == 1


def test_rref_delete_overtaking_the_remote_call() -> None:
    """Not sent by this protocol (a user deletes only once confirmed) but survivable: the late
    creation then finds nothing holding the RRef and deletes it at once."""
    deleted: list[object] = []
    b = RRefProtocol(B, on_owner_deleted=deleted.append)
    b.handle(RRefDelete(B, G(A, 0), G(A, 1), A))
    assert b.debug_info().num_owner_rrefs == 0
    accepted = b.accept_remote_call(G(A, 0), G(A, 1), A)
    assert accepted.run  # the function still runs once; its value is simply dropped
    assert deleted == [G(A, 0)]


def test_rref_delete_overtaking_the_fork_request() -> None:
    b, a, c, h, *_ = setup_user_to_user()
    late = ForkRequest(B, G(A, 0), G(A, 8), child_id=C, parent_id=A)
    b.handle(RRefDelete(B, G(A, 0), G(A, 8), C))
    b.handle(late)
    assert G(A, 8) not in b.leaked_owner_rrefs()[0].forks


def test_acks_for_unknown_forks_are_ignored() -> None:
    a = RRefProtocol(A)
    assert a.handle(ChildAck(A, G(B, 0), G(B, 1), C)) == []
    assert a.handle(ForkAccepted(A, G(B, 0), G(B, 1))) == []
    assert a.handle(RemoteAck(A, G(A, 0), G(A, 1))) == []
    assert a.snapshot() == RRefProtocol(A).snapshot()


def test_release_of_a_user_twice_is_harmless() -> None:
    b, c = RRefProtocol(B), RRefProtocol(C)
    uh, _ = c.receive_fork(b.fork(b.create_owner(), dest=C))
    assert len(c.release(uh)) == 1
    assert c.release(uh) == []
