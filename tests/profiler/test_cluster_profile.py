"""profile_cluster: one Chrome trace of every worker, with a lane per worker and an arrow for
each call, a distributed backward across workers, and nothing left recording after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gradwire._runtime.calls.profiling import clock_offset
from gradwire.distributed.rpc._testing import run_cluster

from . import bodies


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    path = tmp_path_factory.mktemp("trace") / "cluster.json"
    out = run_cluster(3, bodies.cluster_profile, str(path), timeout=120)[0].value
    return dict(out), json.loads(Path(path).read_text())


def test_one_lane_per_worker_and_a_flow_for_each_call(
    run: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    out, trace = run
    events = trace["traceEvents"]
    lanes = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert lanes == {0: "worker0 (rank 0)", 1: "worker1 (rank 1)", 2: "worker2 (rank 2)"}
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    calls = [e for e in slices if e["pid"] == 0 and e["name"].startswith("rpc_sync#udf")]
    served = [e for e in slices if e["pid"] in (1, 2) and e["name"].endswith(":udf")]
    assert len(calls) == 2 and len(served) == 2
    # the callee's ops sit on its own lane, inside its serving of the call
    assert any(e["pid"] == 1 and e["name"] == "aten::sigmoid" for e in slices)
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    assert trace["otherData"]["flows"] >= 4  # the udf calls and the loss calls at least
    for s in starts:
        f = next(e for e in ends if e["id"] == s["id"])
        assert s["pid"] != f["pid"] or s["pid"] == f["pid"] == 0


def test_a_distributed_backward_shows_on_every_worker_it_touched(
    run: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    out, trace = run
    assert out["grad"] == [4.0, 4.0, 4.0]
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for rank in (1, 2):
        names = " ".join(e["name"] for e in slices if e["pid"] == rank)
        assert "RecvRpcBackward" in names and "SendRpcBackward" in names, names
    assert out["ranks"] == [0, 1, 2]
    assert any("SendRpcBackward" in key for key in out["averages"])


def test_one_session_at_a_time_and_nothing_left_recording(
    run: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    out, _ = run
    assert "already recording" in out["again"]
    assert [list(x) for x in out["leftovers"]] == [[0, 0, 0]] * 3


def test_clock_offset() -> None:
    assert clock_offset(100, 150, 150, 200) == 0  # within the round trip: one clock
    assert clock_offset(100, 10_150, 10_150, 200) == 10_000
    assert clock_offset(100, -850, -850, 200) == -1_000
    assert clock_offset(100, 10_120, 10_180, 200) == 10_000  # an interval, centred


def test_gradwire_profile_cli_merges_a_running_cluster(tmp_path: Path) -> None:
    path = tmp_path / "cli.json"
    out = run_cluster(3, bodies.cli_profile, str(path), timeout=120)[0].value
    assert out["code"] == 0 and out["bad"] == 2
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert {e["pid"] for e in events if e.get("name") == "process_name"} == {0, 1, 2}
    assert trace["otherData"]["flows"] > 0
    served = {e["pid"] for e in events if e["ph"] == "X" and e["name"].endswith(":udf")}
    assert served == {1, 2}
    assert [list(x) for x in out["leftovers"]] == [[0, 0, 0]] * 3
