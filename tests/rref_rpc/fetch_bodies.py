"""Bodies of test_fetch_paths: where the owner makes a to_here() answer (module-level, so the
workers resolve them by name)."""

from __future__ import annotations

import time
from typing import Any

import gradwire as gw
from gradwire.distributed import rpc

#: How long the blocker holds worker1's only serving thread.
BLOCK_SECONDS = 3.0


def ones(n: int) -> Any:
    return gw.ones(n)


def sleep_then(seconds: float, value: Any) -> Any:
    time.sleep(seconds)  # not a gradwire wait: the serving thread keeps its slot
    return value


def _timed(rref: rpc.RRef[Any]) -> tuple[Any, float]:
    started = time.monotonic()
    value = rref.to_here(timeout=30)
    return value, time.monotonic() - started


def fetch_paths(rank: int, world_size: int) -> dict[str, Any]:
    """worker1 serves with one thread: a ready plain value is answered while that thread is
    busy; any other value waits for it (its encoding may run user code, never on the loop)."""
    if rank != 0:
        return {}
    out: dict[str, Any] = {}
    # The fetch reaches the owner before the value is set: answered once it is.
    early = rpc.remote("worker1", sleep_then, (0.5, gw.arange(4.0)))
    out["early"] = early.to_here(timeout=30).tolist()
    tensor = rpc.remote("worker1", ones, (1 << 16,))
    number = rpc.remote("worker1", sleep_then, (0.0, 7))
    listed = rpc.remote("worker1", sleep_then, (0.0, [1, 2]))
    for rref in (tensor, number, listed):
        rref.to_here(timeout=30)  # created and set
    blocker = rpc.rpc_async("worker1", sleep_then, (BLOCK_SECONDS, "slept"))
    time.sleep(0.5)  # the blocker holds worker1's only serving thread
    from gradwire._wire import bulk

    taken = bulk.stats().get("taken", 0)
    value, out["tensor_seconds"] = _timed(tensor)
    out["tensor_over_bulk_lane"] = bulk.stats().get("taken", 0) - taken
    out["tensor_sum"] = float(value.sum())
    out["number"], out["number_seconds"] = _timed(number)
    out["listed"], out["listed_seconds"] = _timed(listed)
    out["blocker"] = blocker.wait()
    return out


def _answer(frame: Any) -> dict[str, Any]:
    """What a Fetch answer says: its FetchHeader (rref id, continuation, error) and raw bytes."""
    head = frame.header.fetch
    return {
        "rref": (head.rref_id.created_on, head.rref_id.local_id),
        "continuation": bool(head.continuation),
        "error": head.error.type_name,
        "raw": b"".join(bytes(memoryview(b)) for b in frame.raw),
    }


def fetch_frames(rank: int, world_size: int) -> dict[str, Any]:
    """A ``fetch_request`` frame on ``Call``/``CallStream`` of either server of the owner gets
    exactly the frame ``Fetch`` returns; remote() of a plain call rides a call stream of the
    owner's fast lane, one with an RRef argument the call pipe (no rpc_async made)."""
    if rank != 0:
        return {}
    from gradwire._proto import worker_pb2 as pb
    from gradwire._runtime.agent import current
    from gradwire._runtime.rref.fetch import fetch_frame
    from gradwire._runtime.rref.wire import to_gid
    from gradwire._runtime.transport.transport import SERVICE
    from gradwire._wire.framing import decode_frame

    agent = current()
    transport, peer = agent.transport, agent.ctx.peers[1]
    out: dict[str, Any] = {}
    ready = rpc.remote("worker1", ones, (1 << 10,))
    ready.to_here(timeout=30)

    def pipes() -> int:
        return sum(1 for s in transport._stubs.values() if s.pipe is not None and s.pipe.alive)

    out["pipes_after_remote"] = pipes()
    out["with_rref"] = rpc.remote("worker1", to_here_of, (ready,)).to_here(timeout=30)
    out["pipes_after_rref_argument"] = pipes()

    def request(rref: Any) -> Any:
        return pb.FetchRequest(rref_id=to_gid(rref._handle.rref_id), caller_id=rank)

    fetch = transport._get(peer.dial).channel.unary_unary(  # the unary method, as grpcurl sees it
        f"/{SERVICE}/Fetch", pb.FetchRequest.SerializeToString, decode_frame
    )
    answers = {
        "unary Fetch": fetch(request(ready), timeout=30, metadata=transport.metadata),
        "asyncio server": transport.call(peer.dial, fetch_frame(request(ready)), 30),
        "fast lane": transport.call(peer.call_dial, fetch_frame(request(ready)), 30),
    }
    out["ready"] = {name: _answer(frame) for name, frame in answers.items()}
    unknown = pb.FetchRequest(rref_id=pb.GloballyUniqueId(created_on=1, local_id=10**9))
    out["unknown"] = {
        name: _answer(transport.call(address, fetch_frame(unknown), 30))["error"]
        for name, address in (("asyncio server", peer.dial), ("fast lane", peer.call_dial))
    }
    # A value still to come: the fast lane waits FETCH_WAIT_SECONDS for it, then parks it and
    # the caller streams it from the asyncio server, as rref.to_here() does.
    out["fast_lane"] = peer.call_dial != peer.dial
    later = rpc.remote("worker1", sleep_then, (1.0, "later"))
    parked = transport.call(peer.call_dial, fetch_frame(request(later)), 30)
    out["later_parked"] = _answer(parked)["continuation"]
    out["later"] = later.to_here(timeout=30)
    return out


