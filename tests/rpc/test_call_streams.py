"""rpc_sync over CallStream: streams reused, bounded, timed out, refused, and the fallbacks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from gradwire import errors
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime import agent as agent_mod
from gradwire._runtime.calls import streams as call_streams
from gradwire._runtime.calls.streams import StreamFailed, Watchdog
from gradwire._runtime.transport.transport import STREAMS_PER_PEER
from gradwire._wire import calls
from gradwire._wire.framing import Frame, decode_frame, encode_frame, one_frame
from gradwire._wire.pickler import EncodeContext
from gradwire.distributed import rpc

from .test_rpc_local import _ran, record, slow


@pytest.fixture(autouse=True)
def _no_lane_calls(request: pytest.FixtureRequest) -> Iterator[None]:
    """These tests are about the gRPC call streams: over TCP, the worker's rpc_sync would
    take the bulk lane instead (tests/rpc/test_bulk_lane.py)."""
    if "solo" not in request.fixturenames:
        yield
        return
    request.getfixturevalue("solo")
    transport = agent_mod.current().transport
    lane, transport.lane = transport.lane, None
    try:
        yield
    finally:
        transport.lane = lane


def fail() -> None:
    raise KeyError("missing key")


def _streams() -> Any:
    """The call streams of this worker to itself (where rpc_sync sends its calls)."""
    agent = agent_mod.current()
    peer = agent.peers[0]
    return agent.transport._get(peer.call_dial).streams  # noqa: SLF001


def _open(streams: Any) -> int:
    return streams._open  # noqa: SLF001


def test_sequential_calls_share_one_stream_and_keep_every_outcome(solo: rpc.WorkerInfo) -> None:
    for i in range(30):
        assert rpc.rpc_sync("solo", calls_add, (i, 1)) == i + 1
    streams = _streams()
    assert _open(streams) == 1
    with pytest.raises(KeyError, match="missing key"):
        rpc.rpc_sync("solo", fail)
    # A remote exception is a reply, not a broken stream.
    assert _open(streams) == 1
    assert rpc.rpc_sync("solo", calls_add, ("a", "b")) == "ab"
    assert _open(streams) == 1


def calls_add(a: Any, b: Any) -> Any:
    return a + b


def test_concurrent_calls_open_at_most_the_limit_and_overflow_to_unary(
    solo: rpc.WorkerInfo,
) -> None:
    threads = STREAMS_PER_PEER + 6
    start = threading.Barrier(threads)
    results: list[Any] = [None] * threads

    def run(i: int) -> None:
        start.wait()
        results[i] = [rpc.rpc_sync("solo", slow, (0.05,)) for _ in range(3)]

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(30)
    assert results == [["done"] * 3] * threads
    assert 1 <= _open(_streams()) <= STREAMS_PER_PEER


def test_streams_idle_past_their_time_close_when_their_address_is_used_again(
    solo: rpc.WorkerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = 4
    start = threading.Barrier(threads)
    workers = [
        threading.Thread(target=lambda: (start.wait(), rpc.rpc_sync("solo", slow, (0.2,))))
        for _ in range(threads)
    ]
    for t in workers:
        t.start()
    for t in workers:
        t.join(30)
    streams = _streams()
    opened = _open(streams)
    assert opened >= 2  # the burst opened several streams (each holds a callee thread)
    assert rpc.rpc_sync("solo", calls_add, (1, 1)) == 2
    assert _open(streams) == opened  # not idle long enough: kept
    monkeypatch.setattr(call_streams, "STREAM_IDLE_SECONDS", 0.05)
    time.sleep(0.1)
    assert rpc.rpc_sync("solo", calls_add, (2, 2)) == 4
    assert _open(streams) == 1  # the one just used is left


def test_a_timed_out_call_fails_as_a_timeout_and_the_next_call_gets_a_new_stream(
    solo: rpc.WorkerInfo,
) -> None:
    assert rpc.rpc_sync("solo", slow, (0.0,)) == "done"
    before = _open(_streams())
    started = time.monotonic()
    with pytest.raises(errors.RpcTimeoutError, match=r"timed out after 0\.\d+ s"):
        rpc.rpc_sync("solo", slow, (3.0,), timeout=0.3)
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 1.5
    # The cancelled stream was discarded, not handed to the next call.
    assert _open(_streams()) == before - 1
    assert rpc.rpc_sync("solo", slow, (0.01,), timeout=5) == "done"
    assert rpc.rpc_sync("solo", slow, (0.01,), timeout=0) == "done"  # 0: no deadline


def test_without_the_core_call_api_rpc_sync_rides_public_api_streams(
    solo: rpc.WorkerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = agent_mod.current()
    address = agent.peers[0].call_dial
    agent.transport.drop(address)  # the next call builds its streams again, on the public API
    monkeypatch.setattr(call_streams, "CORE_CALL_API", False)
    served = agent.callee.served
    assert [rpc.rpc_sync("solo", calls_add, (i, i)) for i in range(5)] == [0, 2, 4, 6, 8]
    assert agent.callee.served >= served + 5
    streams = _streams()
    assert streams._core is None and _open(streams) == 1  # noqa: SLF001
    with pytest.raises(KeyError, match="missing key"):
        rpc.rpc_sync("solo", fail)
    with pytest.raises(errors.RpcTimeoutError, match=r"timed out after 0\.\d+ s"):
        rpc.rpc_sync("solo", slow, (3.0,), timeout=0.3)
    assert rpc.rpc_sync("solo", calls_add, ("a", "b")) == "ab"
    monkeypatch.undo()
    agent.transport.drop(address)
    assert rpc.rpc_sync("solo", calls_add, (1, 1)) == 2
    assert _open(_streams()) == 1
    assert (_streams()._core is not None) == call_streams.CORE_CALL_API  # noqa: SLF001


def test_the_core_call_api_is_found_on_this_grpcio() -> None:
    # The capability check at import; a grpcio release without the API takes the test above.
    assert call_streams.CORE_CALL_API == (call_streams._core_call_api() is not None)  # noqa: SLF001


def _call_frame(fn: Any, *args: Any) -> Frame:
    header = pb.FrameHeader(
        call=pb.CallHeader(
            message_id=1,
            kind=pb.CALL_KIND_PYTHON,
            function=calls.function_name(fn)[0],
            timeout_seconds=5,
        )
    )
    first, buffers = calls.encode_body(header, (None, args, {}), EncodeContext())
    return one_frame(first, buffers)


def _addresses(agent: Any) -> list[str]:
    peer = agent.peers[0]
    return sorted({peer.dial, peer.call_dial})


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_a_stream_without_the_right_token_runs_nothing(
    solo: rpc.WorkerInfo, token: str | None
) -> None:
    metadata = [("x-gradwire-token", token)] if token else []
    for address in _addresses(agent_mod.current()):
        _ran.clear()
        with grpc.insecure_channel(address) as channel:
            stream = channel.stream_stream("/gradwire.v1.Worker/CallStream")
            frames = [encode_frame(_call_frame(record, "intruder"))]
            with pytest.raises(grpc.RpcError) as info:
                list(stream(iter(frames), timeout=5, metadata=metadata))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, address
            assert ("wrong" if token else "missing") in info.value.details()
        assert _ran == []


def test_one_reply_per_frame_in_order_and_a_malformed_frame_ends_the_stream(
    solo: rpc.WorkerInfo,
) -> None:
    metadata = [("x-gradwire-token", "test-token")]
    for address in _addresses(agent_mod.current()):
        _ran.clear()
        with grpc.insecure_channel(address) as channel:
            stream = channel.stream_stream("/gradwire.v1.Worker/CallStream")
            frames = [encode_frame(_call_frame(record, f"call-{i}")) for i in range(4)]
            replies = [decode_frame(r) for r in stream(iter(frames), timeout=5, metadata=metadata)]
            assert len(replies) == 4
            assert [r.header.reply.error.message for r in replies] == [""] * 4
            assert _ran == ["call-0", "call-1", "call-2", "call-3"], address
            bad = [encode_frame(_call_frame(record, "before")), b"\x00\xff garbage"]
            got = stream(iter(bad), timeout=5, metadata=metadata)
            assert not decode_frame(next(got)).header.reply.HasField("error")
            with pytest.raises(grpc.RpcError) as info:
                next(got)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, address
            assert info.value.details()
    # The worker still serves.
    assert rpc.rpc_sync("solo", calls_add, (2, 3)) == 5


class _FakeStream:
    """Stands in for a stream in the Watchdog's protocol: ``expired`` and ``cancel``."""

    def __init__(self) -> None:
        self.expired = False
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()


