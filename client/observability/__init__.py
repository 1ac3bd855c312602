"""Metrics and traces for operators (issue 40; docs/observability.md).

Prometheus metrics of this worker and OpenTelemetry spans of its calls. Both are off by
default, and cost nothing while off; they need the ``observability`` extra
(``pip install 'gradwire[observability]'``: prometheus-client, opentelemetry-api and -sdk).
gradwire imports and runs without it; these functions then raise ImportError naming it.

Example:
    >>> from gradwire import observability
    >>> observability.start_metrics_server(9400)   # http://127.0.0.1:9400/metrics
    9400
    >>> observability.enable_tracing()              # spans to the global tracer provider
    >>> rpc.init_rpc("worker0", rank=0, world_size=2)

``gradwire-worker --metrics-port 9400 --tracing`` (or ``GRADWIRE_METRICS_PORT``,
``GRADWIRE_TRACING=1``) does the same for a worker started from the command line.
"""

from __future__ import annotations

from typing import Any

from . import metrics as _metrics
from . import tracing as _tracing

__all__ = [
    "start_metrics_server",
    "stop_metrics_server",
    "enable_metrics",
    "disable_metrics",
    "metrics_enabled",
    "metrics_text",
    "enable_tracing",
    "disable_tracing",
    "tracing_enabled",
]


def start_metrics_server(port: int, host: str = "127.0.0.1") -> int:
    """Collect this worker's metrics and serve them over HTTP in Prometheus' text format.

    Call it before or after ``init_rpc``; gauges read the running agent at each scrape.

    Args:
        port: TCP port (0: any free one).
        host: address to bind (default loopback; ``0.0.0.0`` for a scraper on another host).

    Returns:
        The port bound.

    Raises:
        ImportError: prometheus-client is not installed.
        OSError: the port cannot be bound.
        RuntimeError: already serving on another port.

    Example:
        >>> observability.start_metrics_server(9400, host="0.0.0.0")
        9400
    """
    return _metrics.serve(port, host)


def stop_metrics_server() -> None:
    """Stop collecting metrics and serving them (the counters start again from zero)."""
    _metrics.disable()


def enable_metrics() -> Any:
    """Collect this worker's metrics without serving them (read them with
    :func:`metrics_text`, or from the returned prometheus_client CollectorRegistry).

    Returns:
        The CollectorRegistry.

    Raises:
        ImportError: prometheus-client is not installed.
    """
    return _metrics.enable()


def disable_metrics() -> None:
    """The same as :func:`stop_metrics_server`."""
    _metrics.disable()


def metrics_enabled() -> bool:
    """Whether metrics are being collected."""
    return _metrics.enabled()


def metrics_text() -> str:
    """This worker's metrics in Prometheus' text format, as a scrape would get them.

    Raises:
        ImportError: prometheus-client is not installed.
        RuntimeError: metrics are off.
    """
    return _metrics.text()


def enable_tracing(tracer_provider: Any = None) -> None:
    """Make an OpenTelemetry span of every ``rpc_sync``, ``rpc_async`` and ``remote`` call,
    on the caller (CLIENT) and on the callee (SERVER), the W3C trace context carried in the
    call, so nested calls across workers are one trace.

    Args:
        tracer_provider: a TracerProvider; None: OpenTelemetry's global one.

    Raises:
        ImportError: opentelemetry-api is not installed.

    Example:
        >>> from opentelemetry.sdk.trace import TracerProvider
        >>> observability.enable_tracing(TracerProvider())
    """
    _tracing.enable(tracer_provider)


def disable_tracing() -> None:
    """Stop making spans."""
    _tracing.disable()


def tracing_enabled() -> bool:
    """Whether calls make spans."""
    return _tracing.enabled()
