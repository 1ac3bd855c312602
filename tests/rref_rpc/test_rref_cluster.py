"""RRefs across 3 or 4 real worker processes (run_cluster): scenarios, API, chains, errors."""

from __future__ import annotations

import pytest
from gradwire.distributed.rpc._testing import run_cluster

from . import bodies

QUIET = {"num_owner_rrefs": 0, "num_pending_users": 0, "num_pending_children": 0, "num_forks": 0}
OPTIONS = {"rpc_timeout": 30.0, "rref_leak_check": "error"}


def _rank0(world_size: int, body, *args, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("options", OPTIONS)
    return run_cluster(world_size, body, *args, timeout=90, **kw)[0].value


def _assert_quiet(quiet: dict[int, dict[str, int]]) -> None:
    for worker, counters in quiet.items():
        assert all(v == 0 for v in counters.values()), (worker, counters)


def test_the_four_scenarios_of_the_seed():
    out = _rank0(3, bodies.seed_scenarios)
    assert out["to_here"] == [2.0, 2.0] and out["confirmed"] is True
    arg = out["arg_to_owner"]
    assert arg["worker"] == "worker1" and arg["is_owner"] and arg["value"].tolist() == [2.0, 2.0]
    u2u = out["user_to_user"]
    assert u2u["worker"] == "worker2" and not u2u["is_owner"]
    assert u2u["confirmed"] is True  # the function ran only once the owner confirmed the fork
    assert u2u["owner"] == "worker1" and u2u["value"].tolist() == [2.0, 2.0]
    o2u = out["owner_to_user"]
    assert o2u == {
        "worker": "worker2",
        "is_owner": False,
        "confirmed": True,
        "value": "data",
        "owner": "worker0",
    }
    _assert_quiet(out["quiet"])


def test_rrefs_as_return_values_in_every_direction_and_nested():
    out = _rank0(4, bodies.return_values)
    assert out["owner_to_user"] == [False, "worker1", "from-1"]
    assert out["user_to_user"] == ["worker2", "on-2"]
    assert out["back_to_owner"] == [True, True, True]
    assert out["owner_check"] == [True, True, True]
    assert out["nested_from_remote"] == ["from-1", "on-2"]
    assert out["nested_args"] == [(True, "from-1"), (True, "on-2"), (True, "from-1"), True]
    assert out["remote_returning_rref"] == 7
    _assert_quiet(out["quiet"])


def test_an_rref_forwarded_along_eight_hops():
    out = _rank0(4, bodies.chain_of_8)
    assert out["seen"] == [
        "worker0",
        "worker2",
        "worker3",
        "worker1",
        "worker0",
        "worker2",
        "worker3",
        "worker0",
        "worker2",
    ]
    assert out["value"] == [10, 11, 12, 13]
    assert out["via_remote"] == "owned by 0"
    _assert_quiet(out["quiet"])


def test_the_rref_api():
    out = _rank0(3, bodies.api_surface)
    msg = out["local_value_error"]
    assert "worker0" in msg and "worker1" in msg and "to_here()" in msg
    assert out["owner"] == ["worker1", 1, "worker1", False]
    assert "RRefId = 0:" in out["repr"] and "ForkId = 0:" in out["repr"]
    assert out["pickle_error"].startswith("Can not pickle rref in python pickler")
    assert out["proxy_sync"] == [1, 6]
    assert out["proxy_async"] == 8
    assert out["proxy_remote"] == 11
    assert out["proxy_async_execution"] == 21
    assert out["attribute_error"] is True
    assert out["local"][:2] == [True, True] and "OwnerRRef(RRefId = 0:" in out["local"][2]
    assert out["local_proxy"] == 4
    assert out["local_attribute_error"] is True
    assert out["equal"] == [True, True, 1]
    assert out["confirmed"] is True
    _assert_quiet(out["quiet"])


def test_what_pytorchs_tests_observe_of_rrefs():
    out = _rank0(2, bodies.torch_semantics)
    g = "GloballyUniqueId(created_on=0, local_id={})".format
    assert out["str"] == [f"OwnerRRef({g(0)})", f"UserRRef(RRefId = {g(1)}, ForkId = {g(2)})"]
    message, written = out["save_error"]
    assert message.startswith("Can not pickle rref in python pickler") and not written
    assert out["local_value_error"].startswith(
        f"For UserRRef(rref_id={g(1)}, fork_id={g(2)}), can't call localValue() on user "
        "WorkerInfo(id=0, name=worker0). Call it on owner WorkerInfo(id=1, name=worker1)"
    )
    # PyTorch counts an OwnerRRef once another worker holds it, until that fork is deleted.
    assert out["shared"] == [0, 1, 0]
    assert out["type"] == [True, True] and out["value_travelled"] is False
    assert len(out["missing"]) == 3, out["missing"]
    assert all("has no attribute 'non_exist'" in m for m in out["missing"])
    assert out["future"] == [None, None]
    message, seconds = out["future_timeout"]
    assert message.startswith("RPC ran for more than") and "RRef creation" in message
    assert seconds < 0.9  # failed at the remote()'s deadline, not when the owner answered
    assert "RRef creation timed out" in out["late_to_here"]
    assert out["after_shutdown"].startswith(
        f"UserRRef(RRefId = {g(1)}, ForkId = {g(2)}) has been deleted. Cannot call to_here() "
        "on it after deletion."
    )
    # rpc.internal.serialize: an RRef travels only inside an RPC; after shutdown, PyTorch's words.
    assert "outside an RPC" in out["serialize_error"]
    assert out["fork_after_shutdown"].startswith(
        f"UserRRef(RRefId = {g(1)}, ForkId = {g(2)}) has been deleted. Cannot call fork an "
        "UserRRef after deletion."
    )


def test_creation_errors_and_timeouts():
    out = _rank0(3, bodies.creation_errors)
    for use in ("to_here", "fork", "proxy"):
        assert out[use] == ("ValueError", True), (use, out[use])
    assert out["slow_function"] == "late"
    assert "RRef creation timed out" in out["creation_timeout"]
    assert "to_here() to worker 'worker1' timed out" in out["to_here_timeout"]
    assert out["to_here_later"] == "ok"
    assert "self-boom" in out["to_self_error"]
    assert out["to_self"] == 5
    _assert_quiet(out["quiet"])


def test_backward_on_the_owner_locally_and_in_a_dist_autograd_context():
    out = _rank0(3, bodies.backward_paths)
    assert "require 'dist_autograd_ctx_id'" in out["user_without_context"]
    assert out["local"] == [3.0, 3.0]
    assert out["dist"] == [3.0, 3.0]
    assert out["through_remote"] == [10.0, 10.0]
    assert out["owner"] is True
    _assert_quiet(out["quiet"])


def test_debug_counters_and_the_watch_stream():
    out = _rank0(3, bodies.inspection)
    counters = out["counters"]
    assert counters[1]["num_owner_rrefs"] == 1 and counters[1]["num_forks"] == 2, counters
    assert counters[0]["num_users"] == 1 and counters[2]["num_users"] == 1, counters
    _assert_quiet(out["quiet"])
    kinds = {(k, d, p) for k, d, p, _r, _f in out["events"]}
    for expected in (
        ("RemoteCall", "received", "worker0"),
        ("RemoteAck", "sent", "worker0"),
        ("ForkRequest", "received", "worker2"),
        ("ForkAccepted", "sent", "worker2"),
        ("RRefDelete", "received", "worker0"),
        ("RRefDelete", "received", "worker2"),
    ):
        assert expected in kinds, (expected, sorted(kinds))
    assert all(r.startswith("0:") for k, _d, _p, r, _f in out["events"] if k != "FetchRRef")


@pytest.mark.parametrize("phase", ["before", "after"])
def test_retries_over_real_grpc_when_the_first_control_messages_fail(phase):
    out = _rank0(4, bodies.faults, 2, phase)
    assert out["value"] == [2.0, 2.0] and out["hopped"] == [2.0, 2.0]
    assert out["seen"] == ["worker0", "worker2", "worker3", "worker1", "worker0", "worker2"]
    assert out["got"]["confirmed"] is True and out["got"]["value"] == "mine"
    _assert_quiet(out["quiet"])
    total = {}
    for counts in out["counts"].values():
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    for kind in ("RemoteCall", "ForkRequest", "ChildAck", "RRefDelete"):
        assert total.get(kind, 0) > 2, (kind, total)  # failed attempts really happened


def test_shutdown_drains_live_user_rrefs_cycles_and_forks_in_flight():
    results = run_cluster(3, bodies.shutdown_drain, timeout=90, options=OPTIONS)
    assert all(r.value["rank"] == r.rank for r in results)
    assert "shut down" in results[0].value["after_shutdown"]


def test_the_leak_check_warns_or_fails():
    strict = run_cluster(3, bodies.shutdown_leak, "error", timeout=90, options=OPTIONS)
    assert strict[1].value["error"] == "RRefLeakError"
    # PyTorch's wording first: the RRef minted by rank 0 (id 0) and rank 0's fork (id 1).
    message = strict[1].value["message"]
    assert message.startswith(
        "Leaking RRef GloballyUniqueId(created_on=0, local_id=0) with fork Id "
        "GloballyUniqueId(created_on=0, local_id=1)"
    ), message
    assert "1 OwnerRRef(s)" in message  # rank 1's local-only RRef is no leak
    assert strict[0].value["error"] is None and strict[2].value["error"] is None
    lenient = run_cluster(
        3, bodies.shutdown_leak, "warn", timeout=90, options={"rpc_timeout": 30.0}
    )
    assert lenient[1].value["error"] is None
    assert any("Leaking RRef" in w for w in lenient[1].value["warnings"])
    ignored = run_cluster(3, bodies.shutdown_leak, "ignored", timeout=90, options=OPTIONS)
    assert [r.value["error"] for r in ignored] == [None, None, None]
    assert any("Leaking RRef" in w for w in ignored[1].value["warnings"])


def _random_run(seed: int, steps: int) -> None:
    out = _rank0(4, bodies.random_program, seed, steps, 0.3)
    _assert_quiet(out["quiet"])
    assert out["failures"] > 0 and out["checks"] > 0, out


def test_a_random_program_with_random_control_failures():
    _random_run(seed=1, steps=60)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 12))
