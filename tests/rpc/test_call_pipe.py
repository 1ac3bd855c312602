"""rpc_async's call pipe (gradwire._runtime.calls.pipe, the ``CallPipe`` method): many calls in
flight on one stream, in batches, replies in any order; each call keeps its own deadline and
error; a malformed batch or a missing token ends only that stream. Real workers on loopback,
over the Unix socket and over TCP."""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from gradwire import errors
from gradwire._runtime.agent import current
from gradwire._runtime.calls import caller as caller_mod
from gradwire._runtime.calls import pipe as pipes
from gradwire._runtime.calls import streams as call_streams
from gradwire._wire.framing import batch_end, pack_batch, split_batches, unpack_batch
from gradwire.distributed import rpc
from gradwire.errors import SerializationError
from gradwire.server import servicer as servicer_module

from . import bodies
from .conftest import solo_options
from .dynamic_group import threads_named


@pytest.fixture(scope="module", params=["unix", "tcp"])
def solo(request: pytest.FixtureRequest) -> Iterator[None]:
    rpc.init_rpc("solo", 0, 1, solo_options(use_unix_socket=request.param == "unix"))
    try:
        yield
    finally:
        rpc.shutdown(graceful=False)


@pytest.fixture(autouse=True)
def _every_call_on_the_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the pipe: no rpc_async goes on the bulk lane's idle connections."""
    monkeypatch.setattr(caller_mod, "ASYNC_ON_LANE", False)


def _pipes() -> int:
    transport = current().transport
    return sum(1 for s in transport._stubs.values() if s.pipe is not None and s.pipe.alive)


def test_batches_round_trip_and_malformed_ones_are_refused() -> None:
    frames = [b"", b"a", b"bc" * 1000]
    assert [bytes(f) for f in unpack_batch(pack_batch(frames))] == frames
    assert unpack_batch(b"") == []
    with pytest.raises(SerializationError, match="length prefix"):
        unpack_batch(b"\x01\x00")
    with pytest.raises(SerializationError, match="a frame of 9 bytes"):
        unpack_batch(b"\x09\x00\x00\x00abc")


def test_a_batch_stops_growing_at_its_limit_and_a_large_frame_goes_alone() -> None:
    frames = [b"a" * 4, b"b" * 4, b"c" * 20, b"d" * 3]
    assert batch_end(frames, 0, 10) == 2
    assert batch_end(frames, 2, 10) == 3  # over the limit alone: still one message
    assert batch_end(frames, 3, 10) == 4
    batches = [[bytes(f) for f in unpack_batch(b)] for b in split_batches(frames, 10)]
    assert batches == [frames[:2], frames[2:3], frames[3:]]


def test_many_calls_in_flight_each_get_their_own_result(solo: None) -> None:
    futs = [rpc.rpc_async("solo", operator.mul, (i, 3)) for i in range(500)]
    assert [f.wait() for f in futs] == [i * 3 for i in range(500)]
    assert _pipes() == 1  # all of them on the one pipe


def test_replies_come_back_in_any_order(solo: None) -> None:
    slow = rpc.rpc_async("solo", bodies.sleep_then, (1.0, "slow"))
    time.sleep(0.05)
    t0 = time.monotonic()
    fast = [rpc.rpc_async("solo", operator.add, (i, 1)) for i in range(20)]
    assert [f.wait() for f in fast] == list(range(1, 21))
    assert time.monotonic() - t0 < 0.9, "fast calls waited behind the slow one"
    assert not slow.done()
    assert slow.wait() == "slow"


def test_each_call_keeps_its_deadline_and_the_pipe_goes_on(solo: None) -> None:
    late = rpc.rpc_async("solo", bodies.sleep_then, (2.0, "late"), timeout=0.3)
    ok = rpc.rpc_async("solo", bodies.sleep_then, (0.5, "ok"), timeout=5)
    with pytest.raises(errors.RpcTimeoutError, match="timed out"):
        late.wait()
    assert ok.wait() == "ok"
    assert rpc.rpc_async("solo", operator.add, (1, 2)).wait() == 3
    assert _pipes() == 1


def _pipe_threads() -> int:
    return threads_named("gradwire-pipe")


