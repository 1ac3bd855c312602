"""A call to oneself over RPC: the receiver shares the sender's process, so it copies out."""

from __future__ import annotations

import numpy as np
from gradwire._wire import shm
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import free_port

from . import shm_bodies as bodies


def test_self_call_copies_out_of_the_own_segment() -> None:
    options = rpc.GrpcRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{free_port()}", token="t", rpc_timeout=30, init_timeout=30
    )
    rpc.init_rpc("solo", 0, 1, options)
    try:
        shm.reset_stats()
        x = np.arange(bodies.MiB // 2, dtype=np.float64)  # 4 MiB
        ys = [rpc.rpc_sync("solo", bodies.echo, (x + i,)) for i in range(4)]
        x[:] = -1
        assert all(np.array_equal(y, np.arange(bodies.MiB // 2) + i) for i, y in enumerate(ys))
        counts = shm.stats()
        # Each call and reply went through a segment of this process and was copied out of it.
        assert counts["sent"] == 8 and counts["received_local"] == 8
        assert counts.get("received", 0) == 0
        pools = rpc.get_debug_info()["shm_transfer"]["pools"]["solo"]
        assert pools["reused"] >= 4 and pools["in_flight"] == 0
    finally:
        rpc.shutdown(graceful=False)