def test_random_programs_with_random_control_failures_soak(seed):
    _random_run(seed, steps=300)


def test_a_dead_owner_makes_its_rrefs_fail_not_hang():
    results = run_cluster(
        3,
        bodies.owner_crash,
        timeout=90,
        expect_failure={1},
        options={"rpc_timeout": 4.0, "rref_leak_check": "off"},
    )
    out = results[0].value
    assert out["before"] == "doomed"
    assert out["to_here"] in ("WorkerUnavailableError", "RpcTimeoutError"), out
    # worker2 cannot get its fork confirmed by the dead owner: the function never runs and
    # the call fails once the ForkRequest's retries are exhausted, naming the dead owner.
    assert out["share"] in ("WorkerUnavailableError", "RpcTimeoutError"), out
    assert "worker1" in out["share_msg"] and "ForkRequest" in out["share_msg"], out
    assert out["remote"] in ("WorkerUnavailableError", "RpcTimeoutError"), out


def test_values_larger_than_a_frame_are_streamed():
    out = _rank0(3, bodies.large_values, options={**OPTIONS, "single_frame_bytes": 4096})
    assert out["sum"] == 100_000.0 and out["shared"] == 100_000.0
    _assert_quiet(out["quiet"])


def test_a_burst_of_deletes_uses_a_bounded_number_of_threads():
    out = _rank0(3, bodies.burst_of_deletes, 2000)
    assert out["total"] == 45
    _assert_quiet(out["quiet"])
    before, during = out["threads"]
    assert during <= before + 16, out["threads"]  # sends are gRPC futures, not 2000 threads
