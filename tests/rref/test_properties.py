"""Property tests over thousands of seeded random programs on the simulated network.

Each schedule runs a random program (2 to 5 workers; remote() to others and to self, local
RRefs, forks owner->user, user->owner, user->user and along chains of up to 8 hops, return
values handed over unconfirmed, to_here, drops) while the network reorders everything and
loses, retries and duplicates control messages. Safety is checked at every owner deletion and
every to_here and function start; liveness (nothing left anywhere) once it drains.

The mutant tests break one rule of the protocol at a time and require the same checks to
catch it, so a green run means something.
"""

from __future__ import annotations

import pytest
from gradwire._runtime import rref_owner, rref_user
from gradwire._runtime.rref_messages import ChildAck, RRefDelete
from gradwire._runtime.rref_owner import OwnerRecord, OwnerState
from gradwire._runtime.rref_user import UserState
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .simnet import Faults, SafetyViolation, run_random_program

CHUNKS, PER_CHUNK = 10, 400  # 4,000 schedules by default


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_schedules_are_safe_and_leak_free(chunk: int) -> None:
    for seed in range(chunk * PER_CHUNK, (chunk + 1) * PER_CHUNK):
        try:
            run_random_program(seed)
        except Exception as exc:
            exc.add_note(f"reproduce with run_random_program({seed})")
            raise


@pytest.mark.slow
def test_many_more_random_schedules() -> None:
    for seed in range(100_000, 200_000):
        try:
            run_random_program(seed)
        except Exception as exc:
            exc.add_note(f"reproduce with run_random_program({seed})")
            raise


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    n_workers=st.integers(2, 5),
    n_actions=st.integers(1, 60),
    p_lose=st.sampled_from([0.0, 0.2, 0.5]),
    p_dup=st.sampled_from([0.0, 0.2, 0.5]),
    max_dups=st.integers(0, 3),
    p_fail=st.sampled_from([0.0, 0.3]),
)
def test_random_programs_any_shape(
    seed: int,
    n_workers: int,
    n_actions: int,
    p_lose: float,
    p_dup: float,
    max_dups: int,
    p_fail: float,
) -> None:
    faults = Faults(p_lose, p_dup, max_dups, p_fail)
    run_random_program(seed, n_workers, n_actions, faults)


def test_heavy_faults_on_five_workers() -> None:
    for seed in range(200):
        run_random_program(seed, 5, 60, Faults(0.5, 0.4, 3, 0.2))


# -- mutants: each breaks one rule; the simulation must notice -------------------------------


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


@pytest.mark.parametrize("name", list(MUTANTS))
def test_simulation_catches_broken_protocols(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cls, attr, broken = MUTANTS[name]
    monkeypatch.setattr(cls, attr, broken)
    for seed in range(2000):
        try:
            run_random_program(seed)
        except (SafetyViolation, KeyError):
            # A violation, or the state machine tripping over its own broken invariant.
            return
    pytest.fail(f"mutant {name} survived 2000 schedules")
