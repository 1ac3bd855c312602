"""CPU per call on each side of a gradwire pair: steadier than wall time on a shared machine.

    python benchmarks/cpu_bench.py [--measure echo] [--calls 1500] [--rounds 3] [--same-host]

Two workers (TCP only unless ``--same-host``) in fresh processes each round; rank 0 runs the
measure ``--calls`` times and prints one line per round: the wall p50, the calling thread's CPU
per call (``time.thread_time``: on the lane that thread writes the call and reads the answer
itself) and the CPU of every thread of the peer per call (``/proc/<pid>/task/*/schedstat``).
Wall time on a two-core machine swings with whatever else runs; CPU time per call is what a
change to gradwire's own work moves, so compare two commits with it (alternate their runs).

Measures: ``noop`` (rpc_sync of a function returning None), ``echo`` (rpc_sync echo of a
1 MiB float32 tensor, summed on both sides, as rpc_bench's), ``pair`` (remote() of a 1 MiB
tensor made on the peer, to_here(), sum), ``autograd`` (rpc_bench's dist-autograd
iteration). Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rpc_bench import autograd_iteration, echo, gradwire_leaves, gw_ones, noop  # noqa: E402

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per process, as rpc_bench


def _process_cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far (threads that ended are not counted)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            pass
    return total / 1e9


def _measures(rpc: Any, dist_autograd: Any, gw: Any) -> dict[str, Any]:
    n = (1 << 20) // 4
    t = gw.ones(n)
    x, w = gradwire_leaves(gw)

    return {
        "noop": lambda: rpc.rpc_sync("w1", noop),
        "echo": lambda: rpc.rpc_sync("w1", echo, (t,)).sum(),
        "pair": lambda: rpc.remote("w1", gw_ones, (n,)).to_here().sum(),
        "autograd": lambda: autograd_iteration(rpc, dist_autograd, x, w),
    }


def _worker(rank: int, port: int, same_host: bool, measure: str, calls: int, conn: Any) -> None:
    os.environ.setdefault("GRADWIRE_TOKEN", "cpu-bench-token-0123456789abcdef")
    import gradwire as gw
    import gradwire.distributed.autograd as dist_autograd
    from gradwire.distributed import rpc

    extra = {} if same_host else {"use_unix_socket": False, "shm_transfer": False}
    options = rpc.GrpcRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=300, **extra
    )
    rpc.init_rpc(f"w{rank}", rank, 2, options)
    if rank == 0:
        fn = _measures(rpc, dist_autograd, gw)[measure]
        for _ in range(max(10, calls // 10)):  # warm up: connections, caches, pools
            fn()
        peer_pid = conn.recv()
        peer_before = _process_cpu_seconds(peer_pid)
        wall = []
        cpu0 = time.thread_time()
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            wall.append(time.perf_counter() - t0)
        cpu = time.thread_time() - cpu0
        peer = _process_cpu_seconds(peer_pid) - peer_before
        conn.send(
            {
                "p50_us": statistics.median(wall) * 1e6,
                "caller_cpu_us": cpu / calls * 1e6,
                "peer_cpu_us": peer / calls * 1e6,
            }
        )
    else:
        conn.send(os.getpid())
        conn.recv()  # rank 0 is done
    rpc.shutdown()


def run_round(measure: str, calls: int, same_host: bool) -> dict[str, float]:
    """One fresh pair of workers; the measure's figures."""
    ctx = mp.get_context("spawn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    to_driver, driver_end = ctx.Pipe()
    to_peer, peer_end = ctx.Pipe()
    procs = [
        ctx.Process(target=_worker, args=(0, port, same_host, measure, calls, driver_end)),
        ctx.Process(target=_worker, args=(1, port, same_host, measure, calls, peer_end)),
    ]
    for p in procs:
        p.start()
    try:
        if not to_peer.poll(120):
            raise RuntimeError("the peer did not start")
        to_driver.send(to_peer.recv())  # the peer's pid, for rank 0 to read its CPU time
        if not to_driver.poll(3600):
            raise RuntimeError("the measure did not finish")
        result: dict[str, float] = to_driver.recv()
        to_peer.send("done")
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", choices=("noop", "echo", "pair", "autograd"), default="echo")
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--same-host", action="store_true", help="defaults (shared memory)")
    ns = parser.parse_args()
    rows = []
    for r in range(ns.rounds):
        row = run_round(ns.measure, ns.calls, ns.same_host)
        rows.append(row)
        print(f"round {r + 1}: " + json.dumps({k: round(v) for k, v in row.items()}), flush=True)
    medians = {k: round(statistics.median(row[k] for row in rows)) for k in rows[0]}
    print(
        f"{ns.measure} ({'same host' if ns.same_host else 'TCP'}), medians: {json.dumps(medians)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
