"""rpc_async on the bulk lane's pipes (gradwire._runtime.transport.lane_pipe): many calls in flight
on one connection, replies in any order, each call with its own deadline and error; a broken
connection fails what it carried and the next call opens a new one; a connection that breaks
the protocol is closed and the worker goes on serving. Real workers and real sockets: this
process as a one-worker cluster over loopback TCP, two spawned workers, and socket pairs for
the record framing."""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import pickle
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from gradwire import errors
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime import agent as agent_mod
from gradwire._runtime.calls import hooks
from gradwire._runtime.calls import pipe as pipes
from gradwire._runtime.calls.streams import Watchdog
from gradwire._runtime.transport import lane_lead, lane_pipe
from gradwire._runtime.transport.lane_io import CALL, PIPE, PLAIN, PLAIN_CALL, PLAIN_REPLY, RECORD
from gradwire._wire import bulk, calls, pickler
from gradwire._wire.framing import Frame, decode_frame, encode_frame
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import run_cluster

from . import bodies
from .conftest import solo_options
from .test_bulk_lane import MAIN, TOKEN, _authenticated, _until_closed


@pytest.fixture(scope="module")
def main() -> Iterator[None]:
    """This process as worker MAIN over loopback TCP (its lane takes its own calls)."""
    rpc.init_rpc(MAIN, 0, 1, solo_options(use_unix_socket=False, token=TOKEN))
    try:
        yield
    finally:
        rpc.shutdown(graceful=False)


def _lane() -> Any:
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    return lane


def _served() -> int:
    return bulk.stats().get("pipe_calls_served", 0)


def _warm() -> None:
    """An rpc_async never waits for a connection: a blocking call opens the lane's first one,
    which the pipe then takes."""
    assert rpc.rpc_sync(MAIN, operator.add, (0, 0)) == 0
    deadline = time.monotonic() + 10
    while MAIN not in _lane()._pipes and time.monotonic() < deadline:
        rpc.rpc_async(MAIN, operator.add, (0, 0)).wait()


def test_many_calls_in_flight_on_one_connection_each_get_their_own_result(main: None) -> None:
    _warm()
    before = _served()
    futs = [rpc.rpc_async(MAIN, operator.mul, (i, 3)) for i in range(500)]
    assert [f.wait() for f in futs] == [i * 3 for i in range(500)]
    assert _served() - before == 500, "every call went on the lane pipe"
    assert list(_lane()._pipes) == [MAIN]


def test_a_slow_call_holds_up_no_other_call_on_the_pipe(main: None) -> None:
    """The callee serves a pipe's calls on its pool, not one after the other on the reader."""
    _warm()
    release = rpc.rpc_async(MAIN, bodies.sleep_then, (1.0, "slow"))
    time.sleep(0.05)
    t0 = time.monotonic()
    fast = [rpc.rpc_async(MAIN, operator.add, (i, 1)) for i in range(20)]
    assert [f.wait() for f in fast] == list(range(1, 21))
    assert time.monotonic() - t0 < 0.9, "fast calls waited behind the slow one"
    assert not release.done()
    assert release.wait() == "slow"


def test_each_call_keeps_its_deadline_and_its_error_type(main: None) -> None:
    _warm()
    late = rpc.rpc_async(MAIN, bodies.sleep_then, (2.0, "late"), timeout=0.3)
    ok = rpc.rpc_async(MAIN, bodies.sleep_then, (0.5, "ok"), timeout=5)
    bad = rpc.rpc_async(MAIN, operator.truediv, (1, 0))
    with pytest.raises(errors.RpcTimeoutError, match="timed out"):
        late.wait()
    with pytest.raises(ZeroDivisionError):
        bad.wait()
    assert ok.wait() == "ok"
    assert rpc.rpc_async(MAIN, operator.add, (1, 2)).wait() == 3


def test_a_broken_connection_fails_its_calls_and_the_next_call_opens_a_pipe(main: None) -> None:
    _warm()
    pipe = _lane()._pipes[MAIN]
    slow = rpc.rpc_async(MAIN, bodies.sleep_then, (1.0, "never read"), timeout=10)
    time.sleep(0.1)
    pipe.conn.shutdown(socket.SHUT_RDWR)  # the link breaks under the call
    with pytest.raises(errors.WorkerUnavailableError, match="lane pipe"):
        slow.wait()
    _warm()
    assert _lane()._pipes[MAIN] is not pipe
    assert rpc.rpc_async(MAIN, operator.add, (2, 3)).wait() == 5


