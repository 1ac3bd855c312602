"""The fast lane (gradwire.server.fast_lane): which calls take it, what it answers, and that it
refuses a missing token before decoding anything."""

from __future__ import annotations

import os
import random
from typing import Any

import grpc
import numpy as np
import pytest
from gradwire import errors
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime.agent import current
from gradwire._runtime.calls import caller as caller_mod
from gradwire._runtime.calls.callee import Callee
from gradwire._wire import calls, framing, pickler
from gradwire._wire.pickler import EncodeContext
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import free_port, run_cluster
from gradwire.server import fast_lane

from . import lane_bodies
from .fuzz_client import invoke
from .fuzzgen import GENERATORS


@pytest.mark.parametrize("options", [{}, {"use_unix_socket": False}], ids=["unix-socket", "tcp"])
def test_plain_calls_take_the_fast_lane_and_deferred_ones_do_not(options: dict[str, Any]) -> None:
    results = run_cluster(2, lane_bodies.routing, options=options)
    r = results[0].value
    assert r["plain"] == list(range(10))
    assert r["big_equal"] is True
    assert r["deferred"] == [1, 2, 3, 1, 2, 3]
    assert r["with_rref"] == 3
    # The 5 plain rpc_sync calls, the big echo, the lane_count and pipe_count calls that read
    # `before` (on the bulk lane, served as the fast lane's); not the 5 plain rpc_async calls
    # (on the bulk lane's pipe: served on the pool, as the gRPC pipe's are), nor the six
    # @async_execution calls nor the call with an RRef argument (asyncio server).
    assert r["lane_calls"] == 8
    assert r["pipe_calls"] == 5


def test_no_fast_lane_without_unix_sockets_and_its_tcp_port() -> None:
    options = {"use_unix_socket": False, "fast_lane_tcp": False}
    results = run_cluster(2, lane_bodies.routing, options=options)
    r = results[0].value
    assert r["plain"] == list(range(10)) and r["deferred"] == [1, 2, 3, 1, 2, 3]
    assert r["lane_calls"] == 0
    assert r["pipe_calls"] == 0  # no fast lane: rpc_async takes the gRPC pipe


def _solo(token: str = "the-token", **overrides: Any) -> Any:
    settings: dict[str, Any] = {"init_timeout": 20, "rpc_timeout": 10, "use_unix_socket": True}
    settings.update(overrides)
    options = rpc.GrpcRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{free_port()}", token=token, **settings
    )
    rpc.init_rpc("lane", 0, 1, options)
    return current()


def _call_frame(fn: Any, *args: Any) -> bytes:
    name, bound_self = calls.function_name(fn)
    header = pb.CallHeader(message_id=7, caller_id=0, kind=pb.CALL_KIND_PYTHON, function=name)
    first, buffers = calls.encode_body(
        pb.FrameHeader(call=header), (bound_self, args, {}), EncodeContext(peer="lane")
    )
    return framing.encode_frame(next(framing.split(first, buffers, 1 << 20)))


def test_a_deferred_reply_on_the_fast_lane_is_parked_and_fetched() -> None:
    """A caller that sends an @async_execution call to the fast lane anyway gets a
    continuation, and FetchReply on the asyncio server delivers the value."""
    agent = _solo()
    try:
        md = (("x-gradwire-token", "the-token"), ("x-gradwire-caller", "0"))
        with grpc.insecure_channel(agent.local_call_address) as lane:
            raw = lane.unary_unary(f"/{fast_lane.SERVICE}/Call")(
                _call_frame(lane_bodies.later, 41), timeout=10, metadata=md
            )
        reply = framing.decode_frame(raw).header.reply
        assert reply.continuation > 0 and reply.message_id == 7
        with grpc.insecure_channel(agent.local_address) as main:
            fetch = main.unary_stream(
                f"/{fast_lane.SERVICE}/FetchReply", pb.FetchReplyRequest.SerializeToString
            )
            request = pb.FetchReplyRequest(continuation=reply.continuation, caller_id=0)
            frames = [framing.decode_frame(f) for f in fetch(request, timeout=10, metadata=md)]
        asm = framing.Assembler(1 << 20)
        for f in frames:
            asm.feed(f)
        assert asm.message is not None
        body, _ = calls.decode_body(asm.message, {"policy": agent.policy, "worker": "lane"})
        assert body == 42
    finally:
        rpc.shutdown(graceful=False)