def test_watchdog_cancels_expired_streams_only() -> None:
    dog = Watchdog()
    try:
        late, soon, done = _FakeStream(), _FakeStream(), _FakeStream()
        now = time.monotonic()
        dog.arm(late, now + 30)  # type: ignore[arg-type]
        dog.arm(done, now + 0.05)  # type: ignore[arg-type]
        assert dog.disarm(done) is False  # type: ignore[arg-type]
        # Armed after a later deadline: the watchdog must wake for this nearer one.
        dog.arm(soon, time.monotonic() + 0.1)  # type: ignore[arg-type]
        assert soon.cancelled.wait(5)
        assert soon.expired and dog.disarm(soon) is True  # type: ignore[arg-type]
        time.sleep(0.1)
        assert not done.cancelled.is_set() and not done.expired
        assert not late.cancelled.is_set() and not late.expired
    finally:
        dog.close()


def test_stream_failures_carry_the_status_map_rpc_error_expects() -> None:
    from gradwire._runtime.transport.transport import map_rpc_error

    failure = StreamFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline of 0.2 s exceeded")
    error = map_rpc_error(failure, "peer", "rpc to f", time.monotonic() - 0.2, 0.2)
    assert isinstance(error, errors.RpcTimeoutError)
    failure = StreamFailed(grpc.StatusCode.UNAVAILABLE, "the peer ended the call stream")
    error = map_rpc_error(failure, "peer", "rpc to f", time.monotonic(), 1.0)
    assert isinstance(error, errors.WorkerUnavailableError)
    assert "ended the call stream" in str(error)


