"""The profiler across real workers: each RPC verb's event, the callee's events sent back
with its rank, nested calls, failures, and a worker profiling the calls it serves."""

from __future__ import annotations

from typing import Any

import pytest
from gradwire.distributed.rpc._testing import run_cluster

from . import bodies

OPS = {"aten::ones", "aten::add", "aten::mul", "aten::relu", "aten::clamp_min", "aten::sigmoid"}


@pytest.fixture(scope="module", params=["defaults", "tcp"])
def outcome(request: pytest.FixtureRequest) -> dict[str, Any]:
    options = {} if request.param == "defaults" else {"use_unix_socket": False}
    return dict(run_cluster(3, bodies.profiled_calls, options=options, timeout=120)[0].value)


@pytest.mark.parametrize("verb", ["sync", "async", "remote"])
def test_each_verb_has_one_event_holding_the_callees_events(
    outcome: dict[str, Any], verb: str
) -> None:
    got = outcome[verb]
    key = f"rpc_{verb}#udf(worker0 -> worker1)"
    assert got["calls"] == [key]
    assert {name[len(key + "#remote_op: ") :] for name in got["remote"]} == OPS
    assert got["nodes"] == [1]  # the callee's rank
    assert got["inside"]  # placed within the call's interval
    assert got["shapes"] == ["[[2], [2]]"]  # record_shapes travels to the callee


def test_nested_calls_keep_each_workers_rank(outcome: dict[str, Any]) -> None:
    key = "rpc_async#async_add(worker0 -> worker1)#remote_op: "
    nested = key + "rpc_async#add(worker1 -> worker2)"
    assert (nested, 1) in outcome["nested"]
    assert (nested + "#remote_op: aten::add", 2) in outcome["nested"]


def test_a_failed_call_ends_its_event_and_nothing_is_left_behind(
    outcome: dict[str, Any],
) -> None:
    assert ("rpc_sync#fails(worker0 -> worker1)", False) in outcome["failed"]
    # no call waits for remote events, no callee keeps a recorder, nothing still profiles
    assert [list(x) for x in outcome["leftovers"]] == [[0, 0, 0]] * 3


def test_a_worker_profiles_the_calls_it_serves(outcome: dict[str, Any]) -> None:
    groups = outcome["served"]
    assert ["aten::add"] in groups, groups
