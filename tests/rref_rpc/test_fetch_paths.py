"""to_here() of a ready plain value is answered without a serving slot (on a fast-lane stream
thread, or on the I/O loop of an owner without a fast lane); other values, whose encoding may
run user code (reducers), on its serving pool (docs/architecture.md, "Where a call's time
goes")."""

from __future__ import annotations

import pytest
from gradwire.distributed.rpc._testing import run_cluster

from . import fetch_bodies

TCP = {"rpc_timeout": 60.0, "use_unix_socket": False, "shm_transfer": False}


@pytest.mark.parametrize("options", [TCP, {"rpc_timeout": 60.0}], ids=["tcp", "defaults"])
def test_ready_plain_values_skip_the_busy_pool_others_wait_for_it(options):
    out = run_cluster(
        2,
        fetch_bodies.fetch_paths,
        timeout=120,
        options=options,
        rank_options={1: {"num_worker_threads": 1}},
    )[0].value
    assert out["early"] == [0.0, 1.0, 2.0, 3.0]
    assert out["tensor_sum"] == float(1 << 16) and out["number"] == 7
    # Over TCP the 256 KiB tensor took the bulk lane (sent by a thread of the owner's loop,
    # not its busy pool); on one host, shared memory.
    assert out["tensor_over_bulk_lane"] == (1 if options is TCP else 0)
    assert out["listed"] == [1, 2] and out["blocker"] == "slept"
    # The blocker held the only serving thread for BLOCK_SECONDS from 0.5 s before the first
    # fetch: a fetch served by the pool waits for it, one served on the loop does not.
    left = fetch_bodies.BLOCK_SECONDS - 0.5
    assert out["tensor_seconds"] < left / 2, out
    assert out["number_seconds"] < left / 2, out
    assert out["listed_seconds"] > left / 2, out


@pytest.mark.parametrize("options", [TCP, {"rpc_timeout": 60.0}], ids=["tcp", "defaults"])
def test_a_fetch_frame_on_a_call_stream_gets_what_fetch_returns_and_remote_rides_a_stream(
    options,
):
    out = run_cluster(2, fetch_bodies.fetch_frames, timeout=120, options=options)[0].value
    assert out["pipes_after_remote"] == 0  # a plain remote() went on a fast-lane call stream
    # one with an RRef argument (run once its owner confirmed it) on the call pipe
    assert out["with_rref"] == float(1 << 10) and out["pipes_after_rref_argument"] == 1
    ready = out["ready"]
    unary = ready.pop("unary Fetch")
    assert unary["raw"] and not unary["continuation"] and not unary["error"]
    for name, answer in ready.items():
        assert answer == unary, name  # header and bytes, whichever server answered
    for name, error in out["unknown"].items():
        assert error.endswith("UnknownRRefError"), (name, error)
    assert out["fast_lane"]  # a Unix socket on one host, a TCP port over TCP
    assert out["later_parked"] is out["fast_lane"] and out["later"] == "later"


@pytest.mark.parametrize("options", [TCP, {"rpc_timeout": 60.0}], ids=["tcp", "defaults"])
def test_rref_control_messages_ride_call_frames_not_unary_calls(options):
    out = run_cluster(3, fetch_bodies.control_on_pipe, timeout=120, options=options)[0].value
    assert out["owner_rrefs_back"] is True  # every delete arrived: the owner holds none again
    assert out["unary_control"] == []


def test_a_slow_remote_is_retried_on_the_pipe_not_on_more_streams():
    out = run_cluster(2, fetch_bodies.slow_remote_retries_on_the_pipe, timeout=120, options=TCP)[
        0
    ].value
    assert out["value"] == "slow"
    routes = out["routes"]
    assert routes[0] == "stream" and len(routes) >= 2, routes  # it was retried
    assert set(routes[1:]) == {"pipe"}, routes
