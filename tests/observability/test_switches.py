"""Off by default, free when off, and gradwire without the observability extra."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
import urllib.request

import pytest
from gradwire import _traffic, observability
from gradwire._runtime.calls import hooks
from gradwire.server.cli.observe import observe
from gradwire.server.cli.run import add_run_arguments
from gradwire.server.cli.settings import ConfigError
from gradwire.server.cli.worker import build_parser
from gradwire.server.cli.worker_config import worker_config

BASE = {
    "GRADWIRE_NAME": "w0",
    "GRADWIRE_RANK": "0",
    "GRADWIRE_WORLD_SIZE": "1",
    "GRADWIRE_MASTER_ADDR": "127.0.0.1",
}


def _cfg(argv: list[str], env: dict[str, str]):  # type: ignore[no-untyped-def]
    args: argparse.Namespace = build_parser().parse_args(argv)
    return worker_config(args, {**BASE, **env})


def test_off_by_default() -> None:
    assert not observability.metrics_enabled() and not observability.tracing_enabled()
    assert _traffic.counts is None  # the transports count nothing
    assert all(h.context_only for h in hooks.registered())  # calls skip the hooks
    c = _cfg([], {})
    assert c.values["metrics_port"] is None and c.values["tracing"] is False


def test_worker_flags_and_variables() -> None:
    c = _cfg(["--metrics-port", "9400", "--tracing"], {})
    assert c.values["metrics_port"] == 9400 and c.values["tracing"] is True
    c = _cfg([], {"GRADWIRE_METRICS_PORT": "9401", "GRADWIRE_METRICS_HOST": "0.0.0.0"})
    assert c.values["metrics_port"] == 9401 and c.values["metrics_host"] == "0.0.0.0"
    with pytest.raises(ConfigError, match=r"\$GRADWIRE_METRICS_PORT='x'"):
        _cfg([], {"GRADWIRE_METRICS_PORT": "x"})
    # gradwire run's driver is a worker too
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(["--metrics-port", "9402", "mod:job"])
    run_cfg = worker_config(args, BASE, serve=False)
    assert run_cfg.values["metrics_port"] == 9402


def test_worker_serves_and_stops_metrics() -> None:
    pytest.importorskip("prometheus_client")
    c = _cfg(["--metrics-port", "0", "--listen", "127.0.0.1:0"], {})
    try:
        assert observe(c) is None
        assert observability.metrics_enabled() and _traffic.counts is not None
        port = observability.start_metrics_server(0)  # already serving: the same port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            body = resp.read().decode()
        assert 'gradwire_bytes_sent_total{route="grpc"}' in body
        assert any(not h.context_only for h in hooks.registered())
    finally:
        observability.stop_metrics_server()
    assert _traffic.counts is None and all(h.context_only for h in hooks.registered())


_WITHOUT_EXTRA = textwrap.dedent(
    """
    import importlib.abc, operator, sys

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
                raise ImportError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Missing())
    from gradwire import observability
    from gradwire.distributed import rpc
    from gradwire.distributed.rpc._testing import free_port

    opts = rpc.GrpcRpcBackendOptions(init_method=f"tcp://127.0.0.1:{free_port()}", token="t")
    rpc.init_rpc("solo", 0, 1, opts)
    assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3
    for start in (lambda: observability.start_metrics_server(0), observability.enable_tracing):
        try:
            start()
        except ImportError as exc:
            assert "gradwire[observability]" in str(exc), exc
        else:
            raise AssertionError("no ImportError")
    rpc.shutdown()
    print("ok")
    """
)


def test_gradwire_runs_without_the_extra() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRA], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
