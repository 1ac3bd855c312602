"""Run every scenario on a three-worker cluster of one framework; print the outcomes as JSON.

    python -m conformance.launch gradwire|torch OUT.json     (from tests/, or with it on sys.path)

gradwire's cluster is started with ``gradwire.distributed.rpc._testing.run_cluster`` (real
processes, gRPC on loopback); PyTorch's with spawned processes and TensorPipe over TCP.
Worker 0 runs the scenarios; the others serve until it is done.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import sys
from typing import Any

WORLD_SIZE = 3


def gradwire_body(rank: int, world_size: int) -> Any:
    from . import scenarios

    scenarios.set_framework("gradwire")
    return scenarios.run_all() if rank == 0 else None


def run_gradwire() -> dict[str, Any]:
    from gradwire.distributed.rpc._testing import run_cluster

    from . import scenarios

    scenarios.set_framework("gradwire")  # this process pickles the scenario functions too
    results = run_cluster(WORLD_SIZE, gradwire_body, timeout=300, options={"rpc_timeout": 60})
    return dict(results[0].value)


def _torch_worker(rank: int, port: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed.rpc as rpc

    from . import scenarios

    scenarios.set_framework("torch")
    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=16, rpc_timeout=60, _transports=["uv"]
    )
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=WORLD_SIZE, rpc_backend_options=options)
    try:
        if rank == 0:
            out.put(scenarios.run_all())
    finally:
        rpc.shutdown()


def run_torch() -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_torch_worker, args=(r, port, out)) for r in range(WORLD_SIZE)]
    for p in procs:
        p.start()
    try:
        results: dict[str, Any] = out.get(timeout=300)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return results


def main() -> int:
    framework, path = sys.argv[1], sys.argv[2]
    results = run_torch() if framework == "torch" else run_gradwire()
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
