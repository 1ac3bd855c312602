"""Functions run on spawned workers by the cluster tests (module-level so they resolve by name)."""

from __future__ import annotations

import operator
import os
import threading
import time
from typing import Any

import numpy as np
from gradwire.distributed import rpc
from gradwire.futures import Future, wait_all

_state: dict[str, Any] = {}


def whoami() -> str:
    return rpc.get_worker_info().name


def add(a: Any, b: Any) -> Any:
    return a + b


def sleep_then(seconds: float, value: Any = None) -> Any:
    time.sleep(seconds)
    return value


def die() -> None:
    os._exit(17)


def chain(path: list[int], payload: np.ndarray) -> list[str]:
    """Call the next rank of ``path`` with rpc_sync (blocking inside a handler)."""
    me = rpc.get_worker_info().name
    if not path:
        return [me]
    rest = rpc.rpc_sync(path[0], chain, (path[1:], payload + 1))
    return [me, *rest]


def mark(key: str) -> None:
    _state[key] = time.time()


def seen(key: str) -> bool:
    return key in _state


def thread_name() -> str:
    return threading.current_thread().name


_naps = {"now": 0, "peak": 0}
_naps_lock = threading.Lock()


def nap(seconds: float) -> int:
    """Sleep (a wait gradwire cannot see), counting how many naps run at once."""
    with _naps_lock:
        _naps["now"] += 1
        _naps["peak"] = max(_naps["peak"], _naps["now"])
    try:
        time.sleep(seconds)
    finally:
        with _naps_lock:
            _naps["now"] -= 1
    return 1


def naps_peak(reset: bool = False) -> int:
    """The most naps that ran at once (since the last reset)."""
    with _naps_lock:
        peak = _naps["peak"]
        if reset:
            _naps["peak"] = 0
    return peak


_gates: dict[str, threading.Event] = {}


def wait_gate(key: str, seconds: float) -> str:
    """Wait on a plain Event (a wait gradwire cannot see) until ``open_gate(key)``."""
    gate = _gates.setdefault(key, threading.Event())
    return "opened" if gate.wait(seconds) else "timed out"


def open_gate(key: str) -> str:
    _gates.setdefault(key, threading.Event()).set()
    return "open"


def wait_on_call(value: int) -> int:
    """Wait (a blocking wait gradwire sees) on an rpc_async to this same worker."""
    me = rpc.get_worker_info().name
    return int(rpc.rpc_async(me, operator.mul, (value, 10)).wait(10))


# -- bodies --------------------------------------------------------------------------------------


def all_to_all(rank: int, world_size: int) -> list[str]:
    futs = [rpc.rpc_async(r, whoami) for r in range(world_size)]
    names = wait_all(futs)
    assert names == [f"worker{r}" for r in range(world_size)], names
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = rpc.rpc_sync((rank + 1) % world_size, add, (x, x))
    np.testing.assert_array_equal(got, x + x)
    from gradwire._runtime import agent

    # Peers on the same host dial each other's Unix domain socket.
    assert all(p.dial.startswith("unix:") for p in agent.current().peers), agent.current().peers
    return names


def nested_chains(rank: int, world_size: int, chains: int, depth: int) -> int:
    if rank != 0:
        return 0
    payload = np.ones(4)
    futs: list[Future[Any]] = []
    for i in range(chains):
        start = i % world_size
        path = [(start + k) % world_size for k in range(1, depth)]
        futs.append(rpc.rpc_async(start, chain, (path, payload), timeout=60))
    results = wait_all(futs, timeout=90)
    assert all(len(r) == depth for r in results), results[:3]
    return len(results)


def kill_peer_mid_call(rank: int, world_size: int) -> str:
    if rank == 1:
        time.sleep(30)  # killed by rank 0's call long before
        return "not killed"
    started = time.monotonic()
    try:
        rpc.rpc_sync("worker1", die, timeout=20)
    except rpc_errors().WorkerUnavailableError as exc:
        elapsed = time.monotonic() - started
        assert elapsed < 10, elapsed
        rpc.shutdown(graceful=False)
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("call to a dying worker did not fail")


def shutdown_with_calls_in_flight(rank: int, world_size: int) -> list[Any]:
    if rank == 0:
        futs = [rpc.rpc_async(1, sleep_then, (0.5, i)) for i in range(8)]
        rpc.shutdown(graceful=True, timeout=30)  # waits for the calls it made
        return [f.wait() for f in futs]
    return []


def nongraceful_shutdown_fails_pending(rank: int, world_size: int) -> str:
    if rank == 0:
        fut = rpc.rpc_async(1, sleep_then, (3.0, "late"))
        time.sleep(0.2)
        rpc.shutdown(graceful=False)
        try:
            fut.wait()
        except rpc_errors().RpcShutdownError as exc:
            return str(exc)
        raise AssertionError("pending call survived a non-graceful shutdown")
    time.sleep(1.0)  # stay up so the pending call is genuinely in flight
    rpc.shutdown(graceful=False)
    return ""


