"""Bodies of tests/rpc/test_torch_semantics.py, run on spawned workers (module-level so they
resolve by name): PyTorch RPC semantics that its own test suite checks (issue 25)."""

from __future__ import annotations

import threading
from typing import Any

import gradwire as gw
from gradwire.distributed import rpc
from gradwire.futures import Future


@rpc.functions.async_execution
def fanout_sum(to: str, x: Any, num: int, step: int) -> Future[Any]:
    """PyTorch's async_add_multi_fanout: ``num`` calls to ``to`` whose callbacks add up."""
    futs = [rpc.rpc_async(to, gw.add, (x if i == 0 else 0, step)) for i in range(num)]
    lock = threading.Lock()
    state = {"count": 0, "total": gw.zeros_like(x)}
    out: Future[Any] = Future()

    def add_one(fut: Future[Any]) -> None:
        with lock:
            state["count"] += 1
            state["total"] += fut.wait()
            if state["count"] == num:
                out.set_result(state["total"])

    for fut in futs:
        fut.then(add_one)
    return out


def fanout(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    return rpc.rpc_sync(
        "worker1", fanout_sum, ("worker2", gw.ones(2, 2), 20, 3), timeout=20
    ).tolist()


@rpc.functions.async_execution
def not_a_future() -> Any:
    return gw.zeros(2)


def wrong_async_return(rank: int, world_size: int) -> list[str]:
    if rank != 0:
        return []
    seen = []
    for call in (
        lambda: rpc.rpc_sync("worker1", not_a_future),
        lambda: rpc.rpc_async("worker1", not_a_future).wait(),
        lambda: rpc.remote("worker1", not_a_future).to_here(),
    ):
        try:
            call()
        except RuntimeError as exc:
            seen.append(str(exc))
    assert rpc.rpc_sync("worker1", gw.add, (gw.ones(1), 1)).tolist() == [2.0]  # still serving
    return seen


def gather(rank: int, world_size: int) -> Any:
    return rpc.api._all_gather(rank * 10)


def _refuse_after_taking(sequence_id: Any, objects_map: Any) -> None:
    _original(sequence_id, objects_map)
    raise ValueError("follower refuses the map")


_original = rpc.api._broadcast_to_followers


def follower_broadcast_fails(rank: int, world_size: int) -> str:
    if rank != 0:
        rpc.api._broadcast_to_followers = _refuse_after_taking
        try:
            return repr(rpc.api._all_gather(rank))
        finally:
            rpc.api._broadcast_to_followers = _original
    try:
        rpc.api._all_gather(rank)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def init_twice_over_files(rank: int, world_size: int, folder: str) -> list[str]:
    """init_rpc over file:// twice in one process (PyTorch's test_init_rpc_twice)."""
    seen = []
    for attempt in range(2):
        if attempt:  # run_cluster's own init_rpc (tcp) is shut down first, as the test does
            rpc.init_rpc(
                f"worker{rank}",
                rank=rank,
                world_size=world_size,
                rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                    init_method=f"file://{folder}/init{attempt}", rpc_timeout=20
                ),
            )
        peer = f"worker{(rank + 1) % world_size}"
        seen.append(rpc.rpc_sync(peer, rpc.get_worker_info).name)
        rpc.shutdown()
    return seen
