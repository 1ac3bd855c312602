"""Bodies of the fast-lane tests (module level: spawned workers import them)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gradwire.distributed import rpc
from gradwire.futures import Future


def noop() -> None:
    return None


def echo(x: Any) -> Any:
    return x


@rpc.functions.async_execution
def later(n: int) -> Future[int]:
    return rpc.rpc_async(0, echo, (n + 1,))  # rank 0: not counted by rank 1's fast lane


def rref_len(r: rpc.RRef) -> int:
    return len(r.to_here())


def lane_count() -> int:
    return int(rpc.get_debug_info()["calls_served_fast_lane"])


def pipe_count() -> int:
    return int(rpc.get_debug_info()["bulk_lane"]["counters"].get("pipe_calls_served", 0))


def routing(rank: int, world_size: int) -> Any:
    """Rank 0 calls rank 1 in every way; how many of them the fast lane served."""
    if rank != 0:
        return None
    before = rpc.rpc_sync(1, lane_count)
    piped = rpc.rpc_sync(1, pipe_count)
    plain = [rpc.rpc_sync(1, echo, (i,)) for i in range(5)]
    plain += [rpc.rpc_async(1, echo, (i,)).wait() for i in range(5, 10)]
    big = np.arange(300_000, dtype=np.float64)  # 2.4 MB: a reply parked behind FetchReply
    same = bool((rpc.rpc_sync(1, echo, (big,)) == big).all())
    deferred = [rpc.rpc_sync(1, later, (i,)) for i in range(3)]
    deferred += [rpc.rpc_async(1, later, (i,)).wait() for i in range(3)]
    owner = rpc.remote(0, echo, ([1, 2, 3],))
    with_rref = rpc.rpc_sync(1, rref_len, (owner,))
    after = rpc.rpc_sync(1, lane_count)
    piped = rpc.rpc_sync(1, pipe_count) - piped
    return {
        "plain": plain,
        "big_equal": same,
        "deferred": deferred,
        "with_rref": with_rref,
        # lane_count itself is a plain call: the one that read `before` counted.
        "lane_calls": after - before,
        "pipe_calls": piped,
    }


def text(n: int) -> str:
    return "x" * n


def arange(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float32)


def fail(message: str) -> None:
    raise ValueError(message)


def keywords(a: int, b: int = 2) -> tuple[int, int]:
    return a, b
