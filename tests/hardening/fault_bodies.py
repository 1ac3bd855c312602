"""Functions run on spawned workers by the fault-injection scenarios (test_faults.py).

Worker names: ``worker{rank}``. Rank 0 drives, rank 1 is the victim (behind the fault proxy or
killed), rank 2 a bystander. Every wait has a deadline; results are plain dicts.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
import numpy as np
from gradwire.distributed import rpc
from gradwire.errors import RpcTimeoutError, WorkerUnavailableError

from .faultproxy import command

_tags: list[str] = []
_tags_lock = threading.Lock()


# -- run on the callee ----------------------------------------------------------------------------
def record(tag: str) -> int:
    """Non-idempotent: remember that the call ``tag`` ran (once per run)."""
    with _tags_lock:
        _tags.append(tag)
        return len(_tags)


def all_tags() -> list[str]:
    with _tags_lock:
        return list(_tags)


def scale(x: gw.Tensor) -> gw.Tensor:
    return x * 2.0


def num_contexts() -> int:
    return int(rpc.get_debug_info()["num_autograd_contexts"])


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def die(*_: Any) -> None:
    """SIGKILL this worker in the middle of serving a call."""
    os.kill(os.getpid(), signal.SIGKILL)


def die_in_backward(x: gw.Tensor) -> gw.Tensor:
    """Forward is x * 3; its backward SIGKILLs this worker."""

    class Fatal(gw.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: gw.Tensor) -> gw.Tensor:
            return t * 3.0

        @staticmethod
        def backward(ctx: Any, g: gw.Tensor) -> gw.Tensor:
            die()
            return g  # pragma: no cover

    return Fatal.apply(x)


# -- helpers ---------------------------------------------------------------------------------
def wait_until(check: Callable[[], bool], timeout: float, step: float = 0.1) -> float:
    """Seconds until ``check()`` held; raises TimeoutError after ``timeout``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - start


def _lost() -> list[str]:
    return list(rpc.get_debug_info().get("peers_lost", []))


def _timed(fn: Callable[[], Any]) -> tuple[str, float]:
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the scenario reports what it saw
        return f"{type(exc).__name__}: {exc}", time.monotonic() - start
    return "ok", time.monotonic() - start


# -- scenarios ---------------------------------------------------------------------------------
def partition_and_heal(rank: int, world_size: int, control: tuple[str, int], mode: str) -> Any:
    """Rank 0 cuts worker1 off (``mode``: blackhole or reset), calls it, heals, checks."""
    if rank != 0:
        return None
    w1 = "worker1"
    assert rpc.rpc_sync(w1, record, ("before",)) == 1
    x = gw.ones(4, requires_grad=True)
    with dist_autograd.context():
        rpc.rpc_sync(w1, scale, (x,))
        contexts_before = rpc.rpc_sync(w1, num_contexts)
        command(control, mode)
        cut = time.monotonic()
    # Leaving the context sent ReleaseContext to worker1 (a control message, retried).
    outcomes = [
        _timed(lambda i=i: rpc.rpc_sync(w1, record, (f"sync-{i}",), timeout=1.0)) for i in range(3)
    ]
    fut = rpc.rpc_async(w1, record, ("async",), timeout=1.0)
    outcomes.append(_timed(fut.wait))
    partition_s = time.monotonic() - cut
    command(control, "pass")
    healed = time.monotonic()
    attempts = iter(range(1000))

    def call_after() -> bool:
        # The test's own retry (the framework never retries a user call): the channel may
        # still be in its reconnect backoff for a moment after the heal.
        try:
            rpc.rpc_sync(w1, record, (f"after-{next(attempts)}",), timeout=5.0)
        except WorkerUnavailableError:
            return False
        return True

    wait_until(call_after, 20.0)
    healed_call = ("ok", time.monotonic() - healed)
    released_in = wait_until(lambda: rpc.rpc_sync(w1, num_contexts) == 0, 30.0)
    return {
        "contexts_before": contexts_before,
        "outcomes": outcomes,
        "partition_s": partition_s,
        "healed_call": healed_call,
        "released_after_heal_s": released_in,
        "tags": rpc.rpc_sync(w1, all_tags),
        "lost": _lost(),
    }


