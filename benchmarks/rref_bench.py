"""RRef benchmark: remote()+to_here() latency, and remote()+delete cycles without a leak.

    python benchmarks/rref_bench.py [--latency 2000] [--cycles 100000] [--window 256]

Two worker processes on this machine (``run_cluster``); worker0 drives, worker1 owns.

* latency: ``rpc.remote("worker1", f).to_here()`` per iteration (p50 / p99), beside a plain
  ``rpc_sync`` of the same function for reference;
* cycles: ``--cycles`` times ``remote()`` then drop the RRef, at most ``--window`` in flight,
  timed until the owner holds 0 OwnerRRefs (every delete arrived); expire its tombstones (a 1 s
  ``rref_tombstone_ttl``) and compare the owner's memory with its baseline taken after a
  warm-up: Python allocated blocks (``sys.getallocatedblocks``) and RSS.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import threading
import time
from typing import Any

log = logging.getLogger("rref_bench")


_done = threading.Event()


def small() -> int:
    return 1


def finish() -> None:
    """worker0 is done: worker1 may shut down (not earlier: a long wait at the shutdown barrier
    is not what this measures)."""
    _done.set()


def owner_memory() -> dict[str, int]:
    """On the owner: counters and memory after a full collection and tombstone expiry."""
    from gradwire._runtime import agent as _agent

    svc = _agent.current().rref
    gc.collect()
    svc.protocol.expire_tombstones()
    gc.collect()
    info = svc.protocol.debug_info()
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return {
        "owner_rrefs": info.num_owner_rrefs,
        "forks": info.num_forks,
        "tombstones": info.num_tombstones,
        "blocks": sys.getallocatedblocks(),
        "rss_kib": rss_pages * 4,
    }


def _percentiles(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def _cycles(n: int, window: int) -> float:
    """``n`` remote()+drop cycles, about ``window`` RRefs alive at once (created or with
    their delete still on the way); returns the seconds taken to issue them."""
    from gradwire._runtime import agent as _agent
    from gradwire.distributed import rpc

    svc = _agent.current().rref
    started = time.perf_counter()
    done = 0
    while done < n:
        batch = [rpc.remote(1, small) for _ in range(min(window, n - done))]
        for rref in batch:
            # Wait until the owner answered (internal: the public API has no blocking wait
            # short of to_here, which would add a round trip).
            rref._creation.future.wait(60)  # noqa: SLF001
        done += len(batch)
        del batch, rref
        svc.flush_releases(60)
        while svc._in_flight > window:  # noqa: SLF001 - the deletes of earlier batches
            time.sleep(0.001)
    return time.perf_counter() - started


def body(rank: int, world_size: int, latency_iters: int, cycles: int, window: int) -> Any:
    if rank != 0:
        _done.wait(3600)
        return None
    from gradwire._runtime import agent as _agent
    from gradwire.distributed import rpc

    for _ in range(50):  # warm up channels and threads
        rpc.remote(1, small).to_here()
        rpc.rpc_sync(1, small)
    samples = []
    for _ in range(latency_iters):
        t = time.perf_counter()
        rpc.remote(1, small).to_here()
        samples.append(time.perf_counter() - t)
    sync = []
    for _ in range(latency_iters):
        t = time.perf_counter()
        rpc.rpc_sync(1, small)
        sync.append(time.perf_counter() - t)
    _cycles(min(2000, cycles), window)  # warm-up of the cycle path before the baseline
    baseline = _settled_owner()
    started = time.perf_counter()
    issued = _cycles(cycles, window)
    _owner_empty()  # every delete delivered: the cycle is complete only then
    seconds = time.perf_counter() - started
    after = _settled_owner()
    svc = _agent.current().rref
    gc.collect()
    svc.flush_releases(30)
    rpc.rpc_sync(1, finish)
    return {
        "remote_to_here_ms": [x * 1e3 for x in _percentiles(samples)],
        "rpc_sync_ms": [x * 1e3 for x in _percentiles(sync)],
        "cycles": cycles,
        "cycles_per_s": cycles / seconds,
        "issue_per_s": cycles / issued,
        "baseline": baseline,
        "after": after,
        "caller_users_left": svc.protocol.debug_info().num_users,
    }


def _owner_empty(timeout: float = 600.0) -> None:
    """Wait until the owner holds no OwnerRRef (every delete arrived)."""
    from gradwire._runtime import agent as _agent
    from gradwire.distributed import rpc

    gc.collect()
    _agent.current().rref.flush_releases(30)
    deadline = time.monotonic() + timeout
    while rpc.rpc_sync(1, owner_memory)["owner_rrefs"] and time.monotonic() < deadline:
        time.sleep(0.05)


def _settled_owner() -> dict[str, int]:
    from gradwire.distributed import rpc

    _owner_empty()
    time.sleep(1.2)  # let the 1 s tombstones expire
    return rpc.rpc_sync(1, owner_memory)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=int, default=2000, help="remote()+to_here() samples")
    parser.add_argument("--cycles", type=int, default=100_000, help="remote()+delete cycles")
    parser.add_argument("--window", type=int, default=256, help="remote() calls in flight")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from gradwire.distributed.rpc._testing import run_cluster

    out = run_cluster(
        2,
        body,
        args.latency,
        args.cycles,
        args.window,
        timeout=3600,
        options={"rref_tombstone_ttl": 1.0, "rpc_timeout": 120.0},
    )[0].value
    b, a = out["baseline"], out["after"]
    log.info("remote()+to_here(): p50 %.3f ms, p99 %.3f ms", *out["remote_to_here_ms"])
    log.info("rpc_sync (reference): p50 %.3f ms, p99 %.3f ms", *out["rpc_sync_ms"])
    log.info(
        "%d remote()+delete cycles: %.0f cycles/s until the owner held none (remote() issued "
        "at %.0f/s)",
        out["cycles"],
        out["cycles_per_s"],
        out["issue_per_s"],
    )
    log.info(
        "owner after: %d OwnerRRefs, %d forks, %d tombstones; caller: %d UserRRefs left",
        a["owner_rrefs"],
        a["forks"],
        a["tombstones"],
        out["caller_users_left"],
    )
    log.info(
        "owner memory: %d -> %d Python blocks (%+d), RSS %d -> %d KiB (%+d)",
        b["blocks"],
        a["blocks"],
        a["blocks"] - b["blocks"],
        b["rss_kib"],
        a["rss_kib"],
        a["rss_kib"] - b["rss_kib"],
    )


if __name__ == "__main__":
    main()
