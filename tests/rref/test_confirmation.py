"""Confirmed-before-run: functions receiving RRefs start only once the owner confirmed them."""

from __future__ import annotations

import logging

import pytest
from gradwire._runtime.rref.errors import RRefProtocolError, UnknownRRefError
from gradwire._runtime.rref.ids import GloballyUniqueId as G
from gradwire._runtime.rref.messages import ChildAck, ForkAccepted, RRefDelete
from gradwire._runtime.rref.protocol import RRefProtocol

B, A, C = 0, 1, 2


def three():
    return RRefProtocol(B), RRefProtocol(A), RRefProtocol(C)


def test_callback_waits_for_every_pending_argument() -> None:
    b, a, c = three()
    h1, h2 = a.create_remote(B), a.create_remote(B)
    owned = b.create_owner()
    from_owner, _ = c.receive_fork(b.fork(owned, dest=C))
    u1, (req1,) = c.receive_fork(a.fork(h1, dest=C))
    u2, (req2,) = c.receive_fork(a.fork(h2, dest=C))
    calls = []
    c.when_confirmed([from_owner, u1, u2], lambda err: calls.append(err))
    c.handle(b.handle(req2)[0])
    assert calls == []
    c.handle(b.handle(req1)[0])
    assert calls == [None]
    assert all(c.is_confirmed(h) for h in (from_owner, u1, u2))


def test_callback_runs_at_once_when_already_confirmed_or_owner() -> None:
    b, _, c = three()
    owned = b.create_owner()
    user, _ = c.receive_fork(b.fork(owned, dest=C))
    calls = []
    c.when_confirmed([user], calls.append)
    b.when_confirmed([owned], calls.append)
    c.when_confirmed([], calls.append)
    assert calls == [None, None, None]


def test_disowned_fork_reports_an_error_and_releases_its_parent() -> None:
    b, a, c = three()
    h = a.create_remote(B)
    user, _ = c.receive_fork(a.fork(h, dest=C))
    errors = []
    c.when_confirmed([user], errors.append)
    msgs = c.handle(ForkAccepted(C, h.rref_id, user.fork_id, known=False))
    assert msgs == [ChildAck(A, h.rref_id, user.fork_id, C)]  # the parent must not leak
    assert isinstance(errors[0], UnknownRRefError) and "no longer knows" in str(errors[0])
    assert not c.is_confirmed(user)
    assert c.release(user) == []  # the owner holds nothing for it
    assert c.debug_info().num_users == 0


def test_callback_may_call_back_into_the_protocol() -> None:
    b, a, c = three()
    h = a.create_remote(B)
    a.handle(b.accept_remote_call(h.rref_id, h.fork_id, A).messages[0])
    user, (req,) = c.receive_fork(a.fork(h, dest=C))
    sent = []
    # The function drops its argument as soon as it runs: a re-entrant release.
    c.when_confirmed([user], lambda err: sent.extend(c.release(user)))
    msgs = c.handle(b.handle(req)[0])
    assert msgs == [ChildAck(A, h.rref_id, user.fork_id, C)]
    assert sent == [RRefDelete(B, h.rref_id, user.fork_id, C)]


def test_failing_callback_is_logged_and_messages_are_not_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b, a, c = three()
    h = a.create_remote(B)
    user, (req,) = c.receive_fork(a.fork(h, dest=C))

    def boom(err: BaseException | None) -> None:
        raise ValueError("user function setup failed")

    c.when_confirmed([user], boom)
    with caplog.at_level(logging.ERROR):
        msgs = c.handle(b.handle(req)[0])
    assert msgs == [ChildAck(A, G(A, 0), G(A, 2), C)]
    assert "callback" in caplog.text


def test_confirmation_query_of_an_unknown_fork_is_an_error() -> None:
    b, _, c = three()
    user, _ = c.receive_fork(b.fork(b.create_owner(), dest=C))
    c.release(user)
    with pytest.raises(RRefProtocolError):
        c.is_confirmed(user)
    with pytest.raises(RRefProtocolError):
        c.when_confirmed([user], lambda err: None)
