"""The soak scenario: a training loop with distributed autograd and RRef churn, for a while.

Worker 0 trains a two-part linear model whose weights live on workers 1 and 2 (OwnerRRefs
made with ``remote()``); each step runs the forward through them inside a dist-autograd
context, a distributed backward, an SGD step on each owner from its context's gradients, and
RRef churn: a fresh ``remote()`` value, forked to a third worker, fetched, dropped. Before and
after, it takes a snapshot of every worker: owner RRefs, dist-autograd contexts, threads, open
descriptors, resident memory; after the loop it waits (bounded) for them to settle.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path
from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
import numpy as np
from gradwire.distributed import rpc

__all__ = ["soak", "finish", "snapshot", "make_weight", "forward", "sgd_step", "make_blob", "peek"]

DIM = 32
#: num_worker_threads of the soak cluster (GrpcRpcBackendOptions default).
POOL_THREADS = 16
#: How often the long run samples every worker's resident memory.
RSS_SAMPLE_SECONDS = 60.0


def make_weight(seed: int) -> gw.Tensor:
    rng = np.random.default_rng(seed)
    return gw.tensor(rng.standard_normal((DIM, 1)) * 0.1, dtype=gw.float64, requires_grad=True)


def forward(w: rpc.RRef, x: gw.Tensor) -> gw.Tensor:
    return x @ w.local_value()


def sgd_step(w: rpc.RRef, context_id: int, lr: float) -> None:
    weight = w.local_value()
    grad = dist_autograd.get_gradients(context_id)[weight]
    with gw.no_grad():
        weight.sub_(grad * lr)


def make_blob(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float32)


def peek(blob: rpc.RRef) -> int:
    return int(blob.to_here().shape[0])


def snapshot() -> dict[str, Any]:
    """This worker's counters (taken on a serving thread)."""
    gc.collect()
    info = rpc.get_debug_info()
    rss = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return {
        "owner_rrefs": int(info.get("num_owner_rrefs", 0)),
        "contexts": int(info.get("num_autograd_contexts", 0)),
        "threads": threading.active_count(),
        # The serving pool keeps up to num_worker_threads threads once it grew (by design);
        # every other thread must come back to the baseline.
        "serving_threads": int(info.get("serving_threads", 0)),
        "other_threads": threading.active_count() - int(info.get("serving_threads", 0)),
        "thread_names": sorted(
            t.name.rstrip("0123456789").rstrip("-_") for t in threading.enumerate()
        ),
        "fds": len(os.listdir("/proc/self/fd")),
        "rss_kib": rss,
    }


def _settled(base: dict[str, int], now: dict[str, int]) -> bool:
    # Every user reference is gone by now (the weights too): no OwnerRRef may remain.
    return (
        now["owner_rrefs"] == 0
        and now["contexts"] <= base["contexts"]
        and now["other_threads"] <= base["other_threads"] + 1
        and now["serving_threads"] <= POOL_THREADS
        and now["fds"] <= base["fds"] + 4
    )


_finished = threading.Event()


def finish() -> None:
    """Rank 0 is done: the other workers may start their shutdown."""
    _finished.set()


def soak(rank: int, world_size: int, seconds: float) -> Any:
    if rank != 0:
        # Serve until rank 0 is done: a graceful shutdown started now would give up at its
        # barrier after rpc_timeout and stop this worker under rank 0's running loop.
        _finished.wait(seconds + 600)
        return None
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal((2 * DIM, 1))
    weights = [rpc.remote(w, make_weight, (w,)) for w in (1, 2)]
    losses: list[float] = []

    def step(i: int) -> None:
        x = rng.standard_normal((16, 2 * DIM))
        target = gw.tensor(x @ true_w)
        xs = [gw.tensor(x[:, :DIM]), gw.tensor(x[:, DIM:])]
        with dist_autograd.context() as cid:
            ys = [rpc.rpc_sync(w.owner(), forward, (w, xi)) for w, xi in zip(weights, xs)]
            loss = ((ys[0] + ys[1] - target) ** 2).mean()
            dist_autograd.backward(cid, [loss])
            for w in weights:
                rpc.rpc_sync(w.owner(), sgd_step, (w, cid, 0.05))
        losses.append(float(loss.item()))
        # RRef churn: a value on one worker, forked to another, fetched here, dropped.
        owner = 1 + i % (world_size - 1)
        blob = rpc.remote(owner, make_blob, (64 + i % 7,))
        assert rpc.rpc_sync(1 + (owner % (world_size - 1)), peek, (blob,)) == 64 + i % 7
        assert blob.to_here().shape[0] == 64 + i % 7
        del blob

    for i in range(20):
        step(i)
    gc.collect()
    time.sleep(1.0)  # let the warm-up's deletes land before the baseline
    base = [rpc.rpc_sync(w, snapshot) for w in range(world_size)]
    # Resident memory of every worker about once a minute: does it level off?
    rss_series: list[tuple[float, list[int]]] = [(0.0, [b["rss_kib"] for b in base])]
    steps, start = 0, time.monotonic()
    next_sample = start + RSS_SAMPLE_SECONDS
    while time.monotonic() - start < seconds:
        step(steps)
        steps += 1
        if time.monotonic() >= next_sample:
            rss = [rpc.rpc_sync(w, snapshot)["rss_kib"] for w in range(world_size)]
            rss_series.append((round(time.monotonic() - start, 1), rss))
            next_sample += RSS_SAMPLE_SECONDS
    elapsed = time.monotonic() - start
    weights.clear()  # the last references to the OwnerRRefs
    gc.collect()
    settle_start = time.monotonic()
    end = [rpc.rpc_sync(w, snapshot) for w in range(world_size)]
    while not all(_settled(b, e) for b, e in zip(base, end)):
        if time.monotonic() - settle_start > 90:
            break
        time.sleep(0.5)
        end = [rpc.rpc_sync(w, snapshot) for w in range(world_size)]
    for w in range(1, world_size):
        rpc.rpc_sync(w, finish)
    return {
        "steps": steps,
        "seconds": elapsed,
        "steps_per_s": steps / elapsed if elapsed else 0.0,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "base": base,
        "end": end,
        "settled_s": time.monotonic() - settle_start,
        "rss_series": rss_series,
    }
