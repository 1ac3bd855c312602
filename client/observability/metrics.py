"""Prometheus metrics of this worker (issue 40): the call hook that counts calls and the
collector that reads the agent's state when scraped.

Off by default and free while off: no hook is registered (calls take their usual path) and the
transports' byte counters are None (``gradwire._traffic``). :func:`enable` registers
:class:`MetricsHook` (a call hook that sees every call) and starts the byte counters;
:func:`serve` also serves the registry over HTTP in Prometheus' text format. Gauges (calls in
flight, RRefs, dist-autograd contexts, peers by state) and the byte counters are read from the
agent at scrape time by :class:`AgentCollector`, so they cost nothing between scrapes.

Needs ``prometheus-client`` (``pip install 'gradwire[observability]'``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from .. import _traffic
from .._proto import worker_pb2 as pb
from .._runtime import agent as _agent
from .._runtime.calls import hooks
from .._wire import shm
from ..futures import Future
from ._deps import require

__all__ = ["MetricsHook", "AgentCollector", "enable", "disable", "enabled", "serve", "text"]

log = logging.getLogger(__name__)

#: Latency buckets in seconds: a noop call on loopback is ~0.1-0.5 ms, a large tensor seconds.
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # fmt: skip
#: The callee cannot tell rpc_sync from rpc_async: it names the kind of call it serves.
_SERVED_VERB = {pb.CALL_KIND_PYTHON: "rpc", pb.CALL_KIND_REMOTE: "remote"}


def _peer_name(peer: int) -> str:
    agent = _agent.current_or_none()
    return agent.ctx.peer_name(peer) if agent is not None else str(peer)


class _Series:
    """One (verb, peer) label set's children, looked up once."""

    __slots__ = ("started", "finished", "failed", "seconds")

    def __init__(self, family: tuple[Any, Any, Any, Any], verb: str, peer: str) -> None:
        started, finished, failed, seconds = family
        self.started = started.labels(verb, peer)
        self.finished = finished.labels(verb, peer)
        self.failed = failed.labels(verb, peer)
        self.seconds = seconds.labels(verb, peer)


class _Served:
    """The scope of one served call: counts it and times its function."""

    __slots__ = ("_series", "_t0")

    def __init__(self, series: _Series) -> None:
        self._series = series
        self._t0 = 0.0

    def __enter__(self) -> None:
        self._series.started.inc()
        self._t0 = time.perf_counter()

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        s = self._series
        s.seconds.observe(time.perf_counter() - self._t0)
        s.finished.inc()
        if kind is not None:
            s.failed.inc()


class MetricsHook(hooks.CallHook):
    """Counts and times every call this worker makes (``on_call_started``: until its Future
    completes) and every function it runs for a caller (``scope``).

    Args:
        registry: the prometheus_client CollectorRegistry the metrics are registered in.
    """

    context_only = False

    def __init__(self, registry: Any) -> None:
        prom = require("prometheus_client", "metrics")
        labels = ("verb", "peer")
        self._client = (
            prom.Counter(
                "gradwire_rpc_client_calls_started",
                "Calls this worker made (rpc_sync, rpc_async, remote), by peer called.",
                labels,
                registry=registry,
            ),
            prom.Counter(
                "gradwire_rpc_client_calls_finished",
                "Calls this worker made that completed (answered, failed or timed out).",
                labels,
                registry=registry,
            ),
            prom.Counter(
                "gradwire_rpc_client_calls_failed",
                "Calls this worker made that completed with an error.",
                labels,
                registry=registry,
            ),
            prom.Histogram(
                "gradwire_rpc_client_call_seconds",
                "Seconds from a call leaving this worker to its Future completing.",
                labels,
                buckets=BUCKETS,
                registry=registry,
            ),
        )
        self._server = (
            prom.Counter(
                "gradwire_rpc_server_calls_started",
                "Functions this worker started for a caller (verb rpc or remote).",
                labels,
                registry=registry,
            ),
            prom.Counter(
                "gradwire_rpc_server_calls_finished",
                "Functions this worker ran for a caller that returned or raised.",
                labels,
                registry=registry,
            ),
            prom.Counter(
                "gradwire_rpc_server_calls_failed",
                "Functions this worker ran for a caller that raised.",
                labels,
                registry=registry,
            ),
            prom.Histogram(
                "gradwire_rpc_server_call_seconds",
                "Seconds the function of a served call ran (until it returned its value, or "
                "its Future for an @async_execution function).",
                labels,
                buckets=BUCKETS,
                registry=registry,
            ),
        )
        self._lock = threading.Lock()
        self._series: dict[tuple[bool, str, str], _Series] = {}

    def _of(self, served: bool, verb: str, peer: int) -> _Series:
        key = (served, verb, _peer_name(peer))  # by name: a later agent may reuse the ids
        series = self._series.get(key)
        if series is None:
            with self._lock:
                series = self._series.get(key)
                if series is None:
                    family = self._server if served else self._client
                    series = self._series[key] = _Series(family, verb, key[2])
        return series

    def on_call_started(
        self,
        call: pb.CallHeader,
        peer: int,
        done: Future[Any],
        deadline: float | None,
        verb: str,
    ) -> None:
        series = self._of(False, verb, peer)
        series.started.inc()
        t0 = time.perf_counter()

        def ended(fut: Future[Any]) -> None:
            series.seconds.observe(time.perf_counter() - t0)
            series.finished.inc()
            if fut.exception() is not None:
                series.failed.inc()

        done.add_done_callback(ended)

    def scope(self, call: pb.CallHeader, peer: int) -> Any:
        return _Served(self._of(True, _SERVED_VERB.get(call.kind, "rpc"), peer))