def kill_during_call(rank: int, world_size: int, big: int) -> Any:
    """worker1 creates a context on the others, then rank 0 kills it with a call."""
    if rank == 1:
        x = gw.ones(4, requires_grad=True)
        with dist_autograd.context():
            rpc.rpc_sync("worker0", scale, (x,))
            rpc.rpc_sync("worker2", scale, (x,))
            threading.Event().wait(120)  # killed long before
        return None
    wait_until(lambda: num_contexts() == 1, 30.0)  # worker1's context, here
    if rank == 2:
        reclaimed = wait_until(lambda: num_contexts() == 0, 60.0)
        return {"reclaimed_s": reclaimed, "lost": _lost()}
    pending = [rpc.rpc_async("worker1", nap, (60.0,)) for _ in range(3)]
    payload = np.ones(big // 8)  # large enough for the shared-memory path
    start = time.monotonic()
    call = _timed(lambda: rpc.rpc_sync("worker1", die, (payload,)))
    others = []
    for f in pending:
        others.append(_timed(f.wait))
    pending_done = time.monotonic() - start
    reclaimed = wait_until(lambda: num_contexts() == 0, 60.0)
    return {
        "call": call,
        "pending": others,
        "pending_done_s": pending_done,
        "reclaimed_s": time.monotonic() - start,
        "reclaimed_wait_s": reclaimed,
        "lost": _lost(),
        "after": _timed(lambda: rpc.rpc_sync("worker1", record, ("ghost",), timeout=5.0)),
        "shm": _shm_stats(),
    }


def _shm_stats() -> dict[str, int]:
    from gradwire._wire import shm

    return shm.stats()


def kill_during_backward(rank: int, world_size: int) -> Any:
    """Rank 0 runs a distributed backward whose step on worker1 SIGKILLs it."""
    if rank != 0:
        if rank == 1:
            threading.Event().wait(120)  # killed by the backward
        return None
    x = gw.ones(4, requires_grad=True)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", die_in_backward, (x,))
        z = rpc.rpc_sync("worker2", scale, (y,))
        outcome = _timed(lambda: dist_autograd.backward(cid, [z.sum()]))
    contexts_left = num_contexts()
    return {"backward": outcome, "contexts_left": contexts_left, "lost": _lost()}


def kill_during_shutdown(rank: int, world_size: int, timeout: float) -> Any:
    """Everyone shuts down gracefully; worker1 is killed while at the shutdown barrier."""
    if rank == 1:
        # A call of its own still pending keeps it in SHUTTING_DOWN, short of the barrier,
        # where the others already wait for it; it dies there.
        rpc.rpc_async("worker0", nap, (1.0,))
        threading.Timer(0.5, die).start()
        rpc.shutdown(graceful=True, timeout=timeout)
        return None  # pragma: no cover - killed
    rpc.rpc_sync("worker1", record, ("hello",))
    outcome = _timed(lambda: rpc.shutdown(graceful=True, timeout=timeout))
    return {"shutdown": outcome, "timeout": timeout}


__all__ = [
    "record",
    "all_tags",
    "scale",
    "num_contexts",
    "nap",
    "die",
    "die_in_backward",
    "wait_until",
    "partition_and_heal",
    "kill_during_call",
    "kill_during_backward",
    "kill_during_shutdown",
    "RpcTimeoutError",
    "WorkerUnavailableError",
]


# -- RRef scenarios ------------------------------------------------------------------------------
_kept: list[Any] = []


def make_blob(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.float64)


def keep(rref: Any) -> int:
    """Hold a fork of ``rref`` on this worker (until ``drop_kept``); its length."""
    _kept.append(rref)
    return int(rref.to_here().shape[0])


def pass_on(rref: Any, path: list[int]) -> int:
    """Keep a fork here, then hand it on along ``path`` (each hop forks again)."""
    n = keep(rref)
    if path:
        return int(rpc.rpc_sync(path[0], pass_on, (rref, path[1:])))
    return n


def drop_kept() -> int:
    n = len(_kept)
    _kept.clear()
    return n


def owner_rrefs() -> int:
    return int(rpc.get_debug_info().get("num_owner_rrefs", 0))


def rref_forks_under_drops(rank: int, world_size: int, control: tuple[str, int]) -> Any:
    """worker1 owns RRefs that fork across all 4 workers while its link drops, then heals."""
    if rank != 0:
        return None
    rrefs = [rpc.remote("worker1", make_blob, (10 + i,)) for i in range(4)]
    for rref in rrefs:
        rref.to_here()
    del rref
    forks = []
    for i, mode in enumerate(["delay 0.05", "reset", "blackhole", "reset"]):
        command(control, mode)
        # Forks to 2 and 3 (and on to each other): ForkRequest / ChildAck / RRefDelete meet the
        # faults; the calls themselves carry the RRef (user calls: not retried, may fail).
        fut = rpc.rpc_async(2, pass_on, (rrefs[i], [3]), timeout=20.0)
        time.sleep(0.3)
        command(control, "pass")
        forks.append(_timed(fut.wait))
    # No early delete: every RRef still resolves, from every worker that holds it.
    wait_until(lambda: _quiet_call("worker1", owner_rrefs) is not None, 20.0)  # reconnected
    values = [r.to_here(timeout=20.0).shape[0] for r in rrefs]
    held = [rpc.rpc_sync(w, drop_kept) for w in (2, 3)]
    rrefs.clear()
    gc_collect_everywhere(world_size)
    # No leak once healed: the owner ends with no OwnerRRef.
    try:
        leak_free: Any = wait_until(lambda: _quiet_call("worker1", owner_rrefs) == 0, 30.0)
    except TimeoutError:
        leak_free = {
            "left": _quiet_call("worker1", owner_rrefs),
            "owner": _quiet_call("worker1", _rref_state),
            "users": [rpc.rpc_sync(w, _rref_state) for w in (0, 2, 3)],
        }
    return {"forks": forks, "values": values, "held": held, "owner_clear_s": leak_free}


def _rref_state() -> dict[str, Any]:
    info = rpc.get_debug_info()
    return {k: v for k, v in info.items() if "rref" in k or "fork" in k or "pending" in k}


def _quiet_call(to: str, fn: Callable[[], Any]) -> Any:
    """The test's own retry of a probe call: None while the channel is still reconnecting."""
    try:
        return rpc.rpc_sync(to, fn, timeout=5.0)
    except WorkerUnavailableError:
        return None


def gc_collect_everywhere(world_size: int) -> None:
    import gc

    gc.collect()
    for w in range(world_size):
        rpc.rpc_sync(w, _collect)


def _collect() -> None:
    import gc

    gc.collect()


def rref_owner_killed(rank: int, world_size: int, timeout: float) -> Any:
    """worker1 owns an RRef held by 0 and 2, then is killed; its users see it is gone."""
    if rank == 1:
        threading.Event().wait(120)  # killed by rank 0
        return None
    if rank == 2:
        wait_until(lambda: len(_kept) == 1, 30.0)
        gone = wait_until(lambda: "worker1" in _lost(), 30.0)
        use = _timed(lambda: _kept[0].to_here(timeout=10.0))
        outcome = _timed(lambda: rpc.shutdown(graceful=True, timeout=timeout))
        return {"use": use, "lost_after_s": gone, "shutdown": outcome}
    rref = rpc.remote("worker1", make_blob, (8,))
    assert rpc.rpc_sync("worker2", keep, (rref,)) == 8
    dying = rpc.rpc_async("worker1", die)
    # The owner is dead once the call fails. (A to_here() sent right after the rpc_async may
    # still be answered: a set value is served on the owner's I/O loop, which can run before
    # its serving pool gets to die().)
    _timed(lambda: dying.wait(10.0))
    first = _timed(lambda: rref.to_here(timeout=10.0))
    gone = wait_until(lambda: "worker1" in _lost(), 30.0)
    later = _timed(lambda: rref.to_here(timeout=10.0))
    outcome = _timed(lambda: rpc.shutdown(graceful=True, timeout=timeout))
    return {"first": first, "later": later, "lost_after_s": gone, "shutdown": outcome}


def blackholed_for_good(rank: int, world_size: int, control: tuple[str, int]) -> Any:
    """worker1's link goes silent for good (no RST): keepalive and the detector must notice."""
    if rank == 1:
        threading.Event().wait(120)  # cut off; killed by run_cluster at the end
        return None
    if rank == 2:
        return None
    assert rpc.rpc_sync("worker1", record, ("before",)) == 1
    pending = [rpc.rpc_async("worker1", nap, (0.5,)) for _ in range(3)]
    command(control, "blackhole")
    start = time.monotonic()
    blocked = _timed(lambda: rpc.rpc_sync("worker1", nap, (0.5,)))
    others = [_timed(f.wait) for f in pending]
    lost_s = wait_until(lambda: "worker1" in _lost(), 60.0)
    return {
        "blocked_call": blocked,
        "pending": others,
        "lost_after_s": time.monotonic() - start if lost_s is not None else None,
    }
