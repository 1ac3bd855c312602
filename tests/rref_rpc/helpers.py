"""Functions the RRef cluster tests run on workers (module-level, so they resolve by name)."""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from typing import Any

import gradwire as gw
from gradwire._runtime import agent as _agent
from gradwire.distributed import rpc
from gradwire.errors import WorkerUnavailableError
from gradwire.futures import Future

_state: dict[str, Any] = {}


# -- values and checks run by remote functions -----------------------------------------------


def add(a: Any, b: Any) -> Any:
    return a + b


def identity(x: Any) -> Any:
    return x


def sleep_then(seconds: float, value: Any = None) -> Any:
    time.sleep(seconds)
    return value


def fail_with_value_error(message: str) -> None:
    raise ValueError(message)


def make_rref(value: Any) -> rpc.RRef[Any]:
    """Owner -> user as a return value: an RRef owned by the callee."""
    return rpc.RRef(value)


def make_remote(owner: int, value: Any) -> rpc.RRef[Any]:
    """User -> user as a return value: an RRef the callee created on ``owner``."""
    return rpc.remote(owner, identity, (value,))


def inspect_rref(rref: rpc.RRef[Any]) -> dict[str, Any]:
    """What the receiving function sees (it runs only once ``rref`` is confirmed)."""
    return {
        "worker": rpc.get_worker_info().name,
        "is_owner": rref.is_owner(),
        "confirmed": rref.confirmed_by_owner(),
        "value": rref.local_value() if rref.is_owner() else rref.to_here(),
        "owner": rref.owner_name(),
    }


def inspect_nested(box: dict[str, Any]) -> list[Any]:
    """RRefs nested in containers: every one is confirmed and readable."""
    rrefs = [box["a"][0], box["a"][1][0], box["b"]]
    return [(r.confirmed_by_owner(), r.to_here()) for r in rrefs] + [box["a"][0] is box["b"]]


def hop(rref: rpc.RRef[Any], path: list[int], seen: list[str]) -> list[Any]:
    """Forward ``rref`` along ``path`` (one rpc_sync per hop), checking it at every worker."""
    me = rpc.get_worker_info().name
    assert rref.confirmed_by_owner(), f"{me}: received RRef not confirmed before the function ran"
    seen = [*seen, me]
    if not path:
        return [seen, rref.to_here()]
    return rpc.rpc_sync(path[0], hop, (rref, path[1:], seen))  # type: ignore[no-any-return]


def hop_remote(rref: rpc.RRef[Any], path: list[int]) -> Any:
    """Like ``hop`` but each hop is a remote() whose result the caller fetches."""
    assert rref.confirmed_by_owner()
    if not path:
        return rref.to_here()
    return rpc.remote(path[0], hop_remote, (rref, path[1:])).to_here()


def keep(key: str, value: Any) -> None:
    _state[key] = value


def drop(key: str) -> None:
    _state.pop(key, None)
    gc.collect()


def returned_to_owner(rref: rpc.RRef[Any], original_key: str) -> list[Any]:
    """On the owner: a returned fork is the OwnerRRef, equal to the one kept here."""
    original = _state[original_key]
    return [rref.is_owner(), rref == original, hash(rref) == hash(original), rref.local_value()]


def counters() -> dict[str, int]:
    gc.collect()
    _agent.current().rref.flush_releases(10.0)
    info = rpc.get_debug_info()
    keys = ("num_owner_rrefs", "num_pending_users", "num_pending_children", "num_forks")
    return {k: int(info[k]) for k in keys} | {"num_users": int(info["num_users"])}


def wait_quiet(workers: list[int], timeout: float = 30.0) -> dict[int, dict[str, int]]:
    """Wait until no worker holds an OwnerRRef, a user, a pending child or a known fork.

    Raises:
        AssertionError: still not quiet after ``timeout`` (the counters say what is left).
    """
    gc.collect()
    deadline = time.monotonic() + timeout
    while True:
        seen = {w: rpc.rpc_sync(w, counters) for w in workers}
        if all(not any(c.values()) for c in seen.values()):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"RRefs still alive: {seen}")
        time.sleep(0.05)


class Unpicklable:
    """A value that cannot travel (it holds a lock): only its type can."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def torch_counters() -> dict[str, int]:
    """PyTorch's RRef counters of this worker (``rpc.api._rref_context_get_debug_info``)."""
    gc.collect()
    _agent.current().rref.flush_releases(10.0)
    return rpc.api._rref_context_get_debug_info()


def wait_shared_owners(worker: int, expected: int, timeout: float = 30.0) -> int:
    """Wait until ``worker`` reports ``expected`` for PyTorch's ``num_owner_rrefs``."""
    deadline = time.monotonic() + timeout
    while True:
        seen = int(rpc.rpc_sync(worker, torch_counters)["num_owner_rrefs"])
        if seen == expected or time.monotonic() > deadline:
            return seen
        time.sleep(0.05)


# -- proxies -------------------------------------------------------------------------------


