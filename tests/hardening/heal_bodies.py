"""Scenarios of ``test_heal.py``, run on spawned workers: a worker frozen with SIGSTOP and thawed.

Rank 0 drives; rank 1 is frozen (its pid comes from a call). Every wait has a deadline; results
are plain dicts of what was seen and how long it took.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
from gradwire.distributed import rpc

from .fault_bodies import num_contexts, scale, wait_until


def pid() -> int:
    return os.getpid()


def lost_peers() -> list[str]:
    return list(rpc.get_debug_info().get("peers_lost", []))


def _timed(fn: Any) -> tuple[str, float]:
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the scenario reports what it saw
        return type(exc).__name__, time.monotonic() - start
    return "ok", time.monotonic() - start


def frozen_and_thawed(rank: int, world_size: int, timeouts: list[float]) -> Any:
    """Rank 0: calls that must each end within their timeout while worker1 is frozen (the
    first ones open the bulk lane's connections), a dist-autograd context left while it is
    frozen, then the thaw: its lost mark goes, the context is released there, and a graceful
    shutdown completes (the harness shuts down gracefully after the body)."""
    if rank != 0:
        return None
    w1 = "worker1"
    victim = rpc.rpc_sync(w1, pid)
    x = gw.ones(64, requires_grad=True)
    with dist_autograd.context():
        rpc.rpc_sync(w1, scale, (x,))  # worker1 now holds this context
        contexts_before = rpc.rpc_sync(w1, num_contexts)
        os.kill(victim, signal.SIGSTOP)
        left = time.monotonic()
    leave_s = time.monotonic() - left
    calls = []
    try:
        big = gw.ones(1 << 18)  # 1 MiB: its bytes go on the bulk lane
        for timeout in timeouts:
            calls.append(
                (timeout, *_timed(lambda t=timeout: rpc.rpc_sync(w1, scale, (big,), timeout=t)))
            )
            calls.append(
                (
                    timeout,
                    *_timed(lambda t=timeout: rpc.rpc_async(w1, scale, (big,), timeout=t).wait()),
                )
            )
        lost_while_frozen = wait_until(lambda: w1 in lost_peers(), 30.0)
    finally:
        os.kill(victim, signal.SIGCONT)
    thawed = time.monotonic()
    back_s = wait_until(lambda: w1 not in lost_peers(), 30.0)
    healed_call = _timed(lambda: rpc.rpc_sync(w1, scale, (x.detach(),), timeout=10.0))
    released_s = wait_until(lambda: rpc.rpc_sync(w1, num_contexts) == 0, 30.0)
    return {
        "contexts_before": contexts_before,
        "leave_s": leave_s,
        "calls": calls,
        "lost_while_frozen_s": lost_while_frozen,
        "back_after_thaw_s": back_s,
        "since_thaw_s": time.monotonic() - thawed,
        "healed_call": healed_call,
        "released_after_thaw_s": released_s,
        "lost_at_end": lost_peers(),
        "worker1_lost_at_end": rpc.rpc_sync(w1, lost_peers),
    }


def async_first_to_a_frozen_worker(rank: int, world_size: int, timeout: float) -> Any:
    """Rank 0: worker1 is frozen before any tensor went to it, then an ``rpc_async`` carrying
    1 MiB (bulk-lane bytes: encoding it waits on the lane's connection, which the frozen
    worker never answers) must still fail within its timeout, the wait included."""
    if rank != 0:
        return None
    w1 = "worker1"
    victim = rpc.rpc_sync(w1, pid)
    big = gw.ones(1 << 18)
    os.kill(victim, signal.SIGSTOP)
    try:
        outcome = _timed(lambda: rpc.rpc_async(w1, scale, (big,), timeout=timeout).wait())
    finally:
        os.kill(victim, signal.SIGCONT)
    back_s = wait_until(lambda: w1 not in lost_peers(), 30.0)
    return {"outcome": outcome, "back_after_thaw_s": back_s}


_held: list[int] = []
_holding = threading.Event()


def _grab() -> None:
    try:
        while True:
            _held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass


def exhaust_descriptors() -> int:
    """Hold this worker at its file-descriptor limit (lowered to 256): take every descriptor,
    and every one freed later, until :func:`release_descriptors`."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
    _holding.set()
    _grab()

    def keep_holding() -> None:
        while _holding.is_set():
            _grab()
            time.sleep(0.005)

    threading.Thread(target=keep_holding, daemon=True).start()
    return len(_held)


def release_descriptors() -> int:
    _holding.clear()
    time.sleep(0.05)
    n = len(_held)
    while _held:
        os.close(_held.pop())
    return n


def lane_received() -> int:
    """How many tensors this worker has received on its bulk lane."""
    from gradwire._wire import bulk

    return int(bulk.stats().get("received", 0))


def out_of_descriptors(rank: int, world_size: int, timeout: float) -> Any:
    """Rank 0: worker1 runs out of file descriptors; calls that need a new lane connection to it
    keep their timeout and go by gRPC; once it has descriptors again, its lane accepts again."""
    if rank != 0:
        return None
    from gradwire._runtime import agent as agent_mod

    w1 = "worker1"
    big = gw.ones(1 << 18)  # 1 MiB: the bulk lane
    first = _timed(lambda: rpc.rpc_sync(w1, scale, (big,), timeout=timeout))
    held = rpc.rpc_sync(w1, exhaust_descriptors)
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    lane.drop_peer(w1)  # the next call needs a new connection, which worker1 cannot accept
    starved = [_timed(lambda: rpc.rpc_sync(w1, scale, (big,), timeout=timeout)) for _ in range(3)]
    released = rpc.rpc_sync(w1, release_descriptors)
    lane.drop_peer(w1)  # forget its unreachable mark: dial it again
    before = rpc.rpc_sync(w1, lane_received)
    after = [_timed(lambda: rpc.rpc_sync(w1, scale, (big,), timeout=timeout)) for _ in range(3)]
    accepted = wait_until(lambda: rpc.rpc_sync(w1, lane_received) > before, 10.0)
    return {
        "first": first,
        "held": held,
        "starved": starved,
        "released": released,
        "after": after,
        "accepted_again_in_s": accepted,
        "lost": lost_peers(),
    }