def test_an_idle_pipe_gives_its_connection_back(main: None, monkeypatch: Any) -> None:
    monkeypatch.setattr(pipes, "PIPE_IDLE_SECONDS", 0.3)
    _warm()
    assert rpc.rpc_async(MAIN, operator.add, (1, 2)).wait() == 3
    deadline = time.monotonic() + 10
    while MAIN in _lane()._pipes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert MAIN not in _lane()._pipes, "an idle pipe was kept"
    links = _lane()._links[MAIN]
    assert links.calls.open == len(links.calls.idle) + len(links.calls.busy)
    _warm()
    assert [rpc.rpc_async(MAIN, operator.add, (i, 1)).wait() for i in range(3)] == [1, 2, 3]


def test_a_fan_in_goes_on_one_pipe_per_peer_read_by_one_thread() -> None:
    """Three spawned workers: rank 0's calls to each peer go on that peer's lane pipe, and
    one thread of rank 0 reads the replies of both."""
    out = run_cluster(3, bodies.fan_in_on_lane_pipes, options={"use_unix_socket": False})
    r = out[0].value
    assert r["results_ok"]
    assert r["pipes"] == ["worker1", "worker2"]
    assert r["readers"] == 1
    # 600 calls to each peer; the first round may start on the gRPC pipe while the lane opens.
    assert all(300 <= n <= 600 for n in r["served"]), r["served"]


def test_a_peer_that_serves_no_pipes_gets_its_calls_by_grpc(main: None, monkeypatch: Any) -> None:
    me = agent_mod.current()
    record = me.by_name[MAIN]
    monkeypatch.setitem(me.by_name, MAIN, dataclasses.replace(record, lane_pipe=False))
    before = _served()
    assert [rpc.rpc_async(MAIN, operator.add, (i, 1)).wait() for i in range(5)] == [1, 2, 3, 4, 5]
    assert _served() == before


# -- hostile connections: the worker closes them and goes on serving ----------------------------


def _pipe_record(frame: Frame) -> bytes:
    raw = encode_frame(frame)
    return RECORD.pack(PIPE, len(raw)) + raw


def _call_frame(message_id: int, fn: Any = operator.add, kind: int = pb.CALL_KIND_PYTHON) -> Frame:
    """A plain call of ``fn(3, 4)`` as a caller encodes it (``fn`` a name: any name)."""
    body = pickler.dumps_plain((None, (3, 4), {}))
    assert body is not None
    name = fn if isinstance(fn, str) else calls.function_name(fn)[0]
    header = pb.FrameHeader(
        call=pb.CallHeader(message_id=message_id, function=name, kind=kind), last=True
    )
    header.payload.pickle_nbytes = len(body)
    return Frame(header, [body])


@pytest.mark.parametrize(
    "junk",
    [
        RECORD.pack(PIPE, 1 << 40),  # over the frame limit
        RECORD.pack(PIPE, 3) + b"abc",  # not a frame
        RECORD.pack(CALL, 0),  # a pipe carries nothing but PIPE and PLAIN records
        RECORD.pack(PLAIN, 3) + b"abc",  # shorter than a PLAIN header
        RECORD.pack(PLAIN, 20) + PLAIN_CALL.pack(1, 0.0, 50) + b"f" * 2,  # name cut
    ],
    ids=["oversized", "undecodable", "other-record", "short-plain", "cut-plain-name"],
)
def test_a_connection_that_breaks_the_pipe_protocol_is_closed(main: None, junk: bytes) -> None:
    sock = _authenticated()
    try:
        sock.sendall(_pipe_record(_call_frame(1)) + junk)  # a pipe now, then the junk
        assert _until_closed(sock, 5) is not None, "the lane kept a connection that broke it"
    finally:
        sock.close()
    assert rpc.rpc_async(MAIN, operator.add, (1, 1)).wait() == 2