class AgentCollector:
    """Reads the current agent's state at scrape time (no cost between scrapes)."""

    def collect(self) -> Iterator[Any]:
        """The gauges and byte counters of this worker (prometheus_client's Collector)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        sent, received = _traffic.counts.snapshot() if _traffic.counts is not None else ({}, {})
        shared = shm.stats()
        sent[_traffic.SHM] = shared.get("sent_bytes", 0)
        received[_traffic.SHM] = shared.get("received_bytes", 0)
        for name, table in (("sent", sent), ("received", received)):
            family = CounterMetricFamily(
                f"gradwire_bytes_{name}",
                f"Bytes {name} by route (grpc, fast_lane, bulk_lane, shm) since metrics were on "
                "(shm: since the process started).",
                labels=["route"],
            )
            for route in _traffic.ROUTES:
                family.add_metric([route], float(table.get(route, 0)))
            yield family
        agent = _agent.current_or_none()
        if agent is None or agent.state in (_agent.AgentState.UNINITIALIZED,):
            return
        yield from _agent_families(agent, GaugeMetricFamily, CounterMetricFamily)


def _gauge(cls: Any, name: str, doc: str, value: float) -> Any:
    family = cls(name, doc)
    family.add_metric([], value)
    return family


def _agent_families(agent: Any, gauge: Any, counter: Any) -> Iterator[Any]:
    info = gauge("gradwire_worker", "This worker (value 1).", labels=["worker", "rank", "state"])
    info.add_metric([agent.name, str(agent.rank), agent.state.value], 1.0)
    yield info
    yield _gauge(
        gauge,
        "gradwire_rpc_client_calls_in_flight",
        "Calls this worker made that have not completed.",
        len(agent.caller.pending),
    )
    yield _gauge(
        gauge,
        "gradwire_rpc_server_calls_in_flight",
        "Calls this worker is serving.",
        agent.callee.in_flight,
    )
    served = counter(
        "gradwire_rpc_server_replies",
        "Calls this worker answered since it started, by outcome (any route, refusals too).",
        labels=["outcome"],
    )
    failed = agent.callee.failed
    served.add_metric(["ok"], float(agent.callee.served - failed))
    served.add_metric(["error"], float(failed))
    yield served
    rrefs = agent.rref.protocol.debug_info()
    family = gauge("gradwire_rrefs", "RRefs on this worker, by kind.", labels=["kind"])
    family.add_metric(["owner"], float(rrefs.num_owner_rrefs))
    family.add_metric(["user"], float(rrefs.num_users))
    yield family
    yield _gauge(
        gauge,
        "gradwire_dist_autograd_contexts",
        "Live distributed autograd contexts on this worker.",
        len(agent.autograd.container),
    )
    lost = set(agent.events.lost)
    states = {"alive": 0, "lost": 0, "departed": len(agent.table.departed)}
    for peer in agent.peers:
        if peer.id != agent.rank:
            states["lost" if peer.id in lost else "alive"] += 1
    family = gauge("gradwire_peers", "Other workers, by state.", labels=["state"])
    for state, n in states.items():
        family.add_metric([state], float(n))
    yield family


_lock = threading.Lock()
_registry: Any = None
_hook: MetricsHook | None = None
_http: Any = None


def enable() -> Any:
    """Start collecting this process' metrics (idempotent): register the call hook and the
    byte counters.

    Returns:
        The prometheus_client CollectorRegistry that holds them.

    Raises:
        ImportError: prometheus-client is not installed (the ``observability`` extra).
    """
    global _registry, _hook
    prom = require("prometheus_client", "metrics")
    with _lock:
        if _registry is None:
            registry = prom.CollectorRegistry(auto_describe=True)
            hook = MetricsHook(registry)
            registry.register(AgentCollector())
            _registry, _hook = registry, hook
        assert _hook is not None
        _traffic.start()
        hooks.register(_hook)
        return _registry


def disable() -> None:
    """Stop collecting (the hook and the byte counters go; the HTTP server stops)."""
    global _registry, _hook, _http
    with _lock:
        if _hook is not None:
            hooks.unregister(_hook)
        _traffic.stop()
        if _http is not None:
            _http.shutdown()
            _http.server_close()
        _registry = _hook = _http = None


def enabled() -> bool:
    """Whether metrics are being collected."""
    return _registry is not None


def serve(port: int, host: str = "127.0.0.1") -> int:
    """Collect metrics (:func:`enable`) and serve them over HTTP in Prometheus' text format
    at ``http://host:port/metrics`` (any path answers), on a daemon thread.

    Returns:
        The port bound (``port=0``: one the kernel chose).

    Raises:
        ImportError: prometheus-client is not installed.
        OSError: the port cannot be bound.
        RuntimeError: already serving on another port.
    """
    global _http
    prom = require("prometheus_client", "metrics")
    registry = enable()
    with _lock:
        if _http is not None:
            bound = int(_http.server_port)
            if port not in (0, bound):
                raise RuntimeError(f"gradwire already serves metrics on port {bound}")
            return bound
        server, _thread = prom.start_http_server(port, addr=host, registry=registry)
        _http = server
        bound = int(server.server_port)
    log.info("serving Prometheus metrics on http://%s:%d/metrics", host, bound)
    return bound


def text() -> str:
    """This worker's metrics in Prometheus' text format (what a scrape gets).

    Raises:
        ImportError: prometheus-client is not installed.
        RuntimeError: metrics are not enabled.
    """
    prom = require("prometheus_client", "metrics")
    registry = _registry
    if registry is None:
        raise RuntimeError("metrics are off: call gradwire.observability.enable_metrics() first")
    return str(prom.generate_latest(registry).decode("utf-8"))
