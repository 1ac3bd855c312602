"""What the callable guard costs: the same calls with the guard on and off, in one run.

    python benchmarks/guard_bench.py [--calls 3000] [--rounds 3]

Two worker processes over loopback TCP (``use_unix_socket=False``, ``shm_transfer=False``),
both with ``callable_guard`` on, then both with it off, alternating for ``--rounds`` rounds.
Measures:
  * noop ``rpc_sync`` p50 of a function of the program (runs unguarded: what the audit hook
    costs every other event of the process);
  * ``rpc_sync`` p50 of ``operator.pos`` (allowed by the default lists: runs guarded);
  * ``rpc_async`` throughput with 64 calls in flight, of both.
Prints each figure per round and the on/off ratio of the medians (times: above 1 is slower
with the guard; throughput: below 1 is slower).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import operator
import os
import secrets
import socket
import statistics
import sys
import time
from typing import Any


def noop() -> None:
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _options(port: int, guard: bool) -> Any:
    from gradwire.distributed import rpc

    return rpc.GrpcRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}",
        use_unix_socket=False,
        shm_transfer=False,
        callable_guard=guard,
    )


def _peer(port: int, token: str, guard: bool, stop: Any) -> None:
    os.environ["GRADWIRE_TOKEN"] = token
    from gradwire.distributed import rpc

    rpc.init_rpc("peer", 1, 2, _options(port, guard))
    stop.wait()
    rpc.shutdown()


def _p50(fn: Any, args: tuple[Any, ...], calls: int) -> float:
    from gradwire.distributed import rpc

    for _ in range(200):
        rpc.rpc_sync("peer", fn, args)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        rpc.rpc_sync("peer", fn, args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _throughput(fn: Any, args: tuple[Any, ...], calls: int) -> float:
    from gradwire.distributed import rpc

    t0 = time.perf_counter()
    pending: list[Any] = []
    for _ in range(calls):
        pending.append(rpc.rpc_async("peer", fn, args))
        if len(pending) >= 64:
            pending.pop(0).wait()
    for fut in pending:
        fut.wait()
    return calls / (time.perf_counter() - t0)


def _caller(port: int, token: str, guard: bool, calls: int, out: Any) -> None:
    os.environ["GRADWIRE_TOKEN"] = token
    from gradwire.distributed import rpc

    rpc.init_rpc("caller", 0, 2, _options(port, guard))
    try:
        out.put(
            {
                "program noop p50 (us)": _p50(noop, (), calls),
                "operator.pos p50 (us)": _p50(operator.pos, (1,), calls),
                "program noop 64 in flight (calls/s)": _throughput(noop, (), calls),
                "operator.pos 64 in flight (calls/s)": _throughput(operator.pos, (1,), calls),
            }
        )
    finally:
        rpc.shutdown()


def _round(guard: bool, calls: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    port, token = _free_port(), secrets.token_hex(16)
    stop, out = ctx.Event(), ctx.Queue()
    peer = ctx.Process(target=_peer, args=(port, token, guard, stop))
    caller = ctx.Process(target=_caller, args=(port, token, guard, calls, out))
    peer.start()
    caller.start()
    try:
        result: dict[str, float] = out.get(timeout=600)
    finally:
        stop.set()  # both shut down together (the shutdown barrier waits for every worker)
        caller.join(60)
        peer.join(60)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    ns = parser.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for r in range(ns.rounds):
        for guard in (True, False):
            runs[guard].append(_round(guard, ns.calls))
            figures = ", ".join(f"{k} {v:,.0f}" for k, v in runs[guard][-1].items())
            print(f"round {r + 1} guard {'on ' if guard else 'off'}: {figures}", flush=True)
    print("median on / off:")
    for key in runs[True][0]:
        on = statistics.median(x[key] for x in runs[True])
        off = statistics.median(x[key] for x in runs[False])
        print(f"  {key}: {on:,.0f} / {off:,.0f} = {on / off:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