def test_a_pipe_frame_that_is_not_a_python_call_closes_the_connection(main: None) -> None:
    sock = _authenticated()
    try:
        sock.sendall(_pipe_record(_call_frame(7, kind=pb.CALL_KIND_REMOTE)))
        assert _until_closed(sock, 5) == b""
    finally:
        sock.close()
    assert rpc.rpc_sync(MAIN, operator.add, (2, 2)) == 4


def test_a_hand_made_pipe_gets_each_reply_naming_its_call(main: None) -> None:
    """The wire contract by hand: PIPE records in, CALL records out, each reply naming its
    call's message id; an unknown function is that call's error reply, not the pipe's end."""
    sock = _authenticated()
    try:
        calls_made = ((11, operator.add), (12, operator.mul), (13, "no.such:function"))
        sock.sendall(b"".join(_pipe_record(_call_frame(mid, fn)) for mid, fn in calls_made))
        replies = _read_replies(sock, 3)
    finally:
        sock.close()
    assert sorted(replies) == [11, 12, 13]
    assert not replies[11].header.reply.HasField("error")
    assert not replies[12].header.reply.HasField("error")
    assert replies[13].header.reply.HasField("error")


def _read_replies(sock: socket.socket, n: int) -> dict[int, Frame]:
    sock.settimeout(10)
    buf = bytearray()
    out: dict[int, Frame] = {}
    while len(out) < n:
        chunk = sock.recv(65536)
        assert chunk, "the lane closed the pipe"
        buf += chunk
        records, at = lane_pipe.take_records(buf, (CALL,), 1 << 24)
        del buf[:at]
        for _, raw in records:
            frame = decode_frame(raw)
            out[frame.header.reply.message_id] = frame
    return out


# -- PLAIN records --------------------------------------------------------------------------------


def _plain_record(
    message_id: int, fn: Any, args: tuple[Any, ...] = (3, 4), pickled: bytes | None = None
) -> bytes:
    """A PLAIN record of ``fn(*args)`` (or of the call body ``pickled``)."""
    body = pickle.dumps((None, args, {}), 4) if pickled is None else pickled
    name = fn if isinstance(fn, str) else calls.function_name(fn)[0]
    raw = lane_pipe.plain_call(message_id, 0.0, name, body)
    return RECORD.pack(PLAIN, len(raw)) + raw


def _read_any_replies(sock: socket.socket, n: int) -> dict[int, tuple[int, Any]]:
    """``n`` replies by message id: ``(PLAIN, value)`` or ``(CALL, reply frame)``."""
    sock.settimeout(10)
    buf = bytearray()
    out: dict[int, tuple[int, Any]] = {}
    while len(out) < n:
        chunk = sock.recv(65536)
        assert chunk, "the lane closed the pipe"
        buf += chunk
        records, at = lane_pipe.take_records(buf, (CALL, PLAIN), 1 << 24)
        del buf[:at]
        for kind, raw in records:
            if kind == PLAIN:
                (message_id,) = PLAIN_REPLY.unpack_from(raw)
                out[message_id] = (PLAIN, pickle.loads(raw[PLAIN_REPLY.size :]))
            else:
                frame = decode_frame(raw)
                out[frame.header.reply.message_id] = (CALL, frame)
    return out


def test_plain_records_get_plain_values_back_and_anything_else_a_reply_frame(main: None) -> None:
    """The PLAIN records by hand, mixed with PIPE records on one pipe: a plain value comes back
    as a PLAIN record naming its call; an unknown function, the function's exception, a value
    that is not plain data, and a body that is not (a global in its pickle) come back as CALL
    records with their reply frames, and the pipe goes on."""
    sock = _authenticated()
    try:
        sock.sendall(
            _plain_record(21, operator.add)
            + _plain_record(22, "no.such:function")
            + _plain_record(23, operator.truediv, (1, 0))
            + _pipe_record(_call_frame(24, operator.mul))
            + _plain_record(25, bodies.echo, (list(range(20)),))  # 20 items: not plain
            + _plain_record(26, bodies.echo, pickled=pickle.dumps((None, (1 + 2j,), {}), 4))
            + _plain_record(27, bodies.echo, ("plain",))
        )
        replies = _read_any_replies(sock, 7)
    finally:
        sock.close()
    assert replies[21] == (PLAIN, 7)
    assert replies[27] == (PLAIN, "plain")
    for mid in (22, 23, 24, 25, 26):
        kind, frame = replies[mid]
        assert kind == CALL, mid
        assert frame.header.reply.HasField("error") == (mid in (22, 23)), mid
    assert "ZeroDivisionError" in str(replies[23][1].header.reply.error)
    assert rpc.rpc_async(MAIN, operator.add, (1, 1)).wait() == 2


