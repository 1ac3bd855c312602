"""Fixtures: an in-process world-size-1 worker over real gRPC on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import free_port


def solo_options(**overrides: object) -> rpc.GrpcRpcBackendOptions:
    """Options of a one-worker cluster on a free loopback port with a fixed token."""
    fields = {
        "init_method": f"tcp://127.0.0.1:{free_port()}",
        "token": "test-token",
        "rpc_timeout": 20.0,
        "init_timeout": 20.0,
    }
    fields.update(overrides)
    return rpc.GrpcRpcBackendOptions(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=["unix", "tcp"])
def solo(request: pytest.FixtureRequest) -> Iterator[rpc.WorkerInfo]:
    """This process as worker "solo" (rank 0 of 1), calling itself over a Unix domain socket
    or over loopback TCP; shut down after the module."""
    rpc.init_rpc("solo", 0, 1, solo_options(use_unix_socket=request.param == "unix"))
    dial = rpc.get_debug_info()["peers"][0]["address"]
    assert dial.startswith("unix:") == (request.param == "unix"), dial
    try:
        yield rpc.get_worker_info()
    finally:
        if rpc.is_initialized():
            rpc.shutdown(graceful=False)