def test_an_idle_pipe_closes_with_its_thread_and_the_next_call_opens_one(
    solo: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipes, "PIPE_IDLE_SECONDS", 0.3)
    # A call in flight longer than the idle time keeps its pipe: only an idle one closes.
    assert rpc.rpc_async("solo", bodies.sleep_then, (1.0, "slow")).wait() == "slow"
    assert rpc.rpc_async("solo", operator.add, (1, 2)).wait() == 3
    assert _pipes() == 1
    deadline = time.monotonic() + 10
    while (_pipes() or _pipe_threads()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pipes() == 0 and _pipe_threads() == 0, "an idle pipe kept its reader thread"
    assert [rpc.rpc_async("solo", operator.add, (i, 1)).wait() for i in range(3)] == [1, 2, 3]
    assert _pipes() == 1


def test_errors_keep_their_type_per_call(solo: None) -> None:
    bad = rpc.rpc_async("solo", operator.truediv, (1, 0))
    good = rpc.rpc_async("solo", operator.add, (2, 2))
    with pytest.raises(ZeroDivisionError):
        bad.wait()
    assert good.wait() == 4


def test_callbacks_and_many_threads(solo: None) -> None:
    results: list[int] = []
    lock = threading.Lock()

    def work(base: int) -> None:
        futs = [rpc.rpc_async("solo", operator.add, (base, i)) for i in range(100)]
        chained = [f.then(lambda f: f.value() * 2) for f in futs]
        got = [c.wait() for c in chained]
        with lock:
            results.extend(got)
        assert got == [(base + i) * 2 for i in range(100)]

    threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 400


def _fresh_pipe() -> None:
    """Close the address's pipe: the next rpc_async opens a new one."""
    for stubs in current().transport._stubs.values():  # noqa: SLF001
        if stubs.pipe is not None:
            stubs.pipe.close()


@pytest.mark.parametrize("core", [True, False], ids=["core-call-api", "public-api"])
def test_both_pipes_carry_many_calls_from_many_threads(
    solo: None, core: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if core and not call_streams.CORE_CALL_API:
        pytest.skip("this grpcio has no core call API")
    monkeypatch.setattr(call_streams, "CORE_CALL_API", core)
    _fresh_pipe()
    got: dict[int, list[int]] = {}

    def work(base: int) -> None:
        futs = [rpc.rpc_async("solo", operator.add, (base, i)) for i in range(150)]
        got[base] = [f.wait() for f in futs]

    threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == {k * 1000: [k * 1000 + i for i in range(150)] for k in range(3)}
    pipe = next(s.pipe for s in current().transport._stubs.values() if s.pipe is not None)
    assert isinstance(pipe, pipes.CorePipe if core else pipes.Pipe)
    _fresh_pipe()  # the other tests get the default one again


def test_calls_sent_while_a_send_is_in_flight_go_out_as_one_batch(
    solo: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    frames_of = servicer_module._pipe_frames

    def counted(batch: bytes) -> Any:
        frames = frames_of(batch)
        sizes.append(len(frames))
        return frames

    monkeypatch.setattr(servicer_module, "_pipe_frames", counted)
    futs = [rpc.rpc_async("solo", operator.add, (i, 1)) for i in range(400)]
    assert [f.wait() for f in futs] == [i + 1 for i in range(400)]
    assert sum(sizes) == 400
    assert max(sizes) > 1, f"every call went alone: {len(sizes)} batches"


def test_replies_posted_from_many_threads_wake_the_loop_once_per_burst() -> None:
    loop = asyncio.new_event_loop()
    wakes = []
    schedule = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any) -> Any:
        wakes.append(callback)
        return schedule(callback, *args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        replies = servicer_module._PipeReplies(loop)
        for _ in range(200):
            replies.started()
        threads = [
            threading.Thread(
                target=lambda k=k: [replies.post(b"%d" % (k * 50 + i)) for i in range(50)]
            )
            for k in range(4)
        ]
        for t in threads:  # the loop is not running: nothing takes the replies meanwhile
            t.start()
        for t in threads:
            t.join(10)
        assert len(wakes) == 1  # one wake scheduled for the whole burst
        out = loop.run_until_complete(asyncio.wait_for(replies.take(), 5))
        assert sorted(int(b) for b in out) == list(range(200))
        assert replies.idle()
        replies.started()
        replies.post(None)  # a call that ends with nothing to send (cancelled)
        assert replies.idle() and len(wakes) == 2
    finally:
        loop.close()


def _raw_pipe(agent: Any, metadata: Any, batches: list[bytes]) -> grpc.RpcError | list[bytes]:
    me = next(p for p in agent.peers if p.name == agent.name)
    channel = grpc.insecure_channel(me.address)
    try:
        stub = channel.stream_stream("/gradwire.v1.Worker/CallPipe")
        try:
            return list(stub(iter(batches), metadata=metadata, timeout=10))
        except grpc.RpcError as exc:
            return exc
    finally:
        channel.close()


def test_a_malformed_batch_ends_that_stream_only(solo: None) -> None:
    agent = current()
    out = _raw_pipe(agent, agent.transport.metadata, [b"\x05\x00\x00\x00ab"])
    assert isinstance(out, grpc.RpcError)
    assert out.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "truncated batch" in (out.details() or "")
    assert rpc.rpc_async("solo", operator.add, (1, 2)).wait() == 3
    # A whole batch whose frame's header is not a FrameHeader: refused the same way.
    garbage = pack_batch([b"\x04\x00\x00\x00\xff\xff\xff\xff"])
    out = _raw_pipe(agent, agent.transport.metadata, [garbage])
    assert isinstance(out, grpc.RpcError)
    assert out.code() == grpc.StatusCode.INVALID_ARGUMENT, out.details()
    assert rpc.rpc_async("solo", operator.add, (1, 2)).wait() == 3


def test_a_pipe_without_the_token_is_refused(solo: None) -> None:
    agent = current()
    caller_only = [(k, v) for k, v in agent.transport.metadata if k != "x-gradwire-token"]
    out = _raw_pipe(agent, caller_only, [pack_batch([b"anything"])])
    assert isinstance(out, grpc.RpcError)
    assert out.code() == grpc.StatusCode.UNAUTHENTICATED
    assert rpc.rpc_async("solo", operator.add, (1, 2)).wait() == 3


ROUTES = ["pipe", "asyncio call stream", "fast-lane call stream"]


def _control_frame(route: str, method: str, request: bytes) -> Any:
    """Send a ``control`` frame naming ``method`` to this worker on ``route``; its reply."""
    from gradwire._proto import worker_pb2 as pb
    from gradwire._wire.framing import Frame, encode_frame

    agent = current()
    message_id = 1 << 50
    control = pb.ControlRequest(message_id=message_id, method=method, request=request)
    frame = Frame(pb.FrameHeader(control=control, last=True), ())
    me = agent.peers[0]
    if route != "pipe":
        assert me.call_dial != me.dial  # the worker has a fast lane
        return agent.transport.call(
            me.dial if route.startswith("asyncio") else me.call_dial, frame, 10
        )
    done = threading.Event()
    out: list[Any] = []

    def answered(frame: Any, error: Any) -> None:
        out.append(frame if frame is not None else error)
        done.set()

    agent.transport.pipe_call(me.dial, message_id, encode_frame(frame), 10, answered)
    assert done.wait(10)
    return out[0]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "method", ["RemoteCall", "Shutdown", "__import__", "PropagateGradients", "FetchRRef"]
)
def test_a_control_frame_may_name_only_the_listed_control_methods(
    solo: None, route: str, method: str
) -> None:
    reply = _control_frame(route, method, b"")
    assert reply.header.reply.HasField("error"), reply
    assert "is not a control method a call frame serves" in reply.header.reply.error.message
    assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3  # the worker serves on


@pytest.mark.parametrize("route", ROUTES)
def test_a_malformed_control_request_is_an_error_reply(solo: None, route: str) -> None:
    reply = _control_frame(route, "RRefDelete", b"\xff\xff\xff")
    assert reply.header.reply.HasField("error"), reply
    assert "malformed RRefDelete request" in reply.header.reply.error.message
    assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3


@pytest.mark.parametrize("route", ROUTES)
def test_a_well_formed_control_frame_gets_its_methods_response(solo: None, route: str) -> None:
    from gradwire._proto import worker_pb2 as pb

    # ReleaseContext of a context this worker never had: answered (nothing to release).
    request = pb.ReleaseContextRequest(context_id=987654321).SerializeToString()
    reply = _control_frame(route, "ReleaseContext", request)
    assert not reply.header.reply.HasField("error"), reply
    assert reply.header.reply.message_id == 1 << 50
    pb.Ack.FromString(reply.header.reply.control_response)
