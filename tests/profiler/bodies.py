"""Functions run on spawned workers by the profiler tests (module-level: they resolve by name)."""

from __future__ import annotations

import time
from typing import Any

import gradwire as gw
from gradwire.autograd import profiler
from gradwire.distributed import rpc

KEY = "rpc_{verb}#{fn}(worker0 -> worker1)"


def udf() -> Any:
    x = gw.add(gw.ones(2), gw.ones(2))
    return gw.mul(x, x).relu().sigmoid()


def fails() -> None:
    raise ValueError("no")


def add(a: Any, b: Any) -> Any:
    time.sleep(0.05)
    return a + b


@rpc.functions.async_execution
def async_add(to: str, a: Any, b: Any) -> Any:
    return rpc.rpc_async(to, add, (a, b))


def _summary(prof: Any) -> dict[str, Any]:
    events = prof.function_events
    calls = [e for e in events if not e.is_remote and e.name.startswith("rpc_")]
    remote = [e for e in events if e.is_remote]
    call = calls[0]
    inside = all(
        call.time_range.start <= e.time_range.start <= e.time_range.end <= call.time_range.end
        for e in remote
    )
    return {
        "calls": [e.name for e in calls],
        "remote": sorted({e.name for e in remote}),
        "nodes": sorted({e.node_id for e in remote}),
        "inside": inside,
        "shapes": sorted({str(e.input_shapes) for e in remote if e.name.endswith("aten::mul")}),
    }


def leftovers() -> tuple[int, int, int]:
    from gradwire._runtime.calls import profiling

    return len(profiling.awaiting), len(profiling.serving), profiling._profiling.active


def profiled_calls(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    out: dict[str, Any] = {}
    for verb in ("sync", "async", "remote"):
        with profiler.profile(record_shapes=True) as prof:
            if verb == "sync":
                rpc.rpc_sync("worker1", udf)
            elif verb == "async":
                rpc.rpc_async("worker1", udf).wait()
            else:
                rref = rpc.remote("worker1", udf)
                rref.to_here()
                rref._get_profiling_future().wait()
        out[verb] = _summary(prof)
    with profiler.profile() as prof:
        rpc.rpc_async("worker1", async_add, ("worker2", gw.ones(1), gw.ones(1))).wait()
    out["nested"] = sorted((e.name, e.node_id) for e in prof.function_events if e.is_remote)
    with profiler.profile() as prof:
        try:
            rpc.rpc_sync("worker1", fails)
        except ValueError:
            pass
    out["failed"] = [(e.name, e.is_remote) for e in prof.function_events]
    # worker1 profiles the calls it serves, entered there (rpc._server_process_global_profile)
    rpc.rpc_sync("worker1", start_server_profile)
    rpc.rpc_sync("worker1", gw.add, (gw.ones(1), gw.ones(1)))
    out["served"] = rpc.rpc_sync("worker1", stop_server_profile)
    out["leftovers"] = [rpc.rpc_sync(f"worker{r}", leftovers) for r in range(world_size)]
    return out


_server: dict[str, Any] = {}


def start_server_profile() -> None:
    prof = rpc._server_process_global_profile()
    prof.__enter__()
    _server["prof"] = prof


def stop_server_profile() -> list[list[str]]:
    prof = _server.pop("prof")
    prof.__exit__(None, None, None)
    return [[e.name for e in group] for group in prof.process_global_function_events]


def loss_on(x: Any) -> Any:
    return (x * x).sum()


def cluster_profile(rank: int, world_size: int, trace_path: str) -> Any:
    """Rank 0 profiles every worker through a few calls and a distributed backward."""
    import gradwire.distributed
    from gradwire.distributed import autograd as dist_autograd

    if rank != 0:
        return None
    x = gw.ones(3, requires_grad=True)
    with gradwire.distributed.profile_cluster() as prof:
        for r in range(1, world_size):
            rpc.rpc_sync(f"worker{r}", udf)
        with dist_autograd.context() as ctx:
            loss = rpc.rpc_sync("worker1", loss_on, (x,)) + rpc.rpc_sync("worker2", loss_on, (x,))
            dist_autograd.backward(ctx, [loss])
            grad = dist_autograd.get_gradients(ctx)[x]
    prof.export_chrome_trace(trace_path)
    again: Any
    try:
        with gradwire.distributed.profile_cluster():
            with gradwire.distributed.profile_cluster():
                pass
        again = "no error"
    except RuntimeError as exc:
        again = str(exc)
    return {
        "grad": grad.tolist(),
        "ranks": sorted({e.node_id for e in prof.function_events}),
        "averages": sorted({a.key for a in prof.key_averages()}),
        "again": again,
        "leftovers": [rpc.rpc_sync(f"worker{r}", leftovers) for r in range(world_size)],
    }


def cli_profile(rank: int, world_size: int, trace_path: str) -> Any:
    """Rank 0 runs ``gradwire profile`` against itself while it calls the others."""
    import threading

    from gradwire.server.cli.profile import main as profile_main

    if rank != 0:
        return None
    me = rpc.get_worker_info().name
    address = next(p["address"] for p in rpc.get_debug_info()["peers"] if p["name"] == me)
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            for r in range(1, world_size):
                rpc.rpc_sync(f"worker{r}", udf)

    t = threading.Thread(target=work)
    t.start()
    try:
        code = profile_main([address, "--seconds", "1", "--out", trace_path, "--strict"])
        bad = profile_main([address, "--seconds", "0", "--out", trace_path])
    finally:
        stop.set()
        t.join()
    return {
        "code": code,
        "bad": bad,
        "leftovers": [rpc.rpc_sync(f"worker{r}", leftovers) for r in range(world_size)],
    }