def test_no_decoder_is_reached_on_the_fast_lane_without_the_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = {"frame": 0, "pickle": 0}
    real_decode = fast_lane._decode
    real_loads, real_loads_plain = pickler.loads, pickler.loads_plain

    def decode(data: bytes) -> Any:
        counts["frame"] += 1
        return real_decode(data)

    def loads(*args: Any) -> Any:
        counts["pickle"] += 1
        return real_loads(*args)

    def loads_plain(*args: Any) -> Any:
        counts["pickle"] += 1
        return real_loads_plain(*args)

    monkeypatch.setattr(fast_lane, "_decode", decode)
    monkeypatch.setattr(pickler, "loads", loads)
    monkeypatch.setattr(pickler, "loads_plain", loads_plain)
    agent = _solo()  # the lane's handlers are built now, with the counting decoder
    try:
        rng = random.Random(5)
        with grpc.insecure_channel(agent.local_call_address) as lane:
            for _ in range(5):
                for method in fast_lane.FAST_LANE_METHODS:
                    case = GENERATORS[method](rng)
                    for md in ((), (("x-gradwire-token", "wrong"),)):
                        code, details, _ = invoke(lane, method, case.messages, md, 5.0)
                        assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code, details)
                        assert "cluster token" in details
            assert counts == {"frame": 0, "pickle": 0}, counts
            md = (("x-gradwire-token", "the-token"), ("x-gradwire-caller", "0"))
            code, _, out = invoke(lane, "Call", [_call_frame(lane_bodies.echo, 5)], md, 5.0)
            assert code == grpc.StatusCode.OK and out
        assert counts["frame"] >= 1 and counts["pickle"] >= 1, counts
    finally:
        rpc.shutdown(graceful=False)


def test_the_fast_lane_refuses_a_stopped_worker_and_leaves_no_socket() -> None:
    agent = _solo()
    path = agent.local_call_address.removeprefix("unix:")

    assert os.path.exists(path)
    rpc.shutdown(graceful=False)
    assert not os.path.exists(path)
    with grpc.insecure_channel(agent.local_call_address) as lane:
        md = (("x-gradwire-token", "the-token"),)
        code, _, _ = invoke(lane, "Call", [_call_frame(lane_bodies.echo, 5)], md, 2.0)
    assert code == grpc.StatusCode.UNAVAILABLE


