"""Distributed autograd benchmark: one training-style iteration across two workers.

    python benchmarks/dist_autograd_bench.py [--iters 50] [--size 512]

Per iteration, inside a distributed autograd context: a forward rpc_sync that multiplies a
(size x size) activation by a weight on the peer, a loss on the caller, the distributed backward
pass, and get_gradients. Compared in the same run against the same computation in one process
(gradwire's local autograd) and, when ``torch`` is importable, torch.distributed.autograd over
TCP (TensorPipe with the "uv" transport). Prints the median time per iteration and the ratios.
Both contenders compute on one BLAS thread per process (torch.set_num_threads(1) and
OPENBLAS_NUM_THREADS=1): two workers share this machine's cores, and a second BLAS thread per
process only adds contention.
Install torch only in a separate benchmark environment: pip install torch==2.13.0.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import socket
import statistics
from typing import Any

from timing import median_seconds
from torch_env import run_where_torch_is


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gw_matmul(x: Any, w: Any) -> Any:
    return x @ w


def torch_matmul(x: Any, w: Any) -> Any:
    return x @ w


def _gw_worker(rank: int, port: int, token: str, iters: int, size: int, out: Any) -> None:
    os.environ["GRADWIRE_TOKEN"] = token
    import gradwire as gw
    import gradwire.distributed.autograd as dist_autograd
    import numpy as np
    from gradwire.distributed import rpc

    opts = rpc.GrpcRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}")
    rpc.init_rpc(f"w{rank}", rank, 2, opts)
    if rank == 0:
        rng = np.random.default_rng(0)
        x = gw.tensor(rng.standard_normal((size, size)).astype(np.float32), requires_grad=True)
        w = gw.tensor(rng.standard_normal((size, size)).astype(np.float32), requires_grad=True)

        def step() -> None:
            with dist_autograd.context() as cid:
                y = rpc.rpc_sync("w1", gw_matmul, (x, w))
                loss = (y * y).mean()
                dist_autograd.backward(cid, [loss])
                grads = dist_autograd.get_gradients(cid)
                assert grads[x].shape == x.shape

        out.put(("gradwire", median_seconds(step, iters)))
    rpc.shutdown()


def _torch_worker(rank: int, port: int, iters: int, size: int, out: Any) -> None:
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc

    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", _transports=["uv"], num_worker_threads=16
    )
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(size, size, generator=g, requires_grad=True)
        w = torch.randn(size, size, generator=g, requires_grad=True)

        def step() -> None:
            with dist_autograd.context() as cid:
                y = rpc.rpc_sync("w1", torch_matmul, (x, w))
                loss = (y * y).mean()
                dist_autograd.backward(cid, [loss])
                grads = dist_autograd.get_gradients(cid)
                assert grads[x].shape == x.shape

        out.put(("torch", median_seconds(step, iters)))
    rpc.shutdown()


def _local(iters: int, size: int) -> float:
    import gradwire as gw
    import numpy as np

    rng = np.random.default_rng(0)
    x = gw.tensor(rng.standard_normal((size, size)).astype(np.float32), requires_grad=True)
    w = gw.tensor(rng.standard_normal((size, size)).astype(np.float32), requires_grad=True)

    def step() -> None:
        y = x @ w
        (y * y).mean().backward()
        x.grad = w.grad = None

    return median_seconds(step, iters)


def _run_pair(target: Any, args: tuple[Any, ...]) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, out)) for r in range(2)]
    for p in procs:
        p.start()
    name, value = out.get(timeout=600)
    for p in procs:
        p.join(60)
    return float(value)


def main() -> None:
    run_where_torch_is()
    # One BLAS thread per process for gradwire's NumPy, as torch.set_num_threads(1) for torch;
    # set before NumPy is imported here or in the spawned workers (they inherit it).
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3, help="alternate gradwire/torch runs")
    ns = parser.parse_args()
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    # Alternate the contenders over several rounds (a noisy shared machine), keep medians.
    locals_, gws, torches = [], [], []
    for _ in range(ns.rounds):
        locals_.append(_local(ns.iters, ns.size))
        gws.append(_run_pair(_gw_worker, (secrets.token_hex(8), ns.iters, ns.size)))
        if have_torch:
            torches.append(_run_pair(_torch_worker, (ns.iters, ns.size)))
    local, gw_t = statistics.median(locals_), statistics.median(gws)
    torch_t = statistics.median(torches) if torches else None
    if torches:
        ratios = [g / t for g, t in zip(gws, torches)]
        print(f"per-round gradwire/torch ratios: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"iteration: rpc_sync matmul {ns.size}x{ns.size} on the peer + backward + get_gradients")
    print(f"{'one process (gradwire local)':34s} {local * 1e3:9.2f} ms")
    print(f"{'gradwire, 2 workers':34s} {gw_t * 1e3:9.2f} ms  ({gw_t / local:.2f}x local)")
    if torch_t is not None:
        print(f"{'torch.distributed.autograd (uv)':34s} {torch_t * 1e3:9.2f} ms")
        print(f"gradwire / torch: {gw_t / torch_t:.2f}")
    else:
        print("torch: not importable (install torch==2.13.0 in a benchmark environment)")


if __name__ == "__main__":
    main()