def test_a_plain_record_naming_a_refused_callable_runs_nothing(main: None, tmp_path: Any) -> None:
    """An attack on the PLAIN records: a hand-made one naming ``os:system`` (the policy refuses
    it) gets the policy's error as its reply frame, and the command never runs."""
    marker = tmp_path / "ran"
    sock = _authenticated()
    try:
        sock.sendall(_plain_record(51, "os:system", (f"touch {marker}",)))
        replies = _read_any_replies(sock, 1)
    finally:
        sock.close()
    kind, frame = replies[51]
    assert kind == CALL and frame.header.reply.HasField("error")
    assert "refused by the callable policy" in str(frame.header.reply.error)
    assert not marker.exists()
    assert rpc.rpc_async(MAIN, operator.add, (1, 1)).wait() == 2


def _count_plain_replies(monkeypatch: Any) -> list[int]:
    """Each PLAIN reply the worker writes from now on, by message id."""
    posted: list[int] = []
    post_plain = lane_pipe.ServedPipe.post_plain

    def counted(self: Any, message_id: int, data: bytes) -> None:
        posted.append(message_id)
        post_plain(self, message_id, data)

    monkeypatch.setattr(lane_pipe.ServedPipe, "post_plain", counted)
    return posted


def test_plain_rpc_async_calls_go_as_plain_records(main: None, monkeypatch: Any) -> None:
    _warm()
    posted = _count_plain_replies(monkeypatch)
    futs = [rpc.rpc_async(MAIN, operator.mul, (i, 2)) for i in range(50)]
    assert [f.wait() for f in futs] == [2 * i for i in range(50)]
    assert len(posted) == 50
    # Not plain (a 20-item list): a frame, and its value comes back whole.
    assert rpc.rpc_async(MAIN, bodies.echo, (list(range(20)),)).wait() == list(range(20))
    assert len(posted) == 50


def test_a_peer_that_takes_no_plain_records_gets_frames(main: None, monkeypatch: Any) -> None:
    _warm()
    me = agent_mod.current()
    monkeypatch.setitem(me.by_name, MAIN, dataclasses.replace(me.by_name[MAIN], lane_plain=False))
    posted = _count_plain_replies(monkeypatch)
    before = _served()
    assert [rpc.rpc_async(MAIN, operator.add, (i, 1)).wait() for i in range(20)] == list(
        range(1, 21)
    )
    assert _served() - before == 20, "the calls went on the lane pipe, as frames"
    assert posted == []


def test_a_hook_that_sees_every_call_sees_plain_records_too(main: None) -> None:
    """A worker where a hook watches every call serves a PLAIN record through the hooks (as
    the frame it stands for), so the hook sees it."""
    seen: list[int] = []

    class Seeing(hooks.CallHook):
        def on_recv_call(self, header: pb.CallHeader, tensors: Any, peer: int) -> None:
            seen.append(header.message_id)

    hook = Seeing()
    hooks.register(hook)
    sock = _authenticated()
    try:
        sock.sendall(_plain_record(41, operator.add, (40, 2)))
        replies = _read_any_replies(sock, 1)
    finally:
        sock.close()
        hooks.unregister(hook)
    kind, frame = replies[41]
    assert kind == CALL and not frame.header.reply.HasField("error")
    assert seen == [41]


# -- the framing, on socket pairs ---------------------------------------------------------------


def test_records_split_anywhere_are_taken_whole() -> None:
    records = [(PIPE, b""), (PLAIN, b"x" * 7), (PIPE, b"y" * 300)]
    data = b"".join(RECORD.pack(kind, len(f)) + f for kind, f in records)
    for cut in range(len(data) + 1):
        buf = bytearray(data[:cut])
        taken, at = lane_pipe.take_records(buf, (PIPE, PLAIN), 1000)
        del buf[:at]
        buf += data[cut:]
        rest, _ = lane_pipe.take_records(buf, (PIPE, PLAIN), 1000)
        assert taken + rest == records
    with pytest.raises(ValueError, match="a record"):
        lane_pipe.take_records(bytearray(RECORD.pack(CALL, 1) + b"z"), (PIPE, PLAIN), 1000)
    with pytest.raises(ValueError, match="a record"):
        lane_pipe.take_records(bytearray(RECORD.pack(PLAIN, 1) + b"z"), (PIPE,), 1000)
    with pytest.raises(ValueError, match="of 1001 bytes"):
        lane_pipe.take_records(bytearray(RECORD.pack(PIPE, 1001)), (PIPE,), 1000)


