"""Metrics scraped over HTTP from loopback workers, and one trace across three workers."""

from __future__ import annotations

import re

import pytest
from gradwire.distributed.rpc._testing import run_cluster

from . import bodies

pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.sdk")


def _samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def test_metrics_scraped_over_http_match_the_calls_made() -> None:
    before, after = run_cluster(2, bodies.metrics_body, timeout=60)[0].value
    caller, callee = (_delta(_samples(b), _samples(a)) for b, a in zip(before, after))
    gauges = _samples(after[1])
    c = 'gradwire_rpc_client_calls_{}_total{{peer="worker1",verb="{}"}}'
    assert caller[c.format("started", "rpc_sync")] == 7  # 5 adds, boom, the tensor call
    assert caller[c.format("finished", "rpc_sync")] == 7
    assert caller[c.format("failed", "rpc_sync")] == 1
    assert caller[c.format("started", "rpc_async")] == 3
    assert caller[c.format("failed", "rpc_async")] == 0
    assert caller[c.format("started", "remote")] == 1
    hist = 'gradwire_rpc_client_call_seconds_count{peer="worker1",verb="rpc_sync"}'
    assert caller[hist] == 7
    s = 'gradwire_rpc_server_calls_{}_total{{peer="worker0",verb="{}"}}'
    assert callee[s.format("started", "rpc")] == 10  # 7 rpc_sync and 3 rpc_async
    assert callee[s.format("failed", "rpc")] == 1
    assert callee[s.format("started", "remote")] == 1
    assert gauges["gradwire_rpc_client_calls_in_flight"] == 0
    assert gauges["gradwire_rpc_server_calls_in_flight"] == 0
    # worker1 waits in its shutdown barrier meanwhile (its body returned)
    assert [k for k in gauges if k.startswith("gradwire_worker{")] == [
        'gradwire_worker{rank="1",state="SHUTTING_DOWN",worker="worker1"}'
    ]
    assert gauges['gradwire_peers{state="alive"}'] == 1
    assert gauges['gradwire_rrefs{kind="owner"}'] == 1  # the remote()'s value, still held
    assert gauges["gradwire_dist_autograd_contexts"] == 0
    assert callee['gradwire_rpc_server_replies_total{outcome="error"}'] == 1
    # The 2 MiB tensor went by shared memory or the bulk lane, both ways.
    moved = sum(caller[f'gradwire_bytes_sent_total{{route="{r}"}}'] for r in ("shm", "bulk_lane"))
    assert moved >= 2 * 2**20
    # The call frames: by gRPC, the fast lane, or the bulk lane's calls and pipes.
    routes = ("grpc", "fast_lane", "bulk_lane")
    frames = sum(caller[f'gradwire_bytes_sent_total{{route="{r}"}}'] for r in routes)
    assert frames > 0


def test_trace_context_crosses_three_workers() -> None:
    every = [s for r in run_cluster(3, bodies.trace_body, timeout=60) for s in r.value]
    spans = [s for s in every if "nested_" in s["name"]]  # not the barrier's calls
    names = sorted(s["name"] for s in spans)
    fn = bodies.__name__.rpartition(".")[0] + ".bodies:nested_"
    assert names == sorted(
        [
            f"rpc_sync#{fn}b(worker0 -> worker1)",
            f"rpc_async#{fn}b(worker0 -> worker1)",
            *[f"{fn}b(worker0 -> worker1)"] * 2,  # the server spans
            *[f"rpc_sync#{fn}c(worker1 -> worker2)"] * 2,
            *[f"{fn}c(worker1 -> worker2)"] * 2,
        ]
    ), names
    by_id = {s["span"]: s for s in spans}
    roots = [s for s in spans if s["parent"] is None]
    assert len(roots) == 2  # one trace per call of worker0
    for root in roots:
        tree = [s for s in spans if s["trace"] == root["trace"]]
        # worker0's client span -> worker1's server span -> its client span -> worker2's
        assert [s["kind"] for s in sorted(tree, key=lambda s: _depth(s, by_id))] == [
            "CLIENT",
            "SERVER",
            "CLIENT",
            "SERVER",
        ]
        assert all(s["ok"] for s in tree)


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _depth(span: dict, by_id: dict) -> int:
    depth = 0
    while span["parent"] is not None:
        span = by_id[span["parent"]]
        depth += 1
    return depth