class _EchoServer:
    """A real gRPC server on a loopback port serving CallStream as an echo of each frame (a
    frame whose pickle is b"sleep" is answered after 2 s)."""

    def __init__(self, port: int = 0) -> None:
        from concurrent import futures

        def echo(requests: Any, context: Any) -> Any:
            for raw in requests:
                if decode_frame(raw).raw[0] == b"sleep":
                    time.sleep(2)
                yield raw

        handler = grpc.method_handlers_generic_handler(
            "gradwire.v1.Worker", {"CallStream": grpc.stream_stream_rpc_method_handler(echo)}
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()


def _frame(data: bytes) -> Frame:
    header = pb.FrameHeader(call=pb.CallHeader(message_id=7), last=True)
    header.payload.pickle_nbytes = len(data)
    return Frame(header, [data])


def _raw_streams(port: int, dog: Watchdog, core: bool) -> call_streams.Streams:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return call_streams.Streams(
        channel, "/gradwire.v1.Worker/CallStream", lambda: (), 2, dog, core=core
    )


#: Both ways of driving a stream: grpcio's core call API (when this grpcio has it) and the
#: public streaming API it falls back to.
API = pytest.mark.parametrize(
    "core",
    [
        pytest.param(
            True,
            id="core",
            marks=pytest.mark.skipif(not call_streams.CORE_CALL_API, reason="no core call API"),
        ),
        pytest.param(False, id="public"),
    ],
)


@API
def test_a_stream_whose_server_died_fails_at_once_and_is_not_reused(core: bool) -> None:
    dog = Watchdog()
    echo = _EchoServer()
    streams = _raw_streams(echo.port, dog, core)
    try:
        for i in range(3):
            reply = streams.exchange(_frame(b"x%d" % i), 5.0)
            assert reply is not None and reply.raw[0] == b"x%d" % i
        assert _open(streams) == 1
        echo.server.stop(0).wait(5)
        time.sleep(0.2)
        for _ in range(2):  # the dead idle stream, then a new one to nobody
            started = time.monotonic()
            with pytest.raises(StreamFailed) as info:
                streams.exchange(_frame(b"y"), 5.0)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < 3
            assert _open(streams) == 0
        # A server again on the same port: the next call opens a working stream.
        again = _EchoServer(echo.port)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    reply = streams.exchange(_frame(b"z"), 5.0)
                    break
                except StreamFailed:  # the channel's reconnect backoff
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert reply is not None and reply.raw[0] == b"z"
        finally:
            again.server.stop(0)
    finally:
        streams.close()
        dog.close()


@API
def test_a_call_past_its_deadline_is_cancelled_by_the_watchdog(core: bool) -> None:
    dog = Watchdog()
    echo = _EchoServer()
    streams = _raw_streams(echo.port, dog, core)
    try:
        assert streams.exchange(_frame(b"warm"), 5.0) is not None
        started = time.monotonic()
        with pytest.raises(StreamFailed) as info:
            streams.exchange(_frame(b"sleep"), 0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0.3 <= time.monotonic() - started < 1.5
        assert _open(streams) == 0
        # Both streams busy: the third caller is told to go unary (None), nobody waits.
        results: list[Any] = []
        slow_calls = [
            threading.Thread(target=lambda: results.append(streams.exchange(_frame(b"sleep"), 5)))
            for _ in range(2)
        ]
        for t in slow_calls:
            t.start()
        time.sleep(0.5)
        assert streams.exchange(_frame(b"now"), 5.0) is None
        for t in slow_calls:
            t.join(10)
        assert [r.raw[0] for r in results] == [b"sleep", b"sleep"]
    finally:
        streams.close()
        echo.server.stop(0)
        dog.close()


def _started(streams: call_streams.Streams, readers: Any, data: bytes, timeout: float) -> Any:
    """``Streams.start`` a frame; a queue that gets ``(reply frame, error)``, or None when no
    stream was free."""
    import queue

    out: queue.Queue[tuple[Any, Any]] = queue.Queue()
    encoded = encode_frame(_frame(data))
    if not streams.start(encoded, timeout, readers, lambda f, e: out.put((f, e))):
        return None
    return out


@pytest.mark.skipif(not call_streams.CORE_CALL_API, reason="no core call API")
def test_a_started_frame_is_answered_on_a_reader_thread_and_its_stream_comes_back() -> None:
    from concurrent.futures import ThreadPoolExecutor

    dog, echo, readers = Watchdog(), _EchoServer(), ThreadPoolExecutor(4)
    streams = _raw_streams(echo.port, dog, True)
    try:
        answers = [_started(streams, readers, b"a%d" % i, 5.0) for i in range(2)]
        got = [a.get(timeout=5) for a in answers]
        assert [(f.raw[0], e) for f, e in got] == [(b"a0", None), (b"a1", None)]
        # Both streams (the limit) wait for slow replies: the next frame goes another way.
        slow = [_started(streams, readers, b"sleep", 5.0) for _ in range(2)]
        assert all(a is not None for a in slow)
        assert _started(streams, readers, b"busy", 5.0) is None
        assert [a.get(timeout=5)[0].raw[0] for a in slow] == [b"sleep", b"sleep"]
        deadline = time.monotonic() + 5
        while len(streams._idle) < 2 and time.monotonic() < deadline:  # given back
            time.sleep(0.01)
        assert len(streams._idle) == 2 and _open(streams) == 2
        # A reply later than its deadline: the error says so, the stream is dropped.
        late = _started(streams, readers, b"sleep", 0.3)
        frame, error = late.get(timeout=5)
        assert frame is None and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert _open(streams) == 1
        # The server goes away: the idle stream's frame fails (UNAVAILABLE), nothing hangs.
        echo.server.stop(0).wait(5)
        time.sleep(0.2)
        started = time.monotonic()
        dead = _started(streams, readers, b"x", 5.0)
        if dead is not None:  # sent on the idle stream before its end was seen
            frame, error = dead.get(timeout=5)
            assert frame is None and error.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 3
    finally:
        streams.close()
        readers.shutdown(wait=False)
        echo.server.stop(0)
        dog.close()


@pytest.mark.skipif(not call_streams.CORE_CALL_API, reason="no core call API")
def test_a_stream_that_ended_while_idle_is_not_used_to_start_a_frame() -> None:
    from concurrent.futures import ThreadPoolExecutor

    dog, echo, readers = Watchdog(), _EchoServer(), ThreadPoolExecutor(2)
    streams = _raw_streams(echo.port, dog, True)
    try:
        assert streams.exchange(_frame(b"warm"), 5.0) is not None
        idle = streams._idle[0]
        idle.close()  # ended (as a stream the peer closed): gRPC will not start a send on it
        assert _started(streams, readers, b"x", 5.0) is None  # nothing sent: go another way
        assert _open(streams) == 0 and not streams._idle
        # The next frame opens a new stream and is answered.
        answer = _started(streams, readers, b"y", 5.0)
        frame, error = answer.get(timeout=5)
        assert error is None and frame.raw[0] == b"y"
    finally:
        streams.close()
        readers.shutdown(wait=False)
        echo.server.stop(0)
        dog.close()
