"""The extension points issues 4 (RRefs) and 5 (dist autograd) build on, over real gRPC."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np
import pytest
from gradwire import errors
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime import agent as agent_mod
from gradwire._runtime.calls import hooks
from gradwire._runtime.cluster.workers import Peer
from gradwire._runtime.transport.retry import retry_with_backoff
from gradwire._tensor import Tensor
from gradwire._wire import tensors
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import free_port
from gradwire.futures import Future


def first_requires_grad(x: Any, y: Any) -> bool:
    return bool(x.requires_grad)


class _Recorder(hooks.CallHook):
    def __init__(self) -> None:
        self.sent: list[int] = []
        self.received: list[tuple[int, int]] = []
        self.replies: list[int] = []

    def on_send_call(self, header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
        header.autograd.context_id = 42
        self.sent.append(len(tensors))

    def on_recv_call(self, header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
        self.received.append(
            (header.autograd.context_id, sum(getattr(t, "requires_grad", False) for t in tensors))
        )

    def on_recv_reply(
        self, call: pb.CallHeader, header: pb.ReplyHeader, tensors: Sequence[Any], peer: int
    ) -> None:
        self.replies.append(call.autograd.context_id)


def test_call_hooks_see_headers_and_tensors(solo: rpc.WorkerInfo) -> None:
    hook = _Recorder()
    hooks.register(hook)
    try:
        x = Tensor._wrap(np.ones(3), requires_grad=True)
        assert rpc.rpc_sync("solo", first_requires_grad, (x, np.zeros(2))) is True
    finally:
        hooks.unregister(hook)
    assert hook.sent == [2]
    assert hook.received == [(42, 1)]  # the callee saw the context id and one grad tensor
    assert hook.replies == [42]


class _Seams(hooks.CallHook):
    """Counts every seam a call passes (a hook that sees every call)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_send_call(self, header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
        self.seen.append("send_call")

    def on_recv_call(self, header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
        self.seen.append("recv_call")

    def scope(self, call: pb.CallHeader, peer: int) -> Any:
        self.seen.append("scope")
        return super().scope(call, peer)

    def on_send_reply(
        self, call: pb.CallHeader, header: pb.ReplyHeader, tensors: Sequence[Any], peer: int
    ) -> None:
        self.seen.append("send_reply")

    def on_recv_reply(
        self, call: pb.CallHeader, header: pb.ReplyHeader, tensors: Sequence[Any], peer: int
    ) -> None:
        self.seen.append("recv_reply")


def test_a_plain_call_passes_every_seam_of_a_hook_that_sees_every_call(
    solo: rpc.WorkerInfo,
) -> None:
    every = _Seams()
    quiet = _Seams()
    quiet.context_only = True  # says it has nothing to do without an autograd context
    hooks.register(quiet)
    fast_lane = bool(agent_mod.current().local_call_address)  # the Unix-socket variant
    try:
        assert not hooks.needed(pb.CallHeader())
        assert rpc.rpc_sync("solo", max, (2, 3)) == 3  # plain arguments and result
        if fast_lane:  # the plain path skipped the callee's and the reply's seams
            assert quiet.seen == ["send_call"]
        quiet.seen.clear()
        hooks.register(every)
        assert hooks.needed(pb.CallHeader())
        assert rpc.rpc_sync("solo", max, (2, 3)) == 3
    finally:
        hooks.unregister(every)
        hooks.unregister(quiet)
    seams = ["send_call", "recv_call", "scope", "send_reply", "recv_reply"]
    assert every.seen == seams
    assert quiet.seen == seams  # called too while another hook needs them
    with_context = pb.CallHeader()
    with_context.autograd.context_id = 7
    assert hooks.needed(with_context)


def test_control_handler_and_send_control(solo: rpc.WorkerInfo) -> None:
    agent = agent_mod.current()
    seen: list[tuple[int, int]] = []

    def child_ack(request: pb.ChildAck, caller_id: int) -> pb.Ack:
        seen.append((request.child_id, caller_id))
        return pb.Ack()

    def release(request: pb.ReleaseContextRequest, caller_id: int) -> Future[pb.Ack]:
        fut: Future[pb.Ack] = Future()
        threading.Timer(0.05, fut.set_result, (pb.Ack(),)).start()
        return fut  # answered later, without a serving thread

    agent.register_control_handler("ChildAck", child_ack)
    agent.register_control_handler("ReleaseContext", release)
    peer = agent.resolve("solo")
    reply = agent.caller.send_control(peer, "ChildAck", pb.ChildAck(child_id=3), pb.Ack, timeout=5)
    assert isinstance(reply, pb.Ack) and seen == [(3, 0)]
    agent.caller.send_control(
        peer, "ReleaseContext", pb.ReleaseContextRequest(context_id=1), pb.Ack, timeout=5
    )
    # A method without a handler is an immediate error, not retried. (Every method has one
    # now that the RRef service serves RRefDelete: take it away for the check.)
    rref_delete = agent.control_handlers.pop("RRefDelete")
    started = time.monotonic()
    try:
        with pytest.raises(errors.RpcError, match="UNIMPLEMENTED"):
            agent.caller.send_control(peer, "RRefDelete", pb.RRefDelete(), pb.Ack, timeout=5)
    finally:
        agent.register_control_handler("RRefDelete", rref_delete)
    assert time.monotonic() - started < 1.0


def test_send_control_retries_an_unreachable_peer_until_its_deadline(solo: rpc.WorkerInfo) -> None:
    agent = agent_mod.current()
    address = f"127.0.0.1:{free_port()}"  # nobody listens there
    ghost = Peer("ghost", 7, address, dial=address)
    started = time.monotonic()
    with pytest.raises(errors.WorkerUnavailableError, match="ghost"):
        agent.caller.send_control(ghost, "ChildAck", pb.ChildAck(), pb.Ack, timeout=0.8)
    assert 0.7 < time.monotonic() - started < 3.0


def test_retry_with_backoff_stops_on_success_or_non_transient() -> None:
    now = [0.0]
    calls: list[float] = []

    def flaky(timeout: float) -> str:
        calls.append(timeout)
        if len(calls) < 3:
            raise errors.WorkerUnavailableError("down")
        return "up"

    def sleep(s: float) -> None:
        now[0] += s

    assert retry_with_backoff(flaky, 10.0, sleep=sleep, clock=lambda: now[0]) == "up"
    assert len(calls) == 3

    def broken(timeout: float) -> str:
        raise errors.PolicyError("no")

    with pytest.raises(errors.PolicyError):
        retry_with_backoff(broken, 10.0, sleep=sleep, clock=lambda: now[0])


def test_watch_control_streams_events(solo: rpc.WorkerInfo) -> None:
    agent = agent_mod.current()
    address = rpc.get_debug_info()["peers"][0]["address"]
    with grpc.insecure_channel(address) as channel:
        watch = channel.unary_stream(
            "/gradwire.v1.Worker/WatchControl",
            pb.WatchRequest.SerializeToString,
            pb.ControlEvent.FromString,
        )
        stream = watch(
            pb.WatchRequest(kinds=["RRefDelete"]),
            timeout=5,
            metadata=[("x-gradwire-token", "test-token")],
        )

        def emit() -> None:
            time.sleep(0.3)  # after the subscription is in place
            agent.emit_control_event(pb.ControlEvent(kind="ChildAck", direction="sent"))
            agent.emit_control_event(pb.ControlEvent(kind="RRefDelete", direction="received"))

        threading.Thread(target=emit, daemon=True).start()
        event = next(iter(stream))
        stream.cancel()
    assert event.kind == "RRefDelete" and event.direction == "received"


def test_gpu_tensor_without_device_map_fails_at_once(
    solo: rpc.WorkerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No GPU here: pretend arrays live on cuda:0 to exercise the sender's check.
    monkeypatch.setattr(tensors, "_device_of", lambda arr: "cuda:0")
    started = time.monotonic()
    with pytest.raises(errors.SerializationError, match=r"set_device_map\('solo'"):
        rpc.rpc_async("solo", first_requires_grad, (Tensor._wrap(np.ones(2)), None))
    assert time.monotonic() - started < 0.5
