"""Real worker processes (spawn) talking gRPC on loopback: world sizes 1 to 4."""

from __future__ import annotations

import pytest
from gradwire.distributed.rpc._testing import free_port, run_cluster

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


def test_env_rendezvous_and_generated_token() -> None:
    # No GRADWIRE_TOKEN: rank 0 generates one and hands it out at the rendezvous.
    port = free_port()
    results = run_cluster(
        3,
        bodies.all_to_all,
        options={"init_method": "env://"},
        env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GRADWIRE_TOKEN": ""},
    )
    assert all(r.value == ["worker0", "worker1", "worker2"] for r in results)


def test_static_address_list() -> None:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    results = run_cluster(2, bodies.addresses_used, options={"init_method": addresses})
    assert results[0].value == addresses


def test_duplicate_names_are_rejected_clearly() -> None:
    results = run_cluster(
        3,
        bodies.all_to_all,
        names=["a", "b", "a"],
        expect_failure={0, 1, 2},
        options={"init_timeout": 4},
        timeout=30,
    )
    errors = [r.error or "" for r in results]
    assert any("duplicate worker name 'a'" in e for e in errors), errors
    assert all("RpcInitError" in e for e in errors), errors


def test_wrong_token_cannot_join() -> None:
    results = run_cluster(
        2,
        bodies.all_to_all,
        rank_env={1: {"GRADWIRE_TOKEN": "not-the-token"}},
        expect_failure={0, 1},
        options={"init_timeout": 3},
        timeout=30,
    )
    assert "wrong cluster token" in (results[1].error or "")
    assert "ranks [1] never joined" in (results[0].error or "")


def test_world_size_mismatch() -> None:
    results = run_cluster(
        2,
        bodies.all_to_all,
        rank_options={1: {"init_timeout": 10}},
        expect_failure={0, 1},
        options={"init_timeout": 10},
        timeout=30,
        world_size_override={1: 3},
    )
    assert any("expects world_size 3" in (r.error or "") for r in results)


#: Two workers that reach each other over TCP only (the bulk lane carries the tensors).
TCP_ONLY = {"use_unix_socket": False, "shm_transfer": False}


def _check_bounded_memory(mib: int, over_tcp: bool = False) -> dict[str, float]:
    if over_tcp:
        result = run_cluster(2, bodies.big_echo, mib, 1, timeout=300, options=TCP_ONLY)[0].value
        assert result["bulk_taken"] == 1, result  # the reply's bytes came over the bulk lane
    else:
        result = run_cluster(1, bodies.big_echo, mib, timeout=300)[0].value
    # The callee's received copy and the caller's result are the payload twice; everything
    # else (frames in flight, gRPC buffers) must stay small.
    assert result["extra_bytes"] < 2 * result["payload"] + (160 << 20), result
    return result


def test_tensor_round_trip_streams_with_bounded_memory() -> None:
    _check_bounded_memory(64)


def test_tensor_round_trip_over_the_bulk_lane_with_bounded_memory() -> None:
    _check_bounded_memory(64, over_tcp=True)


@pytest.mark.slow
@pytest.mark.parametrize("over_tcp", [False, True], ids=["self", "tcp"])
def test_one_gib_tensor_round_trip(over_tcp: bool) -> None:
    result = _check_bounded_memory(1024, over_tcp)
    print(
        f"1 GiB echo: {result['seconds']:.2f} s, extra peak {result['extra_bytes'] / 2**20:.0f} MiB"
    )


def test_shutdown_timeout_is_honoured_and_health_turns_not_serving() -> None:
    results = run_cluster(2, bodies.shutdown_timeout_is_honoured, timeout=60)
    rank0, rank1 = results[0].value, results[1].value
    assert 1.4 < rank0["elapsed"] < 4.0, rank0
    assert "never arrived: worker1" in rank0["error"]
    assert rank1["health_of_rank0_at_barrier"] == 2  # NOT_SERVING while shutting down
    assert rank1["own_shutdown"] in ("WorkerUnavailableError", "RpcTimeoutError")


def test_async_call_to_a_killed_peer_fails() -> None:
    results = run_cluster(2, bodies.async_call_to_killed_peer, expect_failure={1})
    assert "worker1" in results[0].value
