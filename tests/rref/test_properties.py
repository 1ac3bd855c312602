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
from gradwire._compat import add_note
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .mutants import MUTANTS
from .simnet import Faults, SafetyViolation, run_random_program

CHUNKS, PER_CHUNK = 10, 400  # 4,000 schedules by default


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_schedules_are_safe_and_leak_free(chunk: int) -> None:
    for seed in range(chunk * PER_CHUNK, (chunk + 1) * PER_CHUNK):
        try:
            run_random_program(seed)
        except Exception as exc:
            add_note(exc, f"reproduce with run_random_program({seed})")
            raise


@pytest.mark.slow
def test_many_more_random_schedules() -> None:
    for seed in range(100_000, 200_000):
        try:
            run_random_program(seed)
        except Exception as exc:
            add_note(exc, f"reproduce with run_random_program({seed})")
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