def rpc_errors() -> Any:
    import gradwire.errors

    return gradwire.errors


def threads_seen(rank: int, world_size: int) -> dict[str, Any]:
    return {"threads": threading.active_count(), "debug": rpc.get_debug_info()}


def addresses_used(rank: int, world_size: int) -> list[str]:
    from gradwire._runtime import agent

    return [p.address for p in agent.current().peers]


def echo(x: Any) -> Any:
    return x


def big_echo(rank: int, world_size: int, mib: int, to: int | None = None) -> dict[str, float]:
    """Echo a ``mib`` MiB tensor through worker ``to`` (default: itself); report the peak
    memory growth of the process (rank 0 only when ``to`` is another worker)."""
    import resource

    from gradwire._tensor import Tensor
    from gradwire._wire import bulk

    if to is None:
        to = rank
    elif rank != 0:
        return {}
    a = Tensor._wrap(np.arange((mib << 20) // 4, dtype=np.float32))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    taken = bulk.stats().get("taken", 0)
    started = time.perf_counter()
    b = rpc.rpc_sync(to, echo, (a,), timeout=300)
    elapsed = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    assert isinstance(b, Tensor) and b.shape == a.shape
    assert np.array_equal(b._data[:: 1 << 16], a._data[:: 1 << 16]) and b._data[-1] == a._data[-1]
    return {
        "extra_bytes": peak - base,
        "seconds": elapsed,
        "payload": float(mib << 20),
        "bulk_taken": bulk.stats().get("taken", 0) - taken,
    }


def health_of(address: str) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status)


def shutdown_timeout_is_honoured(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0 shuts down while rank 1 stays busy: barrier times out after the given timeout."""
    from gradwire._runtime import agent

    errors = rpc_errors()
    if rank == 0:
        started = time.monotonic()
        try:
            rpc.shutdown(graceful=True, timeout=1.5)
        except errors.RpcTimeoutError as exc:
            return {"elapsed": time.monotonic() - started, "error": str(exc)}
        raise AssertionError("shutdown barrier did not time out")
    me = agent.current()
    rank0 = me.peers[0].dial
    time.sleep(0.5)  # rank 0 is now at the barrier
    status = health_of(rank0)
    time.sleep(2.5)  # and has given up waiting
    try:
        rpc.shutdown(graceful=True, timeout=3)
    except (errors.WorkerUnavailableError, errors.RpcTimeoutError) as exc:
        return {"health_of_rank0_at_barrier": status, "own_shutdown": type(exc).__name__}
    return {"health_of_rank0_at_barrier": status, "own_shutdown": "ok"}


def async_call_to_killed_peer(rank: int, world_size: int) -> str:
    if rank == 1:
        time.sleep(30)
        return "not killed"
    fut = rpc.rpc_async("worker1", die, timeout=20)
    started = time.monotonic()
    try:
        fut.wait()
    except rpc_errors().WorkerUnavailableError as exc:
        assert time.monotonic() - started < 10
        rpc.shutdown(graceful=False)
        return str(exc)
    raise AssertionError("call to a dying worker did not fail")


def pipe_calls_served() -> int:
    return int(rpc.get_debug_info()["bulk_lane"]["counters"].get("pipe_calls_served", 0))


def fan_in_on_lane_pipes(rank: int, world_size: int) -> Any:
    """Rank 0 keeps 64 rpc_async calls in flight to the others, 600 in all, twice (the first
    round opens the connections; an rpc_async never waits for one); what the peers served on
    their lane pipes and how this worker read the replies."""
    if rank != 0:
        return None
    from gradwire._runtime import agent as agent_mod

    peers = [f"worker{r}" for r in range(1, world_size)]
    before = [rpc.rpc_sync(p, pipe_calls_served) for p in peers]
    results: list[Any] = []
    slots = threading.Semaphore(64)
    for _ in range(2):
        futs = []
        for i in range(600):
            slots.acquire()
            fut = rpc.rpc_async(peers[i % len(peers)], operator.mul, (i, 2))
            fut.add_done_callback(lambda _f: slots.release())
            futs.append(fut)
        results = [f.wait() for f in futs]
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    return {
        "results_ok": results == [2 * i for i in range(600)],
        "served": [rpc.rpc_sync(p, pipe_calls_served) - b for p, b in zip(peers, before)],
        "pipes": sorted(lane._pipes),
        "readers": sum(t.name.startswith("gradwire-lane-pipes") for t in threading.enumerate()),
    }
