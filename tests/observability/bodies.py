"""Worker bodies of the observability tests (module-level: spawned workers import them)."""

from __future__ import annotations

import operator
import urllib.request
from typing import Any

import gradwire
from gradwire import observability
from gradwire.distributed import rpc


def boom() -> None:
    raise ValueError("boom")


def scrape(port: int) -> str:
    """GET the metrics of the worker serving on ``port`` of loopback, over HTTP."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        return str(resp.read().decode("utf-8"))


def metrics_body(rank: int, world_size: int) -> Any:
    """Both workers serve metrics; worker0 makes known calls to worker1 and scrapes both."""
    port = observability.start_metrics_server(0)
    ports = rpc.api._all_gather(port)
    if rank != 0:
        return None
    before = scrape(ports["worker0"]), scrape(ports["worker1"])
    peer = "worker1"
    for _ in range(5):
        assert rpc.rpc_sync(peer, operator.add, (1, 2)) == 3
    futs = [rpc.rpc_async(peer, operator.mul, (i, 2)) for i in range(3)]
    assert [f.wait() for f in futs] == [0, 2, 4]
    try:
        rpc.rpc_sync(peer, boom)
    except ValueError:
        pass
    rref = rpc.remote(peer, operator.add, (2, 3))
    assert rref.to_here() == 5
    big = gradwire.ones(512, 1024)  # 2 MiB: shared memory or the bulk lane, not the frames
    assert rpc.rpc_sync(peer, operator.neg, (big,)).shape == (512, 1024)
    return before, (scrape(ports["worker0"]), scrape(ports["worker1"]))


def nested_c(x: int) -> int:
    return x + 1


def nested_b(x: int) -> int:
    return rpc.rpc_sync("worker2", nested_c, (x,)) * 2


def trace_body(rank: int, world_size: int) -> Any:
    """Every worker records spans in memory; worker0 calls worker1, which calls worker2."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observability.enable_tracing(provider)
    if rank == 0:
        assert rpc.rpc_sync("worker1", nested_b, (1,)) == 4
        assert rpc.rpc_async("worker1", nested_b, (2,)).wait() == 6
    rpc.api._barrier(["worker0", "worker1", "worker2"])
    out = []
    for span in exporter.get_finished_spans():
        ctx, parent = span.get_span_context(), span.parent
        out.append(
            {
                "name": span.name,
                "kind": span.kind.name,
                "trace": ctx.trace_id,
                "span": ctx.span_id,
                "parent": parent.span_id if parent is not None else None,
                "ok": span.status.is_ok,
            }
        )
    return out
