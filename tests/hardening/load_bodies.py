"""The load scenario, run on every worker: many concurrent callers, mixed calls, figures.

Each worker starts ``callers`` threads; each makes ``per_caller`` calls to random workers,
cycling through: ``rpc_sync``, ``rpc_async().wait()``, a nested call (the callee calls a third
worker), and ``remote()`` + ``to_here()`` (the RRef is dropped right after). It returns its
latencies by kind, its error messages, and its resident memory after a warm-up and at the end.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from gradwire.distributed import rpc

KINDS = ("sync", "async", "nested", "remote")


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a + b


def relay(dst: int, a: np.ndarray) -> np.ndarray:
    """A nested call: on to worker ``dst``."""
    return rpc.rpc_sync(dst, add, (a, a))


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def owner_rrefs() -> int:
    return int(rpc.get_debug_info().get("num_owner_rrefs", 0))


def _one(kind: str, rng: random.Random, world_size: int) -> None:
    dst = rng.randrange(world_size)
    a = np.full(rng.choice([1, 16, 256]), float(rng.randrange(100)))
    if kind == "sync":
        out = rpc.rpc_sync(dst, add, (a, a))
    elif kind == "async":
        out = rpc.rpc_async(dst, add, (a, a)).wait()
    elif kind == "nested":
        out = rpc.rpc_sync(dst, relay, (rng.randrange(world_size), a))
    else:
        rref = rpc.remote(dst, add, (a, a))
        out = rref.to_here()
        del rref
    if not np.array_equal(out, a + a):
        raise AssertionError(f"{kind} to {dst}: wrong result")


def _run(
    rank: int, world_size: int, callers: int, per_caller: int, seed: int, kinds: tuple[str, ...]
) -> tuple[dict[str, list[float]], list[str]]:
    lat: dict[str, list[float]] = {k: [] for k in KINDS}
    errors: list[str] = []
    lock = threading.Lock()

    def caller(i: int) -> None:
        rng = random.Random(seed * 1_000_003 + rank * 1009 + i)
        mine: dict[str, list[float]] = {k: [] for k in KINDS}
        for n in range(per_caller):
            kind = kinds[(n + i) % len(kinds)]
            start = time.perf_counter()
            try:
                _one(kind, rng, world_size)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{kind}: {type(exc).__name__}: {exc}"[:300])
                continue
            mine[kind].append(time.perf_counter() - start)
        with lock:
            for k in KINDS:
                lat[k].extend(mine[k])

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(callers)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 3600
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        errors.append("a caller thread did not finish within an hour")
    return lat, errors


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


def load(
    rank: int,
    world_size: int,
    callers: int,
    per_caller: int,
    seed: int,
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, Any]:
    """Warm up (a tenth of the calls), then the measured run; figures of this worker.

    A hung run dumps every thread's stack to stderr after ``$GRADWIRE_LOAD_DUMP_AFTER`` s.
    """
    faulthandler.dump_traceback_later(float(os.environ.get("GRADWIRE_LOAD_DUMP_AFTER", "200")))
    warm = max(1, per_caller // 10)
    _run(rank, world_size, callers, warm, seed + 1, kinds)
    gc.collect()
    rss_warm = rss_kib()
    threads_warm = threading.active_count()
    start = time.perf_counter()
    lat, errors = _run(rank, world_size, callers, per_caller, seed, kinds)
    elapsed = time.perf_counter() - start
    gc.collect()
    faulthandler.cancel_dump_traceback_later()
    everything = [v for vs in lat.values() for v in vs]
    return {
        "calls": len(everything),
        "errors": errors[:20],
        "num_errors": len(errors),
        "seconds": elapsed,
        "p50_ms": {k: _pct(v, 50) for k, v in lat.items()} | {"all": _pct(everything, 50)},
        "p99_ms": {k: _pct(v, 99) for k, v in lat.items()} | {"all": _pct(everything, 99)},
        "rss_warm_kib": rss_warm,
        "rss_end_kib": rss_kib(),
        "threads_warm": threads_warm,
    }


__all__ = ["KINDS", "add", "relay", "load", "rss_kib", "owner_rrefs"]
