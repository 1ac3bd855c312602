"""The state machine's building blocks and its inspection, shutdown and error surface."""

from __future__ import annotations

import random
import threading

import pytest
from gradwire._runtime.rref.errors import RRefProtocolError, UnknownRRefError
from gradwire._runtime.rref.ids import GloballyUniqueId as G
from gradwire._runtime.rref.ids import IdGenerator
from gradwire._runtime.rref.messages import ForkRequest, MessageKind, RRefDelete
from gradwire._runtime.rref.protocol import RRefProtocol
from gradwire._runtime.rref.value import ValueSlot
from gradwire._runtime.util.tombstones import Tombstones

B, A, C = 0, 1, 2


def test_ids_round_trip_through_proto_fields_and_hash() -> None:
    gid = G(3, 7)
    assert G.from_fields(*gid.to_fields()) == gid
    assert {gid: 1}[G(3, 7)] == 1 and str(gid) == "3:7"
    ids = IdGenerator(3)
    assert [ids.next_id() for _ in range(2)] == [G(3, 0), G(3, 1)]


def test_id_generator_is_unique_across_threads() -> None:
    ids = IdGenerator(0)
    out: list[G] = []
    threads = [
        threading.Thread(target=lambda: out.extend(ids.next_id() for _ in range(500)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 2000


def test_message_kinds_name_the_watch_stream_kinds() -> None:
    assert ForkRequest.kind is MessageKind.FORK_REQUEST
    assert RRefDelete(0, G(1, 1), G(1, 2), 1).kind.value == "RRefDelete"


def test_value_slot_waits_and_raises() -> None:
    slot = ValueSlot()
    with pytest.raises(TimeoutError):
        slot.wait(0.01)
    seen = []
    slot.add_done_callback(lambda s: seen.append(s.wait(0)))
    threading.Timer(0.01, slot.set_value, ("v",)).start()
    assert slot.wait(5) == "v" and seen == ["v"]
    with pytest.raises(RRefProtocolError):
        slot.set_value("again")
    failed = ValueSlot()
    failed.set_error(ZeroDivisionError("creation failed"))
    with pytest.raises(ZeroDivisionError):
        failed.wait()


def test_tombstones_expire_after_their_ttl() -> None:
    now = [0.0]
    tombs: Tombstones[int] = Tombstones(10.0, lambda: now[0])
    tombs.add(1)
    now[0] = 5.0
    tombs.add(2)
    assert 1 in tombs and 2 in tombs
    now[0] = 12.0
    tombs.prune()
    assert 1 not in tombs and 2 in tombs and len(tombs) == 1


def test_owner_forgets_tombstones_after_the_ttl() -> None:
    now = [0.0]
    b = RRefProtocol(B, tombstone_ttl=30.0, clock=lambda: now[0])
    a = RRefProtocol(A)
    for _ in range(100):
        h = a.create_remote(B)
        accepted = b.accept_remote_call(h.rref_id, h.fork_id, A)
        for msg in a.handle(accepted.messages[0]) + a.release(h):
            b.handle(msg)
    assert b.debug_info().num_tombstones == 100
    now[0] = 31.0
    b.expire_tombstones()
    assert b.debug_info() == RRefProtocol(B).debug_info()


def test_debug_info_pending_and_leak_check() -> None:
    b, a, c = RRefProtocol(B), RRefProtocol(A), RRefProtocol(C)
    h = a.create_remote(B)
    user, (req,) = c.receive_fork(a.fork(h, dest=C))
    b.handle(req)
    owned = b.create_owner()
    a.release(h)

    info = a.debug_info()
    assert (info.num_pending_users, info.num_pending_children, info.num_users) == (1, 1, 1)
    report = a.pending()
    assert report.pending_users == ((h.rref_id, h.fork_id),)
    assert report.pending_children[0].child_id == C
    assert report.deferred_deletes == ((h.rref_id, h.fork_id),)
    assert not report.empty

    binfo = b.debug_info()
    assert (binfo.num_owner_rrefs, binfo.num_forks) == (2, 1)
    leaks = b.leaked_owner_rrefs()
    assert [(x.rref_id, x.state, x.forks, x.local_refs) for x in leaks] == [
        (owned.rref_id, "live", (), 1),
        (h.rref_id, "awaiting_creation", (user.fork_id,), 0),
    ]


def test_release_all_users_at_shutdown() -> None:
    b, c = RRefProtocol(B), RRefProtocol(C)
    owned = [b.create_owner() for _ in range(3)]
    users = [c.receive_fork(b.fork(h, dest=C))[0] for h in owned]
    for h in owned:
        b.release(h)
    msgs = c.release_all_users()
    assert sorted(m.fork_id for m in msgs) == sorted(u.fork_id for u in users)
    for m in msgs:
        b.handle(m)
    assert b.leaked_owner_rrefs() == [] and c.pending().empty


def test_misuse_is_reported() -> None:
    b, a = RRefProtocol(B), RRefProtocol(A)
    owned = b.create_owner()
    b.release(owned)
    with pytest.raises(UnknownRRefError):
        b.fork(owned, dest=A)
    with pytest.raises(RRefProtocolError):
        b.release(owned)
    with pytest.raises(UnknownRRefError):
        b.owner_value(owned.rref_id)
    with pytest.raises(UnknownRRefError):
        b.owner_value(G(B, 99))  # minted here, unknown: deleted or never existed
    with pytest.raises(RRefProtocolError):
        a.handle(RRefDelete(B, G(1, 1), G(1, 2), 1))  # not addressed to worker 1
    user = a.create_remote(B)
    with pytest.raises(RRefProtocolError):
        a.acquire(user)
    a.release(user)
    with pytest.raises(RRefProtocolError):
        a.fork(user, dest=B)  # released (its delete is merely deferred)


def test_acquire_adds_a_local_reference() -> None:
    deleted: list[object] = []
    b = RRefProtocol(B, on_owner_deleted=deleted.append)
    h = b.create_owner()
    b.acquire(h)
    b.release(h)
    assert deleted == []
    b.release(h)
    assert deleted == [h.rref_id]


def test_concurrent_agent_threads_keep_the_tables_consistent() -> None:
    """Many threads fork, receive, confirm and release at once, as an agent's would."""
    deleted: list[object] = []
    b = RRefProtocol(B, on_owner_deleted=deleted.append)
    users = [RRefProtocol(w) for w in (1, 2, 3)]
    protos = {0: b, **{p.worker_id: p for p in users}}
    roots = [b.create_owner() for _ in range(20)]

    def deliver_all(msgs):
        while msgs:
            msg = msgs.pop()
            msgs.extend(protos[msg.dest].handle(msg))

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for root in roots:
            src = rng.choice(users)
            handle, msgs = src.receive_fork(b.fork(root, dest=src.worker_id))
            deliver_all(msgs)
            dest = rng.choice(users)
            child, msgs = dest.receive_fork(src.fork(handle, dest.worker_id))
            deliver_all(msgs + src.release(handle))
            deliver_all(dest.release(child))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for root in roots:
        b.release(root)
    assert sorted(deleted) == sorted(r.rref_id for r in roots)
    for p in protos.values():
        assert p.pending().empty and p.leaked_owner_rrefs() == []
        assert p.debug_info().num_users == 0


def test_abandon_fork_releases_the_parent_hold() -> None:
    deleted: list[object] = []
    b = RRefProtocol(B, on_owner_deleted=deleted.append)
    a = RRefProtocol(A)
    owned = b.create_owner()
    lost = b.fork(owned, dest=A)
    b.release(owned)
    assert deleted == []
    assert b.abandon_fork(lost) == []
    assert deleted == [owned.rref_id]

    h = a.create_remote(B)
    a.handle(b.accept_remote_call(h.rref_id, h.fork_id, A).messages[0])
    lost = a.fork(h, dest=C)
    assert a.release(h) == []  # held for a child that will never exist
    assert a.abandon_fork(lost) == [RRefDelete(B, h.rref_id, h.fork_id, A)]
    assert a.pending().empty


def test_abandon_remote_forgets_the_unsent_user() -> None:
    a = RRefProtocol(A)
    h = a.create_remote(B)
    errors = []
    a.when_confirmed([h], errors.append)
    a.abandon_remote(h, ConnectionError("never sent"))
    assert isinstance(errors[0], ConnectionError)
    assert a.pending().empty and a.debug_info().num_users == 0
    forked = a.create_remote(B)
    a.fork(forked, dest=C)
    with pytest.raises(RRefProtocolError):
        a.abandon_remote(forked, ConnectionError("too late"))