def _reply(message_id: int, value: int) -> bytes:
    frame = Frame(pb.FrameHeader(reply=pb.ReplyHeader(message_id=message_id), last=True), [])
    frame.header.payload.pickle_nbytes = value  # a marker the test reads back
    raw = encode_frame(frame)
    return RECORD.pack(CALL, len(raw)) + raw


def test_a_pipe_from_many_threads_writes_whole_records_and_takes_replies_cut_anywhere() -> None:
    """LanePipe against a hand-made callee on a socket pair: 8 threads x 100 calls go out as
    whole PIPE records; the replies come back shuffled and cut at random byte boundaries, and
    each call's ``done`` gets its own."""
    ours, theirs = socket.socketpair()
    ours.settimeout(10)
    dog = Watchdog()
    ended: list[Any] = []
    pipe = lane_pipe.LanePipe(ours, "them", dog, 1 << 20, ended.append)
    reader = lane_pipe.PipeReader("test-lane-pipes")
    got: dict[int, int] = {}
    lock = threading.Lock()
    all_done = threading.Event()
    n = 800

    def done(frame: Frame | None, error: grpc.RpcError | None) -> None:
        assert frame is not None and error is None
        with lock:
            got[frame.header.reply.message_id] = frame.header.payload.pickle_nbytes
            if len(got) == n:
                all_done.set()

    def submit(base: int) -> None:
        for i in range(base, base + 100):
            raw = struct.pack("<I", i)
            pipe.submit(i, raw, 10.0, done)

    try:
        assert reader.add(pipe)
        threads = [threading.Thread(target=submit, args=(k * 100,)) for k in range(8)]
        for t in threads:
            t.start()
        buf, calls = bytearray(), []
        theirs.settimeout(10)
        while len(calls) < n:
            buf += theirs.recv(65536)
            records, at = lane_pipe.take_records(buf, (PIPE,), 1 << 20)
            del buf[:at]
            calls += [struct.unpack("<I", r)[0] for _, r in records]
        for t in threads:
            t.join()
        assert sorted(calls) == list(range(n))
        random.shuffle(calls)
        out = b"".join(_reply(i, i * 2) for i in calls)
        while out:
            cut = random.randint(1, 200)
            theirs.sendall(out[:cut])
            out = out[cut:]
        assert all_done.wait(10)
        assert got == {i: 2 * i for i in range(n)}
        theirs.close()  # the callee goes: the pipe ends, once
        deadline = time.monotonic() + 5
        while not ended and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ended == [pipe] and not pipe.alive
    finally:
        reader.close()
        dog.close()
        theirs.close()


# -- callbacks on the caller's reader ----------------------------------------------------------


@contextlib.contextmanager
def _held_callback() -> Iterator[None]:
    """Inside: the reply of a call has a callback holding the reader (a wait gradwire cannot
    see; the callback was added before the reply came). At the end it is let go, and its
    chained future must get the call's value."""
    _warm()
    gate, seen = threading.Event(), []

    def hold(f: Any) -> str:
        seen.append(threading.current_thread().name)
        assert gate.wait(30), "the test never let the callback go"
        return f.wait()

    chained = rpc.rpc_async(MAIN, bodies.sleep_then, (0.2, "held")).then(hold)
    try:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen, "the callback never ran"
        yield
        assert not chained.done()
    finally:
        gate.set()
    assert chained.wait(10) == "held"


def test_reply_callbacks_run_on_the_lane_reader_after_its_replies(main: None) -> None:
    _warm()
    names = [
        rpc.rpc_async(MAIN, bodies.sleep_then, (0.1, i)).then(
            lambda f: (f.wait(), threading.current_thread().name)
        )
        for i in range(5)
    ]
    got = [f.wait() for f in names]
    assert [v for v, _ in got] == list(range(5))
    assert all(n.startswith("gradwire-lane-pipes-") for _, n in got), got