class Counter2:
    """A value proxied through RRef.rpc_sync() and friends."""

    def __init__(self) -> None:
        self.n = 0

    def bump(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @rpc.functions.async_execution
    def bump_later(self, by: int) -> Future[int]:
        fut: Future[int] = Future()
        threading.Timer(0.05, lambda: fut.set_result(self.bump(by))).start()
        return fut


# -- autograd --------------------------------------------------------------------------------


def scalar_loss() -> gw.Tensor:
    """(w * 3).sum() with w a leaf kept on this worker."""
    w = gw.ones(2, requires_grad=True)
    _state["w"] = w
    return (w * 3).sum()


def double(x: gw.Tensor) -> gw.Tensor:
    return x * 2


def w_grad() -> Any:
    g = _state["w"].grad
    return None if g is None else g.numpy().tolist()


def w_dist_grad(ctx_id: int) -> Any:
    from gradwire.distributed import autograd as dist_autograd

    grads = dist_autograd.get_gradients(ctx_id)
    g = grads.get(_state["w"])
    return None if g is None else g.numpy().tolist()


# -- watch and faults ------------------------------------------------------------------------


def start_watch() -> None:
    """Subscribe to this worker's own WatchControl stream over gRPC, in a thread."""
    import grpc
    from gradwire._proto import worker_pb2 as pb

    agent = _agent.current()
    channel = grpc.insecure_channel(agent.address)
    stream = channel.unary_stream(
        "/gradwire.v1.Worker/WatchControl",
        pb.WatchRequest.SerializeToString,
        pb.ControlEvent.FromString,
    )
    call = stream(pb.WatchRequest(), metadata=(("x-gradwire-token", agent.token or ""),))
    events: list[Any] = []
    _state["watch"] = (channel, call, events)

    def read() -> None:
        try:
            for ev in call:
                events.append(ev)
        except grpc.RpcError:
            pass

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 10
    while not agent.control_events.listening and time.monotonic() < deadline:
        time.sleep(0.01)


def stop_watch() -> list[tuple[str, str, str, str, str]]:
    channel, call, events = _state.pop("watch")
    deadline, seen = time.monotonic() + 10, -1
    while len(events) != seen and time.monotonic() < deadline:  # until the stream is quiet
        seen = len(events)
        time.sleep(0.3)
    call.cancel()
    channel.close()
    return [
        (
            e.kind,
            e.direction,
            e.peer,
            f"{e.rref_id.created_on}:{e.rref_id.local_id}",
            f"{e.fork_id.created_on}:{e.fork_id.local_id}",
        )
        for e in events
    ]


class FailFirst:
    """Fail the first ``n`` deliveries of each control method, before or after processing."""

    def __init__(self, n: int, phase: str) -> None:
        self.n, self.phase = n, phase
        self.count: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, method: str, phase: str) -> None:
        if phase != self.phase:
            return
        with self.lock:
            self.count[method] += 1
            fail = self.count[method] <= self.n
        if fail:
            raise WorkerUnavailableError(f"injected failure of {method} ({phase})")


def install_faults(n: int, phase: str) -> None:
    _agent.current().rref.fault = FailFirst(n, phase)


def fault_counts() -> dict[str, int]:
    fault = _agent.current().rref.fault
    return dict(fault.count) if fault is not None else {}


class FailRandomly:
    """Fail each control message with probability ``p``: half before processing (lost), half
    after (processed, answer lost: the retry is a duplicate). Seeded per worker."""

    def __init__(self, seed: int, p: float) -> None:
        import random

        self.rng = random.Random(seed)
        self.p = p
        self.count: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, method: str, phase: str) -> None:
        with self.lock:
            fail = self.rng.random() < self.p / 2
            if fail:
                self.count[method] += 1
        if fail:
            raise WorkerUnavailableError(f"injected failure of {method} ({phase})")


def install_random_faults(seed: int, p: float) -> None:
    _agent.current().rref.fault = FailRandomly(seed, p)


def check_value(rref: rpc.RRef[Any], expected: Any) -> bool:
    """The received RRef is confirmed and holds ``expected``."""
    value = rref.local_value() if rref.is_owner() else rref.to_here()
    return bool(rref.confirmed_by_owner() and value == expected)


def die_soon() -> None:
    """Exit this worker process abruptly, shortly after answering."""
    import os

    threading.Timer(0.1, os._exit, (17,)).start()


def wait_for(key: str, timeout: float = 60.0) -> None:
    """Serve until another worker set ``key`` here (with ``keep``)."""
    deadline = time.monotonic() + timeout
    while key not in _state and time.monotonic() < deadline:
        time.sleep(0.05)


def confirmed_soon(rref: rpc.RRef[Any], timeout: float = 20.0) -> bool:
    """Whether the owner's confirmation of ``rref`` arrives (the RemoteAck may trail a
    to_here(), which does not wait for it)."""
    deadline = time.monotonic() + timeout
    while not rref.confirmed_by_owner():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def make_many(n: int) -> list[rpc.RRef[Any]]:
    """``n`` OwnerRRefs here, returned as forks to the caller."""
    return [rpc.RRef(i) for i in range(n)]
