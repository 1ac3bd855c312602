"""Bodies of test_fetch_paths: where the owner makes a to_here() answer (module-level, so the
workers resolve them by name)."""

from __future__ import annotations

import time
from typing import Any

import gradwire as gw
from gradwire.distributed import rpc

#: How long the blocker holds worker1's only serving thread.
BLOCK_SECONDS = 3.0


def ones(n: int) -> Any:
    return gw.ones(n)


def sleep_then(seconds: float, value: Any) -> Any:
    time.sleep(seconds)  # not a gradwire wait: the serving thread keeps its slot
    return value


def _timed(rref: rpc.RRef[Any]) -> tuple[Any, float]:
    started = time.monotonic()
    value = rref.to_here(timeout=30)
    return value, time.monotonic() - started


def fetch_paths(rank: int, world_size: int) -> dict[str, Any]:
    """worker1 serves with one thread: a ready plain value is answered while that thread is
    busy; any other value waits for it (its encoding may run user code, never on the loop)."""
    if rank != 0:
        return {}
    out: dict[str, Any] = {}
    # The fetch reaches the owner before the value is set: answered once it is.
    early = rpc.remote("worker1", sleep_then, (0.5, gw.arange(4.0)))
    out["early"] = early.to_here(timeout=30).tolist()
    tensor = rpc.remote("worker1", ones, (1 << 16,))
    number = rpc.remote("worker1", sleep_then, (0.0, 7))
    listed = rpc.remote("worker1", sleep_then, (0.0, [1, 2]))
    for rref in (tensor, number, listed):
        rref.to_here(timeout=30)  # created and set
    blocker = rpc.rpc_async("worker1", sleep_then, (BLOCK_SECONDS, "slept"))
    time.sleep(0.5)  # the blocker holds worker1's only serving thread
    value, out["tensor_seconds"] = _timed(tensor)
    out["tensor_sum"] = float(value.sum())
    out["number"], out["number_seconds"] = _timed(number)
    out["listed"], out["listed_seconds"] = _timed(listed)
    out["blocker"] = blocker.wait()
    return out