def test_a_callback_that_holds_the_reader_holds_up_no_other_reply(main: None) -> None:
    """The watch sees the reader held in a callback and hands the reading to a new thread."""
    with _held_callback():
        others = [rpc.rpc_async(MAIN, operator.add, (i, 1)) for i in range(20)]
        assert [f.wait(10) for f in others] == list(range(1, 21))


def test_a_callback_that_waits_on_a_call_hands_the_reading_over(
    main: None, monkeypatch: Any
) -> None:
    """Without the watch, the blocking wait itself hands over: the inner call's reply, read
    by the new reader, does not deadlock the callback that waits for it."""
    monkeypatch.setattr(lane_lead.Watch, "_start", lambda self: None)
    _warm()
    outer = rpc.rpc_async(MAIN, bodies.sleep_then, (0.2, 4))
    chained = outer.then(lambda f: rpc.rpc_async(MAIN, operator.mul, (f.wait(), 10)).wait(10))
    assert chained.wait(20) == 40
    assert rpc.rpc_async(MAIN, operator.add, (1, 1)).wait(10) == 2


def test_a_reply_read_late_behind_a_callback_still_meets_its_deadline(
    main: None, monkeypatch: Any
) -> None:
    """Without the watch, a call that reaches its deadline while its reply waits unread
    behind a held callback hands the reading over and gets its reply, not a timeout."""
    monkeypatch.setattr(lane_lead.Watch, "_start", lambda self: None)
    with _held_callback():
        assert rpc.rpc_async(MAIN, operator.add, (1, 2), timeout=0.5).wait(10) == 3


# -- calls served on the callee's reader ------------------------------------------------------


def _quick_pipes() -> None:
    """Forget the slow calls of earlier tests: the pipes serve inline again."""
    for served in list(_lane()._pipes_served.values()):
        served._pool_until, served._slow = 0.0, 0


def test_quick_calls_are_served_on_the_pipes_reader(main: None) -> None:
    _warm()
    _quick_pipes()
    names = [rpc.rpc_async(MAIN, bodies.thread_name).wait(10) for _ in range(20)]
    assert any(n.startswith("gradwire-bulk-reader") for n in names), names
    futs = [rpc.rpc_async(MAIN, operator.mul, (i, 7)) for i in range(200)]
    assert [f.wait(10) for f in futs] == [i * 7 for i in range(200)]


def test_calls_that_are_slow_one_after_the_other_go_to_the_pool(main: None) -> None:
    """Naps of 10 ms, each too short for the watch: served inline they would run one at a
    time; after two slow ones the pipe gives its calls to the pool, which runs them side by
    side."""
    _warm()
    _quick_pipes()
    bodies.naps_peak(reset=True)
    futs = [rpc.rpc_async(MAIN, bodies.nap, (0.01,)) for _ in range(40)]
    assert sum(f.wait(20) for f in futs) == 40
    assert bodies.naps_peak() >= 2


def test_a_call_held_on_a_wait_gradwire_cannot_see_holds_up_no_other_call(main: None) -> None:
    """The first call waits on a plain Event that only the second call, on the same pipe,
    sets: served inline, the watch hands the reading over, and the second call opens it."""
    _warm()
    _quick_pipes()
    held = rpc.rpc_async(MAIN, bodies.wait_gate, ("inline-held", 20.0))
    time.sleep(0.05)
    assert rpc.rpc_async(MAIN, bodies.open_gate, ("inline-held",)).wait(10) == "open"
    assert held.wait(30) == "opened"


def test_a_call_that_waits_on_a_call_on_its_own_pipe_hands_the_reading_over(
    main: None, monkeypatch: Any
) -> None:
    """Without the watch, the blocking wait itself hands over: the inner call, which comes on
    the pipe the outer one is served from, is read and served by the new leader."""
    monkeypatch.setattr(lane_lead.Watch, "_start", lambda self: None)
    _warm()
    _quick_pipes()
    assert rpc.rpc_async(MAIN, bodies.wait_on_call, (4,)).wait(20) == 40
    assert rpc.rpc_async(MAIN, operator.add, (1, 1)).wait(10) == 2
