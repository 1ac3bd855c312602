"""``--metrics-port``, ``--metrics-host`` and ``--tracing`` of ``gradwire-worker`` and
``gradwire run``: metrics and traces for operators (docs/observability.md)."""

from __future__ import annotations

import logging
import sys

from .lifecycle import EXIT_CONFIG
from .worker_config import WorkerConfig

__all__ = ["observe"]

log = logging.getLogger("gradwire.worker")


def observe(cfg: WorkerConfig, prog: str = "gradwire-worker") -> int | None:
    """Start what ``cfg`` asks for, before the worker joins (a scrape sees it joining too).

    Args:
        cfg: the checked configuration (``metrics_port`` None: no metrics server).
        prog: command name for error messages.

    Returns:
        None, or EXIT_CONFIG when it cannot start (the observability extra is missing, or
        the port cannot be bound).
    """
    port = cfg.values.get("metrics_port")
    if port is None and not cfg.values.get("tracing"):
        return None  # nothing asked: the worker runs without the extra's modules
    try:
        from gradwire import observability

        if port is not None:
            host = cfg.values.get("metrics_host") or _listen_host(cfg)
            bound = observability.start_metrics_server(port, host)
            log.info("metrics: http://%s:%d/metrics", host, bound)
        if cfg.values.get("tracing"):
            observability.enable_tracing()
    except (ImportError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return None


def _listen_host(cfg: WorkerConfig) -> str:
    host = (cfg.listen or "127.0.0.1:0").rpartition(":")[0].strip("[]")
    return host or "127.0.0.1"
