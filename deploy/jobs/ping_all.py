"""A small job for gradwire run: every worker answers rpc_sync, tensors make the round trip.

Used by deploy/netns/cluster.sh until (and beside) the demo job. Only gradwire and operator
functions travel, so the workers need nothing but the gradwire package.

    gradwire run deploy/jobs/ping_all.py                 # one round; exit 0 when all answered
    gradwire run deploy/jobs/ping_all.py --until-failure --max-seconds 60
        # keep pinging every 0.2 s; on the first failure print which worker and how, exit 1
"""

from __future__ import annotations

import argparse
import operator
import sys
import time

import gradwire as gw
from gradwire.distributed import rpc

__all__ = ["main", "ping_round", "lanes"]


def ping_round(timeout: float) -> list[str]:
    """Call every other worker once; returns their names.

    Raises:
        Whatever rpc_sync raises for the first worker that fails (a RpcTimeoutError when its
        link is down), with the worker's name added to the message.
    """
    me = rpc.get_worker_info().name
    names = [p["name"] for p in rpc.get_debug_info()["peers"] if p["name"] != me]
    x = gw.arange(4.0)
    big = gw.ones(1 << 18)  # 1 MiB: the bulk lane's size when the peer is on another host
    for name in names:
        try:
            info = rpc.rpc_sync(name, rpc.get_worker_info, timeout=timeout)
            y = rpc.rpc_sync(name, operator.add, (x, x), timeout=timeout)
            z = rpc.rpc_sync(name, operator.add, (big, big), timeout=timeout)
        except Exception as exc:
            raise RuntimeError(f"worker {name!r} failed: {type(exc).__name__}: {exc}") from exc
        if info.name != name or not gw.allclose(y, x * 2) or float(z.sum()) != 2 * big.numel():
            raise RuntimeError(f"worker {name!r} answered wrongly: {info!r}, {y!r}")
    return names


def lanes(names: list[str]) -> str:
    """Which second ports carried the round: peers reached over a fast lane, tensors over the
    bulk lane (shared memory on one host instead)."""
    info = rpc.get_debug_info()
    fast = sum(1 for p in info["peers"] if p["name"] in names and p.get("fast_lane_address"))
    counters = info.get("bulk_lane", {}).get("counters", {})
    return (
        f"fast lane to {fast} of {len(names)} workers, bulk lane sent {counters.get('sent', 0)} "
        f"and took {counters.get('taken', 0)} tensors"
    )


def main() -> int:
    """Entry point for ``gradwire run``."""
    parser = argparse.ArgumentParser(prog="ping_all")
    parser.add_argument("--until-failure", action="store_true")
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=0.2)
    args = parser.parse_args(sys.argv[1:])
    timeout = rpc.get_rpc_timeout() or 60.0
    if not args.until_failure:
        names = ping_round(timeout)
        print(f"ping_all: {len(names)} workers answered: {', '.join(names)}", flush=True)
        print(f"ping_all: {lanes(names)}", flush=True)
        return 0
    started = time.monotonic()
    rounds = 0
    while time.monotonic() - started < args.max_seconds:
        try:
            ping_round(timeout)
        except RuntimeError as exc:
            print(f"ping_all: FAILED at {time.time():.3f} after {rounds} rounds: {exc}", flush=True)
            return 1
        rounds += 1
        print(f"ping_all: round {rounds} ok at {time.time():.3f}", flush=True)
        time.sleep(args.interval)
    print(f"ping_all: no failure within {args.max_seconds} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
