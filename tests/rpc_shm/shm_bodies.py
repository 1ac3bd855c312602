"""Functions run on spawned workers by the shared-memory transfer tests (resolved by name)."""

from __future__ import annotations

import glob
import os
import signal
import threading
import time
from typing import Any

import numpy as np
from gradwire.distributed import rpc
from gradwire.futures import wait_all

MiB = 1 << 20
_kept: dict[str, Any] = {}


def echo(x: Any) -> Any:
    return x


def stats() -> dict[str, int]:
    from gradwire._wire import shm

    return shm.stats()


def pool_stats() -> dict[str, dict[str, int]]:
    from gradwire._runtime.transport.shm_route import pool_stats as ps

    return ps()


def keep(key: str, x: Any) -> float:
    """Store a received tensor; return its sum."""
    _kept[key] = x
    return float(np.asarray(x).sum())


def kept_sum(key: str) -> float:
    return float(np.asarray(_kept[key]).sum())


def kept_equals(key: str, value: float) -> bool:
    return bool(np.all(np.asarray(_kept[key]) == value))


def write_kept(key: str, value: float) -> None:
    _kept[key][...] = value


def make_source(nbytes: int, value: float) -> np.ndarray:
    """Create, keep and return an array (the reply direction)."""
    _kept["source"] = np.full(nbytes // 8, value, dtype=np.float64)
    return _kept["source"]


def keep_many(index: int, x: np.ndarray) -> int:
    _kept.setdefault("many", {})[index] = x
    return int(x[0])


def check_many() -> list[int]:
    """Indices whose kept array no longer holds its own index everywhere."""
    return [i for i, x in _kept.get("many", {}).items() if not np.all(x == i)]


# -- scenarios -----------------------------------------------------------------------------------


def same_host_and_threshold(rank: int, world_size: int) -> Any:
    """Rank 0 echoes tensors below and above the 2 MiB threshold; reports both sides' counters."""
    if rank != 0:
        return None
    import gradwire

    small = np.arange(MiB // 8, dtype=np.float64)  # 1 MiB: streams
    big = np.arange(3 * MiB // 8, dtype=np.float64)  # 3 MiB: shared memory
    out_small = rpc.rpc_sync(1, echo, (small,))
    after_small = (stats(), rpc.rpc_sync(1, stats))
    out_big = rpc.rpc_sync(1, echo, (big,))
    t = gradwire.tensor(np.ones((512, 1024), dtype=np.float32), requires_grad=True)  # 2 MiB
    out_t = rpc.rpc_sync(1, echo, (t,))
    strided = np.arange(4 * MiB // 8, dtype=np.float64).reshape(512, -1)[:, ::2]  # 2 MiB view
    out_strided = rpc.rpc_sync(1, echo, (strided,))
    return {
        "equal": bool(
            np.array_equal(out_small, small)
            and np.array_equal(out_big, big)
            and np.array_equal(out_strided, strided)
            and np.array_equal(out_t.detach().numpy(), t.detach().numpy())
        ),
        "t_requires_grad": out_t.requires_grad,
        "strided_shape": out_strided.shape,
        "after_small": after_small,
        "end": (stats(), rpc.rpc_sync(1, stats)),
        "dial": rpc.get_debug_info()["peers"][1]["address"],
        "debug": rpc.get_debug_info()["shm_transfer"],
    }


def by_value(rank: int, world_size: int) -> Any:
    """Writes after a transfer are seen by neither side, in both directions."""
    if rank != 0:
        return None
    n = 4 * MiB
    checks: dict[str, bool] = {}
    # Call direction: the callee keeps what it received; the caller writes its original.
    x = np.full(n // 8, 1.0)
    rpc.rpc_sync(1, keep, ("a", x))
    x[:] = -5.0
    checks["callee_keeps_old_value"] = rpc.rpc_sync(1, kept_equals, ("a", 1.0))
    rpc.rpc_sync(1, write_kept, ("a", 7.0))
    checks["caller_unaffected_by_callee_write"] = bool(np.all(x == -5.0))
    # The pool must not hand the segment "a" sits in to the next transfer while "a" is alive.
    for value in (2.0, 3.0, 4.0):
        rpc.rpc_sync(1, keep, (f"b{value}", np.full(n // 8, value)))
    checks["kept_survives_later_transfers"] = rpc.rpc_sync(1, kept_equals, ("a", 7.0)) and all(
        rpc.rpc_sync(1, kept_equals, (f"b{v}", v)) for v in (2.0, 3.0, 4.0)
    )
    # Reply direction: the callee keeps its source; both sides write afterwards.
    y = rpc.rpc_sync(1, make_source, (n, 3.0))
    rpc.rpc_sync(1, write_kept, ("source", 9.0))
    checks["caller_does_not_see_callee_write"] = bool(np.all(y == 3.0))
    y[:] = 11.0
    checks["callee_does_not_see_caller_write"] = rpc.rpc_sync(1, kept_equals, ("source", 9.0))
    # Earlier results stay intact while later replies reuse the callee's pool.
    y2 = rpc.rpc_sync(1, make_source, (n, 4.0))
    y3 = rpc.rpc_sync(1, make_source, (n, 5.0))
    checks["held_replies_intact"] = bool(
        np.all(y == 11.0) and np.all(y2 == 4.0) and np.all(y3 == 5)
    )
    del y2, y3
    checks["used_shm"] = stats().get("sent", 0) >= 4 and stats().get("received", 0) >= 3
    return checks


def concurrent_reuse(rank: int, world_size: int, calls: int) -> Any:
    """Many transfers in flight at once from several threads, every one with its own content."""
    if rank != 0:
        return None
    n = 2 * MiB
    bad: list[int] = []
    lock = threading.Lock()

    def sender(start: int) -> None:
        futs = []
        for i in range(start, calls, 4):
            x = np.full(n // 8, float(i))
            futs.append((i, rpc.rpc_async(1, echo, (x,))))
            x[:] = -1.0  # by value: the write after sending must not travel
        for i, fut in futs:
            if not np.all(fut.wait() == i):
                with lock:
                    bad.append(i)

    threads = [threading.Thread(target=sender, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # The callee keeps half of what it receives while more transfers run.
    futs = [rpc.rpc_async(1, keep_many, (i, np.full(n // 8, float(i)))) for i in range(calls // 2)]
    wait_all(futs)
    for i in range(calls):
        rpc.rpc_sync(1, echo, (np.full(n // 8, float(-i)),))
    return {
        "bad": bad,
        "kept_corrupted": rpc.rpc_sync(1, check_many),
        "pool": pool_stats(),
        "callee_pool": rpc.rpc_sync(1, pool_stats),
    }


def kill_mid_transfer(rank: int, world_size: int, victim: int) -> Any:
    """The survivor streams 32 MiB echoes (3 in flight) at ``victim``, which SIGKILLs itself
    after a second: it dies while receiving arguments and sending replies."""
    if rank == victim:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
        time.sleep(30)
        return None
    from gradwire.multiprocessing._shm_manager import ENV_VAR, SHM_DIR, segment_prefix

    pattern = os.path.join(SHM_DIR, segment_prefix(os.environ[ENV_VAR]) + "*")
    x = np.ones(32 * MiB // 8)
    deadline = time.monotonic() + 20
    done = seen = 0
    error = None
    while time.monotonic() < deadline and error is None:
        futs = [rpc.rpc_async(victim, echo, (x,)) for _ in range(3)]
        for fut in futs:
            try:
                fut.wait(30)
                done += 1
            except Exception as exc:  # noqa: BLE001 - the peer died: what this test is about
                error = type(exc).__name__
        seen = max(seen, len(glob.glob(pattern)))
    # Calls the dead peer never took gave their segments back to this worker's pool.
    left = pool_stats().get(f"worker{victim}", {}).get("in_flight", -1)
    return {"done": done, "error": error, "seen": seen, "in_flight": left}


def to_here_by_value(rank: int, world_size: int) -> Any:
    """remote() + to_here() of a value the owner keeps: fetched through shared memory, by value."""
    if rank != 0:
        return None
    n = 4 * MiB
    before = stats().get("received", 0)
    rref = rpc.remote(1, make_source, (n, 3.0))
    v = rref.to_here()
    rpc.rpc_sync(1, write_kept, ("source", 9.0))  # the owner writes its value after the fetch
    checks = {"user_does_not_see_owner_write": bool(np.all(v == 3.0))}
    v[:] = 11.0
    checks["owner_does_not_see_user_write"] = rpc.rpc_sync(1, kept_equals, ("source", 9.0))
    checks["second_fetch_sees_owner_value"] = bool(np.all(rref.to_here() == 9.0))
    checks["fetched_through_shm"] = stats().get("received", 0) - before >= 2
    del rref
    return checks


def repeated_transfers(rank: int, world_size: int, n: int) -> Any:
    """Rank 0 echoes a 1 MiB tensor ``n`` times, keeping the third reply; both sides' counters
    and whether the kept reply still holds its own values."""
    if rank != 0:
        return None
    kept = None
    for i in range(n):
        out = rpc.rpc_sync(1, echo, (np.full(MiB // 8, float(i)),))
        assert out[0] == float(i) and out[-1] == float(i)
        if i == 2:
            kept = out
    assert kept is not None
    return {
        "kept_intact": bool((kept == 2.0).all()),
        "caller": stats(),
        "callee": rpc.rpc_sync(1, stats),
        "cache": rpc.rpc_sync(1, cache_info),
    }


def cache_info() -> dict[str, int]:
    from gradwire._wire import shm

    return shm.cache_info()
