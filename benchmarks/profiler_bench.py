"""What the profiler costs: the same ops and calls with no profile, and under one.

    python benchmarks/profiler_bench.py [--rounds 5]

Rows (median of each round, rounds interleaved off/on; the ratio is on / off of the same run):
a small op (``a + b`` of 8 floats), a factory (``ones(8)``), a small backward, and a noop
``rpc_sync`` between two workers on loopback (the caller profiling: the call carries
``CallHeader.profile`` and the callee records and returns its events). With no profile the
code paths are those of before the profiler plus one test of a module global per op, autograd
node and message (compare two commits by running this script with each on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

import gradwire as gw
from gradwire.autograd import profiler
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import free_port
from timing import median_seconds


def noop() -> None:
    return None


def _ops() -> dict[str, Any]:
    a, b = gw.ones(8), gw.ones(8)
    x = gw.ones(8, requires_grad=True)

    def backward() -> None:
        (x * x).sum().backward()

    return {
        "a + b (8 floats)": (lambda: a + b, 2000),
        "ones(8)": (lambda: gw.ones(8), 2000),
        "small backward": (backward, 300),
    }


def _time(fn: Any, n: int, profiled: bool) -> float:
    def batch() -> None:
        for _ in range(n):
            fn()

    if not profiled:
        return median_seconds(batch, 5) / n
    with profiler.profile():
        return median_seconds(batch, 5) / n


def _peer(rank: int, port: int) -> None:
    os.environ["GRADWIRE_TOKEN"] = "profiler-bench"
    opts = rpc.GrpcRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}")
    rpc.init_rpc(f"w{rank}", rank, 2, opts)
    rpc.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    ns = p.parse_args(argv)
    import multiprocessing as mp

    port = free_port()
    os.environ["GRADWIRE_TOKEN"] = "profiler-bench"
    peer = mp.get_context("spawn").Process(target=_peer, args=(1, port))
    peer.start()
    rpc.init_rpc("w0", 0, 2, rpc.GrpcRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}"))
    rows = {**_ops(), "noop rpc_sync (caller profiling)": (lambda: rpc.rpc_sync("w1", noop), 200)}
    got: dict[str, dict[bool, list[float]]] = {k: {False: [], True: []} for k in rows}
    try:
        for _ in range(ns.rounds):
            for name, (fn, n) in rows.items():
                for profiled in (False, True):
                    got[name][profiled].append(_time(fn, n, profiled))
    finally:
        rpc.shutdown()
        peer.join(60)
    print(f"profiler_bench: {ns.rounds} rounds interleaved; median per call (round range)")
    print("| measure | no profile | profiling | profiling / no profile |")
    print("|---|---|---|---|")
    for name, by in got.items():
        off, on = statistics.median(by[False]), statistics.median(by[True])

        def fmt(values: list[float]) -> str:
            m = statistics.median(values) * 1e6
            return f"{m:.2f} us ({min(values) * 1e6:.2f}-{max(values) * 1e6:.2f})"

        print(f"| {name} | {fmt(by[False])} | {fmt(by[True])} | {on / off:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