def owner_rrefs() -> int:
    from gradwire._runtime.agent import current

    return int(current().debug_info()["num_owner_rrefs"])


def control_on_pipe(rank: int, world_size: int) -> dict[str, Any]:
    """RRef control messages (here the deletes, and a fork's ForkRequest/ChildAck) ride
    frames on the owner's call streams or its call pipe: no unary gRPC future is started for
    them."""
    if rank != 0:
        return {}
    from gradwire._runtime.agent import current

    started: list[str] = []
    transport = current().transport
    real = transport.control_future

    def counted(address: str, method: str, *args: Any) -> None:
        started.append(method)
        real(address, method, *args)

    transport.control_future = counted
    before = rpc.rpc_sync("worker1", owner_rrefs)
    held = rpc.remote("worker1", ones, (4,))
    held.to_here(timeout=30)
    assert rpc.rpc_sync("worker1", owner_rrefs) == before + 1  # the count sees an RRef
    del held
    for _ in range(5):
        rref = rpc.remote("worker1", ones, (1 << 10,))
        assert float(rref.to_here(timeout=30).sum()) == 1 << 10
        del rref
    shared = rpc.remote("worker1", ones, (4,))
    assert rpc.rpc_sync("worker2", to_here_of, (shared,)) == 4.0  # a fork: worker2 is a user
    del shared
    deadline = time.monotonic() + 30
    while rpc.rpc_sync("worker1", owner_rrefs) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    return {
        "unary_control": started,
        "owner_rrefs_back": rpc.rpc_sync("worker1", owner_rrefs) == before,
    }


def to_here_of(rref: Any) -> float:
    return float(rref.to_here().sum())


def slow_remote_retries_on_the_pipe(rank: int, world_size: int) -> dict[str, Any]:
    """A remote() whose function outlasts one attempt: the first attempt rides a call stream,
    the retries the call pipe (whose wait for a running call holds no thread)."""
    if rank != 0:
        return {}
    from gradwire._runtime import agent as _agent
    from gradwire._runtime.transport import resend as send

    send.ATTEMPT_SECONDS = 0.4  # the function below takes 1.5 s: about three retries
    transport = _agent.current().transport
    routes: list[str] = []
    real_stream, real_pipe = transport.stream_call, transport.pipe_call

    def stream_call(*args: Any, **kwargs: Any) -> bool:
        routes.append("stream")
        return real_stream(*args, **kwargs)

    def pipe_call(*args: Any) -> None:
        routes.append("pipe")
        real_pipe(*args)

    transport.stream_call, transport.pipe_call = stream_call, pipe_call
    rref = rpc.remote("worker1", sleep_then, (1.5, "slow"))
    value = rref.to_here(timeout=30)
    transport.stream_call, transport.pipe_call = real_stream, real_pipe
    return {"value": value, "routes": routes}
