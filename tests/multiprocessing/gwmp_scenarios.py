"""Whole-program scenarios run as their own process by the leak and descriptor tests.

Usage: python gwmp_scenarios.py STRATEGY MODE. Prints ``TOKEN <manager token or ->`` first and
``LIVE <n>`` (this manager's files in /dev/shm) at checkpoints; the tests read those lines.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

import gradwire.multiprocessing as gmp
import gwmp_workers as w
import numpy as np


def _live() -> int:
    token = os.environ.get("GRADWIRE_SHM_MANAGER")
    if not token:
        return 0
    return sum(n.startswith(f"gradwire_fs_{token}_") for n in os.listdir("/dev/shm"))


def child(i: int, t: Any, mode: str, ready: Any) -> None:
    t._data[i] = i + 1.0  # map and touch the shared memory
    extra = w.tensor(np.ones(8))
    gmp.share_memory_(extra)  # a segment this child created itself
    ready.put((i, os.getpid()))
    if mode == "exception" and i == 1:
        raise RuntimeError("child failed on purpose")
    if mode == "kill_child" and i == 1:
        os.kill(os.getpid(), 9)
    if mode == "kill_parent":
        time.sleep(300)


def run(strategy: str, mode: str) -> None:
    gmp.set_sharing_strategy(strategy)
    t = w.tensor(np.zeros(1000))
    gmp.share_memory_(t)
    print("TOKEN", os.environ.get("GRADWIRE_SHM_MANAGER") or "-", flush=True)
    ready = gmp.get_context("spawn").SimpleQueue()  # written synchronously: survives kill -9
    ctx = gmp.spawn(child, args=(t, mode, ready), nprocs=2, join=False)
    assert ctx is not None
    pids = sorted(ready.get() for _ in range(2))
    print("READY", *[p for _, p in pids], flush=True)
    if mode == "kill_parent":
        print("LIVE", _live(), flush=True)
        time.sleep(300)  # the test kills us here
    if mode == "parent_raises":
        print("LIVE", _live(), flush=True)
        raise RuntimeError("parent failed on purpose while children still map the memory")
    try:
        ctx.join()
    except gmp.ProcessException as exc:
        print("FAILED", type(exc).__name__, exc.error_index, flush=True)
    assert t._data[0] == 1.0  # child 0's write is visible here
    print("LIVE", _live(), flush=True)


def many(n: int) -> None:
    """Receive ``n`` tensors and keep them all, under a descriptor limit far below ``n``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    ctx = gmp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    sender = ctx.Process(target=w.send_many, args=(q, n, done))
    sender.start()
    started = time.monotonic()
    kept = [q.get(timeout=60) for _ in range(n)]
    elapsed = time.monotonic() - started
    assert all(int(t._data[0]) == i for i, t in enumerate(kept))
    assert len({t._shared.seg_id for t in kept}) == n
    fds = len(os.listdir("/proc/self/fd"))
    kept[-1]._data[:] = -1.0
    done.set()
    sender.join(60)
    print("MANY", n, "fds", fds, "seconds", round(elapsed, 2), "exit", sender.exitcode, flush=True)


if __name__ == "__main__":
    if sys.argv[2] == "many":
        gmp.set_sharing_strategy(sys.argv[1])
        many(int(sys.argv[3]))
    else:
        run(sys.argv[1], sys.argv[2])