def test_a_fast_lane_that_cannot_bind_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker still starts and serves, and advertises no fast lane."""
    real = grpc.server

    class Unbindable:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._server = real(*args, **kwargs)

        def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
            self._server.add_registered_method_handlers(service, handlers)

        def add_insecure_port(self, address: str) -> int:
            return 0

    monkeypatch.setattr(fast_lane.grpc, "server", Unbindable)
    agent = _solo()
    try:
        assert agent.local_call_address == ""
        assert agent.peers[0].call_dial == agent.peers[0].dial
        assert rpc.rpc_sync("lane", lane_bodies.echo, (7,)) == 7
        assert rpc.get_debug_info()["calls_served_fast_lane"] == 0
    finally:
        rpc.shutdown(graceful=False)


def _sync(*args: Any, **kwargs: Any) -> Any:
    return rpc.rpc_sync(*args, **kwargs)


def _async(*args: Any, **kwargs: Any) -> Any:
    return rpc.rpc_async(*args, **kwargs).wait()


#: Every route a call can take (gradwire._runtime.calls.routes): (verb, options, fast lane,
#: whether its calls reach the callee as one frame, where the plain path can take them).
ROUTES = {
    "call-stream-fast-lane": (_sync, {"single_frame_bytes": 4096}, True, True),
    "call-stream-fast-lane-tcp": (
        _sync,
        {"single_frame_bytes": 4096, "use_unix_socket": False},
        True,
        True,
    ),
    "call-stream-asyncio": (
        _sync,
        {"single_frame_bytes": 4096, "use_unix_socket": False, "fast_lane_tcp": False},
        False,
        True,
    ),
    # rpc_async's call pipe is served by the asyncio server, over the Unix socket or TCP (the
    # test keeps these calls off the bulk lane: ASYNC_ON_LANE = False).
    "pipe-unix": (_async, {"single_frame_bytes": 4096}, False, True),
    "pipe-tcp": (_async, {"single_frame_bytes": 4096, "use_unix_socket": False}, False, True),
    # rpc_async on the bulk lane's pipe, served on the pool as the gRPC pipe's calls are.
    "async-lane-pipe-tcp": (
        _async,
        {"single_frame_bytes": 4096, "use_unix_socket": False},
        False,
        True,
    ),
    "framed-stream": (_sync, {"single_frame_bytes": 0}, False, False),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_plain_calls_keep_every_outcome_of_the_general_path(
    route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    call, options, lane, one_frame = ROUTES[route]
    served: list[bool] = []
    real = Callee.serve_plain

    def serve_plain(self: Callee, frame: Any, caller_id: int) -> Any:
        reply = real(self, frame, caller_id)
        served.append(reply is not None)
        return reply

    real_plain_call = Callee.plain_call

    def plain_call(self: Callee, function: str, data: Any) -> Any:
        plain = real_plain_call(self, function, data)  # a lane pipe's PLAIN record (None:
        if plain is not None:  # it is served as the frame it stands for, by serve_plain)
            served.append(True)
        return plain

    monkeypatch.setattr(Callee, "serve_plain", serve_plain)
    monkeypatch.setattr(Callee, "plain_call", plain_call)
    if route.startswith("pipe"):
        monkeypatch.setattr(caller_mod, "ASYNC_ON_LANE", False)
    _solo(**options)
    try:
        # A blocking call first opens the connections later calls may find idle (an
        # rpc_async never waits for a connection); it is not counted.
        assert rpc.rpc_sync("lane", lane_bodies.echo, (0,)) == 0
        base = current().callee.served_fast_lane
        served.clear()
        assert call("lane", lane_bodies.echo, (5,)) == 5
        assert call("lane", lane_bodies.keywords, (1,), {"b": 3}) == (1, 3)
        assert call("lane", "abc".upper) == "ABC"  # a bound method: self travels too
        # A plain call whose reply is too big for one frame: parked and fetched.
        assert call("lane", lane_bodies.text, (10_000,)) == "x" * 10_000
        # A plain call returning a tensor: the general encoding, tensor bytes out of the pickle.
        out = call("lane", lane_bodies.arange, (5,))
        assert out.dtype == np.float32 and out.tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match="no good"):
            call("lane", lane_bodies.fail, ("no good",))
        # Not plain: a refused function, a non-plain argument. The general path answers.
        with pytest.raises(errors.PolicyError, match="refused by the callable policy"):
            call("lane", os.getcwd)
        assert call("lane", lane_bodies.echo, (np.ones(2),)).tolist() == [1, 1]
        callee = current().callee
        assert callee.failed == 2
        if one_frame:  # the six plain calls answered by the plain path, the last two not
            assert served == [True] * 6 + [False, False]
        else:  # a framed stream is never plain
            assert served == []
        assert callee.served_fast_lane - base == (len(served) if lane else 0)
    finally:
        rpc.shutdown(graceful=False)


class _Context:
    def __init__(self, left: float | None) -> None:
        self._left = left

    def time_remaining(self) -> float | None:
        return self._left


class _Agent:
    def __init__(self, rpc_timeout: float) -> None:
        self.options = type("Options", (), {"rpc_timeout": rpc_timeout})()


def test_a_handler_on_a_call_stream_waits_at_most_rpc_timeout() -> None:
    # A call stream has no deadline: gRPC reports ~2**63 ns left, which a lock's timeout
    # refuses (OverflowError); a gradients frame whose answer was not ready failed that way.
    wait = fast_lane._wait_seconds
    assert wait(_Agent(30.0), _Context(2.0**63 / 1e9)) == 30.0
    assert wait(_Agent(0.0), _Context(2.0**63 / 1e9)) is None  # rpc_timeout 0: no bound
    assert wait(_Agent(30.0), _Context(None)) == 30.0
    assert wait(_Agent(30.0), _Context(2.5)) == 2.5  # a unary call keeps its own deadline
    assert wait(_Agent(30.0), _Context(-1.0)) == 0.0
