"""Real worker processes (spawn) talking gRPC on loopback: world sizes 1 to 4."""

from __future__ import annotations

import pytest
from gradwire.distributed.rpc._testing import run_cluster

from . import bodies


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_all_to_all_calls_and_tensors(world_size: int) -> None:
    results = run_cluster(world_size, bodies.all_to_all)
    for r in results:
        assert r.value == [f"worker{i}" for i in range(world_size)]


def test_nested_chains_do_not_deadlock_with_four_threads() -> None:
    # 64 chains A->B->C->A of depth 4, each hop a blocking rpc_sync inside a handler.
    results = run_cluster(
        3, bodies.nested_chains, 64, 4, options={"num_worker_threads": 4}, timeout=120
    )
    assert results[0].value == 64


def test_peer_killed_mid_call_is_an_error_not_a_hang() -> None:
    results = run_cluster(2, bodies.kill_peer_mid_call, expect_failure={1}, timeout=60)
    assert results[0].value.startswith("WorkerUnavailableError")
    assert "worker1" in results[0].value
    assert results[1].exitcode == 17


def test_graceful_shutdown_finishes_calls_in_flight() -> None:
    results = run_cluster(2, bodies.shutdown_with_calls_in_flight)
    assert results[0].value == list(range(8))


def test_nongraceful_shutdown_fails_pending_calls() -> None:
    results = run_cluster(2, bodies.nongraceful_shutdown_fails_pending)
    assert "shut down while the call was pending" in results[0].value
