"""The bulk lane between real workers over TCP (shared memory off, as in containers): which
tensors take it, that they arrive equal and by value in calls, replies, remote() values and
gradients, that a sender without it or a lane it cannot reach streams instead, and what the
listener does with hostile connections (plain sockets against this process' own lane).

One cluster for the module: this process is "main" (rank 0) and spawns "peer" (rank 1, a bulk
lane too) and "nobulk" (rank 2, ``bulk_transfer=False``). The TLS test runs its own cluster.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing as mp
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
import grpc
import numpy as np
import pytest
from gradwire._runtime import agent as agent_mod
from gradwire._runtime.calls import caller as caller_mod
from gradwire._runtime.calls.streams import StreamFailed
from gradwire._runtime.transport import bulk_lane, lane_io
from gradwire._runtime.transport import lane_calls as bulk_lane_calls
from gradwire._wire import bulk
from gradwire.distributed import rpc
from gradwire.distributed.rpc._testing import free_port, run_cluster
from gradwire.errors import SerializationError

from .dynamic_group import threads_named, until
from .listeners import full_listener, silent_listener
from .test_rpc_tls import pki  # noqa: F401 - the TLS test's certificates

MAIN, PEER, NOBULK = "main", "peer", "nobulk"
TOKEN = "bulk-lane-token"
MiB = 1 << 20
THRESHOLD = rpc.GrpcRpcBackendOptions().bulk_threshold_bytes


def _fields(init_method: str, **overrides: Any) -> dict[str, Any]:
    """Options of a worker of these tests: TCP between workers, no shared memory."""
    return {
        "init_method": init_method,
        "token": TOKEN,
        "rpc_timeout": 20.0,
        "init_timeout": 30.0,
        "use_unix_socket": False,
        "shm_transfer": False,
        **overrides,
    }


def _member(name: str, rank: int, fields: dict[str, Any], stop: Any) -> None:
    """A spawned worker: serves until the test sets ``stop``."""
    rpc.init_rpc(name, rank, 3, rpc.GrpcRpcBackendOptions(**fields))
    stop.wait(300)
    rpc.shutdown(timeout=30)


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    init_method = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [
        ctx.Process(target=_member, args=(name, rank, _fields(init_method, **extra), stop))
        for rank, name, extra in [(1, PEER, {}), (2, NOBULK, {"bulk_transfer": False})]
    ]
    for p in procs:
        p.daemon = True
        p.start()
    try:
        rpc.init_rpc(MAIN, 0, 3, rpc.GrpcRpcBackendOptions(**_fields(init_method)))
        try:
            yield
        finally:
            stop.set()
            rpc.shutdown(timeout=30)
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)
    assert [p.exitcode for p in procs] == [0, 0]


pytestmark = pytest.mark.usefixtures("cluster")


# -- functions the workers call on each other --------------------------------------------------

_kept: dict[str, Any] = {}


def echo(x: Any) -> Any:
    return x


def counters() -> dict[str, int]:
    return bulk.stats()


def lane_info() -> dict[str, Any] | None:
    """This worker's ``bulk_lane`` debug entry, None without a lane."""
    return rpc.get_debug_info().get("bulk_lane")


def call_back(dst: str, x: Any) -> Any:
    """Echo ``x`` through worker ``dst`` (its lane takes it, if it has one)."""
    return rpc.rpc_sync(dst, echo, (x,))


def keep(key: str, x: Any) -> None:
    _kept[key] = x


class LaneCallError(ValueError):
    """Raised by ``fail_with`` on the callee: its type must survive the lane."""


def fail_with(message: str) -> None:
    raise LaneCallError(message)


def sleep_then(seconds: float, value: Any) -> Any:
    time.sleep(seconds)
    return value


def kept_equals(key: str, value: float) -> bool:
    return bool(np.all(np.asarray(_kept[key]) == value))


def owner_rrefs() -> int:
    return int(agent_mod.current().debug_info()["num_owner_rrefs"])


def make_source(n: int, value: float) -> np.ndarray:
    """Keep and return an array (the reply direction)."""
    _kept["source"] = np.full(n, value)
    return _kept["source"]


def write_kept(key: str, value: float) -> None:
    _kept[key][...] = value


_held_links: list[Any] = []
_gates: dict[int, threading.Barrier] = {}
_gates_lock = threading.Lock()


def hold_connections(dst: str) -> int:
    """Take every connection of this worker's lane to ``dst`` out of its pool (all busy)."""
    me = agent_mod.current()
    lane = me.bulk_lane
    assert lane is not None
    address = me.by_name[dst].bulk_address
    _held_links.extend(lane._take(dst, address) for _ in range(bulk_lane.CONNECTIONS_PER_PEER))
    return sum(conn is not None for conn in _held_links)


def release_connections(dst: str) -> None:
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    while _held_links:
        conn = _held_links.pop()
        if conn is not None:
            lane._give_back(dst, conn)


def all_at_once(parties: int, n: int, value: float) -> np.ndarray:
    """Wait for ``parties`` calls of this function, then all return ``n`` float64s at once."""
    with _gates_lock:
        gate = _gates.setdefault(parties, threading.Barrier(parties))
    gate.wait(10)
    return np.full(n, value)


def array_and_lock(n: int) -> list[Any]:
    """A reply that fails to encode after its array went over the lane."""
    return [np.ones(n), threading.Lock()]


def float32_ones(n: int) -> gw.Tensor:
    return gw.ones(n)


def matmul(x: gw.Tensor, w: gw.Tensor) -> gw.Tensor:
    return x @ w


def autograd_step(dst: str, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark's dist-autograd iteration with ``dst`` computing ``x @ w``: the gradients
    of ``mean((x @ w) ** 2)`` with respect to ``x`` and ``w``."""
    xt, wt = gw.tensor(x, requires_grad=True), gw.tensor(w, requires_grad=True)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync(dst, matmul, (xt, wt))
        dist_autograd.backward(cid, [(y * y).mean()])
        grads = dist_autograd.get_gradients(cid)
    return grads[xt].detach().numpy(), grads[wt].detach().numpy()


# -- helpers -----------------------------------------------------------------------------------


def _counts(worker: str = MAIN) -> dict[str, int]:
    return counters() if worker == MAIN else rpc.rpc_sync(worker, counters)


def _grew(before: dict[str, int], after: dict[str, int], *names: str) -> list[int]:
    return [after.get(n, 0) - before.get(n, 0) for n in names]


def _inbox(worker: str = MAIN) -> dict[str, int]:
    info = lane_info() if worker == MAIN else rpc.rpc_sync(worker, lane_info)
    assert info is not None
    return info["inbox"]


def _assert_same(got: Any, want: Any) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), type(got)
        g, w = got, want
    else:
        assert isinstance(got, gw.Tensor), type(got)
        g, w = got.detach().numpy(), want.detach().numpy()
    assert (g.dtype, g.shape) == (w.dtype, w.shape)
    np.testing.assert_array_equal(g, w)


def _serves_large_tensors() -> None:
    """MAIN's lane still takes transfers: "peer" echoes a large array through MAIN."""
    before = _counts()
    x = np.arange(MiB // 8, dtype=np.float64)
    _assert_same(rpc.rpc_sync(PEER, call_back, (MAIN, x)), x)
    # Taken here: the array as the argument of MAIN's echo, then as call_back's reply.
    assert _grew(before, _counts(), "taken") == [2]


def _readers() -> int:
    return threads_named("gradwire-bulk-reader")


def test_a_quiet_connection_rests_without_a_thread_and_wakes_for_the_next_record(
    cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk_lane, "LINGER_SECONDS", 0.2)
    _serves_large_tensors()  # "peer" sends on its connections to this lane
    assert until(lambda: _readers() == 0, 10.0), "a quiet connection kept its reader thread"
    info = lane_info()
    assert info is not None and info["connections_resting"] >= 1
    inbound = info["connections_in"]
    _serves_large_tensors()  # a resting connection wakes for the next transfer
    info = lane_info()
    assert info is not None and info["connections_in"] == inbound  # the same connections
    # and rests again once quiet.
    assert until(lambda: _readers() == 0, 10.0)
    rested = lane_info()
    assert rested is not None and rested["connections_resting"] >= 1


# -- what takes the lane, and what arrives ------------------------------------------------------


def _view() -> gw.Tensor:
    # Every other column: half of its storage, so a contiguous copy travels (1 MiB).
    return gw.tensor(np.arange(512 * 512, dtype=np.float64).reshape(512, 512))[:, ::2]


ECHOES: list[tuple[str, Callable[[], Any], bool]] = [
    ("float32_small", lambda: gw.arange(1000, dtype=gw.float32), False),
    ("float64_just_below", lambda: gw.arange(THRESHOLD // 8 - 1, dtype=gw.float64), False),
    ("float64_at_threshold", lambda: gw.arange(THRESHOLD // 8, dtype=gw.float64), True),
    ("float32_2d", lambda: gw.tensor(np.random.rand(512, 1024).astype(np.float32)), True),
    ("int64", lambda: gw.tensor(np.arange(-(1 << 15), 1 << 15, dtype=np.int64)), True),
    ("int64_small", lambda: gw.tensor(np.arange(100, dtype=np.int64)), False),
    (
        "complex64",
        lambda: gw.tensor((np.arange(1 << 16) + 1j * np.arange(1 << 16)).astype(np.complex64)),
        True,
    ),
    ("bool", lambda: gw.tensor(np.arange(1 << 18) % 3 == 0), True),
    ("bool_small", lambda: gw.tensor(np.array([True, False, True])), False),
    ("zero_dim", lambda: gw.tensor(3.25), False),
    ("empty", lambda: gw.zeros((0, 4)), False),
    ("strided_view", _view, True),
    ("ndarray", lambda: np.linspace(0, 1, MiB // 4, dtype=np.float32).reshape(256, -1), True),
    ("ndarray_small", lambda: np.arange(12, dtype=np.int16).reshape(3, 4), False),
]


@pytest.mark.parametrize(("make", "over_lane"), [e[1:] for e in ECHOES], ids=[e[0] for e in ECHOES])
def test_echo_arrives_equal_and_takes_the_lane_from_the_threshold_on(
    make: Callable[[], Any], over_lane: bool
) -> None:
    value = make()
    mine, theirs = _counts(), _counts(PEER)
    _assert_same(rpc.rpc_sync(PEER, echo, (value,)), value)
    expected = [1, 1] if over_lane else [0, 0]
    # Here: the argument sent, the reply taken; on the peer, the other way round.
    assert _grew(mine, _counts(), "sent", "taken") == expected
    assert _grew(theirs, _counts(PEER), "taken", "sent") == expected
    assert _grew(mine, _counts(), "fallback") == [0]


def test_a_large_tensor_keeps_requires_grad_and_arrives_writable() -> None:
    t = gw.tensor(np.random.rand(256, 256), requires_grad=True)
    before = _counts()
    out = rpc.rpc_sync(PEER, echo, (t,))
    assert _grew(before, _counts(), "sent", "taken") == [1, 1]
    assert out.requires_grad
    data = out.detach().numpy()
    assert data.flags.writeable
    np.testing.assert_array_equal(data, t.detach().numpy())


def test_many_large_calls_in_flight_at_once_all_come_back_right() -> None:
    threads, per_thread = 6, 2  # 12 sends at once: more than the 4 connections to the peer
    n = THRESHOLD * 2 // 8  # 256 KiB: what streams instead stays under one gRPC message
    start = threading.Barrier(threads)
    results: dict[int, np.ndarray] = {}
    before = _counts()
    held, held_there = _inbox()["held_bytes"], _inbox(PEER)["held_bytes"]

    def send(t: int) -> None:
        start.wait(10)
        values = [t * per_thread + k for k in range(per_thread)]
        futs = [rpc.rpc_async(PEER, echo, (np.full(n, float(v)),)) for v in values]
        for v, fut in zip(values, futs, strict=True):
            results[v] = fut.wait()

    workers = [threading.Thread(target=send, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert sorted(results) == list(range(threads * per_thread))
    for v, got in results.items():
        assert got.shape == (n,) and np.all(got == v), v
    sent, fallback = _grew(before, _counts(), "sent", "fallback")
    assert sent + fallback == threads * per_thread  # each over the lane, or in the frames
    assert sent > 0
    info = lane_info()
    assert info is not None
    assert info["connections_out"][PEER]["open"] <= bulk_lane.CONNECTIONS_PER_PEER
    assert (_inbox()["held_bytes"], _inbox(PEER)["held_bytes"]) == (held, held_there)


def test_a_tensor_finding_every_connection_busy_streams() -> None:
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    address = agent_mod.current().by_name[PEER].bulk_address
    # Every connection for transfers, and for calls (rpc_sync's arguments go on its own), but
    # the one this worker's lane pipe to the peer holds, if it has one.
    piped = 1 if PEER in lane._pipes else 0
    busy = [
        (calls, lane._take(PEER, address, calls))
        for calls, n in (
            (False, bulk_lane.CONNECTIONS_PER_PEER),
            (True, bulk_lane.CALL_CONNECTIONS_PER_PEER - piped),
        )
        for _ in range(n)
    ]
    try:
        assert all(conn is not None for _, conn in busy)
        before = _counts()
        x = np.random.rand(MiB // 8)
        _assert_same(rpc.rpc_sync(PEER, echo, (x,)), x)
        assert _grew(before, _counts(), "sent", "fallback", "taken") == [0, 1, 1]
    finally:
        for calls, conn in busy:
            if conn is not None:
                lane._give_back(PEER, conn, calls)
    before = _counts()
    _assert_same(rpc.rpc_sync(PEER, echo, (x,)), x)
    assert _grew(before, _counts(), "sent", "fallback") == [1, 0]


def test_large_replies_finding_every_connection_busy_all_stream_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The peer's replies stream in their frames when its connections to this worker are all
    busy; ready at the same moment on one call pipe, each must still arrive (every call on
    the pipe: none on a lane call connection, whose reply's tensors would go on it)."""
    monkeypatch.setattr(caller_mod, "ASYNC_ON_LANE", False)
    parties, n = 6, 3 * MiB // 8  # each reply fits one frame (single_frame_bytes, 4 MiB)
    assert rpc.rpc_sync(PEER, hold_connections, (MAIN,)) == bulk_lane.CONNECTIONS_PER_PEER
    try:
        theirs = _counts(PEER)
        futs = [rpc.rpc_async(PEER, all_at_once, (parties, n, float(i))) for i in range(parties)]
        for i, fut in enumerate(futs):
            got = fut.wait()
            assert got.shape == (n,) and np.all(got == i), i
        assert _grew(theirs, _counts(PEER), "sent", "fallback") == [0, parties]
    finally:
        rpc.rpc_sync(PEER, release_connections, (MAIN,))


def test_a_message_that_fails_to_encode_leaves_no_bytes_held_by_the_receiver() -> None:
    """A large tensor goes over the lane while its message is encoded; when the encoding fails
    after it, that message never comes, and the receiver must not keep its bytes for
    ``STALE_SECONDS`` (shared memory gives its segments back: calls.caller._encode)."""
    held, held_there = _inbox()["held_bytes"], _inbox(PEER)["held_bytes"]
    with pytest.raises(SerializationError, match="cannot pickle"):  # the call
        rpc.rpc_sync(PEER, echo, ([np.ones(MiB // 8), threading.Lock()],))
    with pytest.raises(SerializationError, match="cannot pickle"):  # the reply
        rpc.rpc_sync(PEER, array_and_lock, (MiB // 8,))
    assert until(lambda: _inbox(PEER)["held_bytes"] == held_there, 3), _inbox(PEER)
    assert until(lambda: _inbox()["held_bytes"] == held, 3), _inbox()


def test_remote_value_and_to_here_over_the_lane() -> None:
    before = _counts()
    made = rpc.remote(PEER, float32_ones, (MiB // 4,)).to_here()
    _assert_same(made, gw.ones(MiB // 4))
    assert _grew(before, _counts(), "taken") == [1]
    x = gw.tensor(np.random.rand(512, 512))
    before = _counts()
    _assert_same(rpc.remote(PEER, echo, (x,)).to_here(), x)
    assert _grew(before, _counts(), "sent", "taken") == [1, 1]


def test_dist_autograd_gradients_over_the_lane_equal_those_without_it() -> None:
    rng = np.random.default_rng(19)
    x, w = rng.standard_normal((512, 512)), rng.standard_normal((512, 512))
    before = _counts()
    gx, gw_ = autograd_step(PEER, x, w)
    sent, taken = _grew(before, _counts(), "sent", "taken")
    # x, w and the gradient of y went over the lane; y and the gradients of x and w came back.
    assert (sent, taken) == (3, 3)

    peer_before = _counts(PEER)
    gx_off, gw_off = rpc.rpc_sync(NOBULK, autograd_step, (PEER, x, w))
    assert _grew(peer_before, _counts(PEER), "sent", "taken") == [0, 0]
    assert _counts(NOBULK) == {}  # nothing went over a lane from there

    np.testing.assert_allclose(gx, gx_off, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(gw_, gw_off, rtol=1e-12, atol=1e-15)
    dy = 2 * (x @ w) / x.size  # the float64 oracle
    np.testing.assert_allclose(gx, dy @ w.T, rtol=1e-10)
    np.testing.assert_allclose(gw_, x.T @ dy, rtol=1e-10)


def test_by_value_both_ways() -> None:
    before = _counts()
    x = np.full(MiB // 8, 1.0)
    fut = rpc.rpc_async(PEER, keep, ("arg", x))
    x[:] = -5.0  # after rpc_async returned: not what was sent
    fut.wait()
    assert rpc.rpc_sync(PEER, kept_equals, ("arg", 1.0))
    t = gw.tensor(np.full(MiB // 8, 2.0))
    fut = rpc.rpc_async(PEER, keep, ("tensor", t))
    t.numpy()[:] = -6.0
    fut.wait()
    assert rpc.rpc_sync(PEER, kept_equals, ("tensor", 2.0))

    y = rpc.rpc_sync(PEER, make_source, (MiB // 8, 3.0))
    rpc.rpc_sync(PEER, write_kept, ("source", 9.0))
    assert np.all(y == 3.0)  # the callee's later write did not reach the caller's copy
    y[:] = 11.0
    assert rpc.rpc_sync(PEER, kept_equals, ("source", 9.0))
    assert _grew(before, _counts(), "sent", "taken") == [2, 1]


def test_a_sender_with_bulk_transfer_off_streams() -> None:
    assert rpc.rpc_sync(NOBULK, lane_info) is None  # no lane, no listener
    assert agent_mod.current().by_name[NOBULK].bulk_address == ""
    x = np.random.rand(MiB // 8)
    mine, theirs = _counts(), _counts(PEER)
    _assert_same(rpc.rpc_sync(NOBULK, call_back, (PEER, x)), x)
    assert _counts(NOBULK) == {}
    assert _grew(theirs, _counts(PEER), "sent", "received", "taken") == [0, 0, 0]
    # To a worker without a lane this one streams too.
    assert _grew(mine, _counts(), "sent", "fallback") == [0, 0]


def test_a_lane_that_cannot_be_reached_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    me = agent_mod.current()
    with socket.socket() as closed:  # bound, not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        unreachable = f"127.0.0.1:{closed.getsockname()[1]}"
        record = me.by_name[NOBULK]
        monkeypatch.setitem(
            me.by_name, NOBULK, dataclasses.replace(record, bulk_address=unreachable)
        )
        x = np.random.rand(MiB // 8)
        for _ in range(2):  # the second does not try again (streams for UNREACHABLE_SECONDS)
            before = _counts()
            _assert_same(rpc.rpc_sync(NOBULK, echo, (x,)), x)
            assert _grew(before, _counts(), "sent", "fallback") == [0, 1]
    info = lane_info()
    assert info is not None
    assert info["connections_out"][NOBULK] == {"open": 0, "idle": 0, "call_connections": 0}


def test_a_fast_lane_port_that_cannot_be_reached_sends_to_the_main_port(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not the bulk lane, the other second port: a peer's fast lane over TCP (a firewall
    that lets only the main port through) is probed once; calls then go to the main port."""
    me = agent_mod.current()
    with socket.socket() as closed:  # bound, not listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        unreachable = f"127.0.0.1:{closed.getsockname()[1]}"
        record = me.by_name[NOBULK]
        assert record.call_dial != record.dial  # it has a fast lane over TCP
        monkeypatch.setitem(me.by_name, NOBULK, dataclasses.replace(record, call_dial=unreachable))
        with caplog.at_level("WARNING"):
            for i in range(3):
                assert rpc.rpc_sync(NOBULK, echo, (i,)) == i
    assert sum("cannot reach the fast lane" in r.getMessage() for r in caplog.records) == 1
    transport = me.transport
    assert transport._get(unreachable) is transport._get(record.dial)  # noqa: SLF001
    transport.drop(record.dial)  # a lost peer's channels go: the alias with them, closed once
    assert unreachable not in transport._stubs and record.dial not in transport._stubs  # noqa: SLF001
    assert rpc.rpc_sync(NOBULK, echo, (7,)) == 7  # probed again, the main port again


# -- hostile connections to this process' lane ------------------------------------------------


def _connect() -> tuple[socket.socket, bytes]:
    """A plain TCP connection to MAIN's bulk lane, and the nonce its listener sent."""
    host, _, port = agent_mod.current().by_name[MAIN].bulk_address.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
    hello = b""
    while len(hello) < len(bulk_lane.MAGIC) + 32:
        chunk = sock.recv(64)
        assert chunk, "the listener closed before its hello"
        hello += chunk
    assert hello.startswith(bulk_lane.MAGIC) and len(hello) == len(bulk_lane.MAGIC) + 32
    return sock, hello[len(bulk_lane.MAGIC) :]


#: The name the hand-made connections give in their handshake.
SENDER_NAME = "mallory"


def _proof(nonce: bytes, name: bytes = b"mallory", token: str | None = TOKEN) -> bytes:
    return struct.pack("<H", len(name)) + name + bulk_lane.mac(token, nonce, name)


def _authenticated() -> socket.socket:
    """A connection that passed the handshake with the cluster token."""
    assert agent_mod.current().token == TOKEN
    sock, nonce = _connect()
    sock.sendall(_proof(nonce))
    assert sock.recv(1) == b"\x01"
    return sock


def _until_closed(sock: socket.socket, seconds: float) -> bytes | None:
    """What the listener sent until it closed the connection, or None if it was still open
    after ``seconds``."""
    got = b""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            chunk = sock.recv(4096)
            if not chunk:
                return got
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:  # closed with what this side sent still unread
        return got
    return None


def test_a_wrong_token_proof_is_closed_without_the_status_byte() -> None:
    for token in ("not-the-token", None):
        sock, nonce = _connect()
        with sock:
            sock.sendall(_proof(nonce, name=PEER.encode(), token=token))
            assert _until_closed(sock, 5) == b""
    # A proof made for another nonce does not pass either (no replay).
    sock, nonce = _connect()
    with sock:
        sock.sendall(_proof(bytes(32)))
        assert _until_closed(sock, 5) == b""
    _serves_large_tensors()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00",  # a name of 0 bytes
        struct.pack("<H", 128) + b"n" * 160,  # a name of 128 bytes
        b"\xff\xff" + bytes(64),
        b"GET / HTTP/1.1\r\nHost: worker\r\n\r\n",
        struct.pack("<H", 4) + b"main" + bytes(32),  # a well-formed, wrong proof
    ],
    ids=["name_0", "name_128", "name_65535", "http", "zero_proof"],
)
def test_garbage_is_closed_without_the_status_byte(garbage: bytes) -> None:
    held = _inbox()["held_bytes"]
    sock, _ = _connect()
    with sock:
        sock.sendall(garbage)
        assert _until_closed(sock, 5) == b""
    assert _inbox()["held_bytes"] == held


def test_a_silent_connection_is_closed_after_the_handshake_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bulk_lane, "HANDSHAKE_SECONDS", 0.5)
    started = time.monotonic()
    sock, _ = _connect()
    with sock:
        assert _until_closed(sock, 3.5) == b""
    assert time.monotonic() - started >= 0.45


def test_a_handshake_sent_a_byte_at_a_time_is_closed_after_the_handshake_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The handshake's time is for the whole handshake: a client that sends a byte before
    each read times out cannot hold a connection (and one of MAX_HANDSHAKES) for longer."""
    monkeypatch.setattr(bulk_lane, "HANDSHAKE_SECONDS", 1.0)
    started = time.monotonic()
    sock, _ = _connect()
    closed_after = None
    with sock:
        trickle = struct.pack("<H", 100) + b"x" * 100
        for byte in trickle:
            if time.monotonic() - started > 4.0:
                break
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            readable, _, _ = select.select([sock], [], [], 0.4)  # the pace: 2.5 bytes/s
            if readable and _until_closed(sock, 0.1) is not None:
                closed_after = time.monotonic() - started
                break
    assert closed_after is not None, "still open after 4 s of a 1 s handshake"
    assert closed_after < 1.0 + 1.5


def test_a_transfer_over_the_limit_is_refused_before_anything_is_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    large: list[int] = []
    real_empty = np.empty

    def watched_empty(shape: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        if isinstance(shape, int) and shape >= 1 << 30:
            large.append(shape)
        return real_empty(shape, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(bulk.np, "empty", watched_empty)
    limit = min(agent_mod.current().options.max_message_bytes, bulk.MAX_TRANSFER_BYTES)
    held = _inbox()["held_bytes"]
    for transfer_id, nbytes in [(1, limit + 1), (2, (1 << 64) - 2)]:
        refused = _counts().get("refused", 0)
        with _authenticated() as sock:
            sock.sendall(struct.pack("<QQ", transfer_id, nbytes))
            assert _until_closed(sock, 5) == b""
        assert _counts().get("refused", 0) == refused + 1  # counted before the close
        assert _inbox()["held_bytes"] == held
    assert large == []
    _serves_large_tensors()


def test_a_transfer_over_the_inbox_limit_is_dropped_and_the_next_one_on_its_connection_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inbox = agent_mod.current().bulk_lane.inbox
    monkeypatch.setattr(inbox, "_limit", 64 * 1024)
    refused = _counts().get("refused", 0)
    with _authenticated() as sock:
        sock.sendall(struct.pack("<QQ", 41, 100_000) + bytes(100_000))  # over: read, dropped
        sock.sendall(struct.pack("<QQ", 42, 1000) + b"z" * 1000)  # the next one: taken
        with pytest.raises(SerializationError, match="limit"):
            inbox.take(SENDER_NAME, 41, 100_000)
        assert bytes(inbox.take(SENDER_NAME, 42, 1000)) == b"z" * 1000
        assert _until_closed(sock, 0.2) is None  # still open
    assert _counts().get("refused", 0) == refused + 1
    assert _inbox()["held_bytes"] == 0


def test_a_cancel_on_the_wire_drops_a_transfer_sent_before_it() -> None:
    inbox = agent_mod.current().bulk_lane.inbox
    before = _inbox()
    with _authenticated() as sock:
        sock.sendall(struct.pack("<QQ", 51, 2000) + bytes(2000))
        sock.sendall(struct.pack("<QQ", 51, (1 << 64) - 1))  # cancel 51
        sock.sendall(struct.pack("<QQ", 52, 10) + b"k" * 10)
        assert bytes(inbox.take(SENDER_NAME, 52, 10)) == b"k" * 10
    assert until(lambda: _inbox() == before, 5)  # 51 is gone, its bytes given back


def test_a_transfer_cut_mid_body_gives_its_bytes_back() -> None:
    failed = _counts().get("failed", 0)
    held = _inbox()["held_bytes"]
    with _authenticated() as sock:
        sock.sendall(struct.pack("<QQ", 7, MiB) + bytes(100_000))
        assert until(lambda: _inbox()["held_bytes"] == held + MiB, 5)
    assert until(lambda: _inbox()["held_bytes"] == held, 5)
    assert _counts().get("failed", 0) == failed + 1
    _serves_large_tensors()


# -- calls on the lane --------------------------------------------------------------------------


def _lane_calls(worker: str = MAIN) -> list[int]:
    """[calls answered on the lane, calls served there] so far, by ``worker``."""
    c = _counts(worker)
    return [c.get("calls", 0), c.get("calls_served", 0)]


def _no_parked() -> None:
    """Wait until the RRefs dropped so far were released and no answer waits parked here
    (the sweeper hands them over within milliseconds)."""
    gc.collect()
    assert agent_mod.current().rref.flush_releases(10)
    assert until(lambda: (lane_info() or {}).get("parked") == 0, 10)

    # and the answers handed over were read (by reader threads, counted when read)
    def settled() -> bool:
        now = counters().get("calls", 0)
        time.sleep(0.05)
        return counters().get("calls", 0) == now

    assert until(settled, 10)


def test_rpc_sync_goes_on_the_lane_its_tensor_before_its_frame_on_one_connection() -> None:
    _no_parked()  # (else a call may read a parked delete's answer too: one more call)
    x = np.random.rand(MiB // 8)
    mine, theirs = _counts(), _counts(PEER)
    _assert_same(rpc.rpc_sync(PEER, echo, (x,)), x)
    after_mine, after_theirs = _counts(), _counts(PEER)
    # _counts(PEER) is a lane call too: the first one counts here, and there (a call is
    # counted as served once answered), with the echo.
    assert _grew(mine, after_mine, "calls", "sent", "taken", "fallback") == [2, 1, 1, 0]
    assert _grew(theirs, after_theirs, "calls_served", "sent", "taken") == [2, 1, 1]
    # A noop takes it too.
    before = _counts()
    assert rpc.rpc_sync(PEER, echo, (None,)) is None
    assert _grew(before, _counts(), "calls") == [1]
    info = lane_info()
    assert info is not None
    link = info["connections_out"][PEER]
    assert 1 <= link["call_connections"] <= bulk_lane.CALL_CONNECTIONS_PER_PEER


def test_remote_to_here_the_delete_and_gradients_go_on_the_lane() -> None:
    _no_parked()
    before = _counts()
    rref = rpc.remote(PEER, make_source, (MiB // 8, 4.0))
    assert np.all(rref.to_here() == 4.0)
    # The RemoteCall (its answer read by to_here(), right behind it) and the fetch.
    assert _grew(before, _counts(), "calls") == [2]
    before = _counts()
    del rref  # its RRefDelete goes on the lane too (in the background; its answer parked
    # until the sweeper hands it to a reader)
    assert until(lambda: _grew(before, _counts(), "calls") == [1], 10)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((64, 64)), rng.standard_normal((64, 64))
    mine = _counts()
    autograd_step(PEER, x, w)
    # The forward rpc_sync, and the last gradients message (sent by the engine's thread).
    assert _grew(mine, _counts(), "calls")[0] >= 2


def test_to_here_right_after_remote_goes_behind_it_and_reads_both_answers() -> None:
    _no_parked()
    mine, theirs = _counts(), _counts(PEER)
    rref = rpc.remote(PEER, make_source, (MiB // 8, 2.0))
    assert np.all(rref.to_here() == 2.0)
    # This thread read the RemoteCall's parked answer, then the fetch's, on one connection:
    # both counted before to_here() returned, no reader thread involved.
    grew = _grew(mine, _counts(), "parked", "behind", "calls", "handed_over")
    assert grew == [1, 1, 3, 0]  # calls: the RemoteCall, the fetch, and _counts() itself
    assert rref.confirmed_by_owner()
    # The owner served both (and the first _counts(), counted once it was served).
    assert _grew(theirs, _counts(PEER), "calls_served")[0] == 3
    del rref


def test_a_parked_answer_nobody_claims_is_read_by_a_reader_thread() -> None:
    _no_parked()
    before = _counts()
    rref = rpc.remote(PEER, sleep_then, (0.0, "kept"))
    assert until(rref.confirmed_by_owner, 10)  # nobody fetched: the sweeper handed it over
    assert _grew(before, _counts(), "parked", "handed_over", "behind") == [1, 1, 0]
    assert rref.to_here() == "kept"  # a fetch of its own
    assert _grew(before, _counts(), "behind") == [0]


def test_to_here_timing_out_behind_a_slow_remote_fails_and_the_remote_still_completes() -> None:
    _no_parked()
    before = _counts()
    rref = rpc.remote(PEER, sleep_then, (1.5, "late"), timeout=0)
    started = time.monotonic()
    with pytest.raises(gw.errors.RpcTimeoutError):
        rref.to_here(timeout=0.3)
    assert time.monotonic() - started < 1.2
    # Its connection went with the RemoteCall's answer; the RemoteCall is asked again by
    # gRPC, and the owner answers it once the function returns.
    assert rref.to_here(timeout=10) == "late"
    assert until(rref.confirmed_by_owner, 10)
    assert _grew(before, _counts(), "behind") == [1]
    assert rpc.rpc_sync(PEER, echo, ("still serving",)) == "still serving"


def test_a_delete_waits_parked_for_the_next_call_which_reads_its_answer_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _no_parked()
    rref = rpc.remote(PEER, sleep_then, (0.0, "dropped"))
    assert rref.to_here() == "dropped"
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    monkeypatch.setattr(lane, "_hand_over_due", lambda: None)  # the sweeper leaves it be
    before = _counts()
    del rref
    assert agent_mod.current().rref.flush_releases(10)  # the delete was written, parked
    assert (lane_info() or {}).get("parked") == 1
    assert rpc.rpc_sync(PEER, echo, ("next",)) == "next"
    # The rpc_sync went behind the delete and read its answer first: both counted here.
    assert _grew(before, _counts(), "parked", "behind", "calls", "handed_over") == [1, 1, 2, 0]
    assert (lane_info() or {}).get("parked") == 0


def test_a_burst_of_deletes_in_chains_all_reach_the_owner() -> None:
    _no_parked()
    base = rpc.rpc_sync(PEER, owner_rrefs)
    held = [rpc.remote(PEER, sleep_then, (0.0, i)) for i in range(3 * bulk_lane_calls.CHAIN_LIMIT)]
    assert [r.to_here() for r in held] == list(range(3 * bulk_lane_calls.CHAIN_LIMIT))
    assert rpc.rpc_sync(PEER, owner_rrefs) == base + len(held)
    before = _counts()
    del held  # deletes in a burst: chains of quick calls, some behind others
    assert until(lambda: rpc.rpc_sync(PEER, owner_rrefs) == base, 10)
    assert _grew(before, _counts(), "behind")[0] >= 1
    _no_parked()


def _cpu_ns(thread: threading.Thread) -> int:
    """CPU time the kernel counted for ``thread`` (``/proc/self/task/<tid>/schedstat``)."""
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[0])


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc")
def test_after_a_burst_of_remotes_and_deletes_the_sweeper_and_the_releaser_go_quiet() -> None:
    # The sweeper ticks while answers are parked and the release thread while RRefs keep
    # being released; both must stop once they stop coming.
    for i in range(200):
        assert rpc.remote(PEER, sleep_then, (0.0, i)).to_here() == i
    _no_parked()
    time.sleep(0.3)
    names = ("gradwire-lane-sweeper", f"gradwire-{MAIN}-rref-release")
    quiet = [t for t in threading.enumerate() if t.name in names]
    assert sorted(t.name for t in quiet) == sorted(names)
    before = [_cpu_ns(t) for t in quiet]
    time.sleep(1.0)
    used = [_cpu_ns(t) - b for t, b in zip(quiet, before)]
    assert max(used) < 1_000_000, used  # a thread waking every 2 ms uses ~7 ms a second


def test_a_parked_answer_whose_connection_is_shut_fails_over_to_a_retry() -> None:
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    _no_parked()
    before = _counts()
    rref = rpc.remote(PEER, sleep_then, (1.0, "retried"), timeout=0)
    assert _grew(before, _counts(), "parked") == [1]
    lane.drop_peer(PEER)  # what losing the peer does to its connections
    assert rref.to_here(timeout=10) == "retried"
    assert until(rref.confirmed_by_owner, 10)


def test_a_remote_exception_keeps_its_type_and_the_lane_keeps_serving() -> None:
    _no_parked()
    before = _lane_calls()
    with pytest.raises(LaneCallError, match="on purpose"):
        rpc.rpc_sync(PEER, fail_with, ("on purpose",))
    assert _lane_calls()[0] == before[0] + 1
    _assert_same(rpc.rpc_sync(PEER, echo, (np.arange(10.0),)), np.arange(10.0))


def test_a_lane_call_past_its_timeout_fails_and_the_next_one_succeeds() -> None:
    info = lane_info()
    assert info is not None
    started = time.monotonic()
    with pytest.raises(gw.errors.RpcTimeoutError):
        rpc.rpc_sync(PEER, sleep_then, (3.0, "late"), timeout=0.3)
    assert time.monotonic() - started < 2.5
    assert rpc.rpc_sync(PEER, sleep_then, (0.0, "on time"), timeout=5) == "on time"
    after = lane_info()
    assert after is not None  # the timed-out connection was dropped, not kept
    assert after["connections_out"][PEER]["call_connections"] <= bulk_lane.CALL_CONNECTIONS_PER_PEER


def test_a_lane_call_to_a_peer_declared_lost_fails_at_once() -> None:
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    result: list[Any] = []

    def call() -> None:
        try:
            result.append(rpc.rpc_sync(PEER, sleep_then, (5.0, "late"), timeout=0))
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            result.append(exc)

    t = threading.Thread(target=call)
    started = time.monotonic()
    t.start()
    time.sleep(0.5)  # the call is on the lane, its callee asleep
    lane.drop_peer(PEER)  # what losing the peer does (Agent._drop_channels)
    t.join(10)
    assert not t.is_alive()
    assert time.monotonic() - started < 3.0
    assert isinstance(result[0], gw.errors.WorkerUnavailableError), result
    assert rpc.rpc_sync(PEER, echo, ("again",)) == "again"  # a new connection


def test_nested_lane_calls_both_ways_and_many_threads_at_once() -> None:
    x = np.arange(MiB // 8, dtype=np.float64)
    # PEER's lane thread serves call_back, which calls MAIN on its own lane connection.
    theirs = _counts(PEER)
    _assert_same(rpc.rpc_sync(PEER, call_back, (MAIN, x)), x)
    assert _grew(theirs, _counts(PEER), "calls")[0] == 1
    threads, per_thread = 12, 10  # more threads than call connections: some go by gRPC

    def work(i: int) -> int:
        for j in range(per_thread):
            v = np.full(THRESHOLD // 8 + i, float(i * 100 + j))
            _assert_same(rpc.rpc_sync(PEER, echo, (v,)), v)
        return i

    with ThreadPoolExecutor(threads) as pool:  # a failed thread's error is raised here
        assert sorted(pool.map(work, range(threads), timeout=60)) == list(range(threads))
    info = lane_info()
    assert info is not None
    assert info["connections_out"][PEER]["call_connections"] <= bulk_lane.CALL_CONNECTIONS_PER_PEER


def _hand_made_lane(
    monkeypatch: pytest.MonkeyPatch, name: str, magic: bytes, then: Callable[[socket.socket], None]
) -> tuple[Any, list[bool], socket.socket]:
    """A listener speaking the lane's handshake with ``magic`` (it takes the token's proof and
    records whether it was right), then running ``then(conn)`` on each connection: a peer
    record named ``name`` (in this worker's table for the test), the proofs seen, and the
    listening socket (the test closes it)."""
    listener = socket.create_server(("127.0.0.1", 0))
    proofs: list[bool] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            nonce = os.urandom(32)
            conn.sendall(magic + nonce)
            (n,) = struct.unpack("<H", conn.recv(2, socket.MSG_WAITALL))
            sender = conn.recv(n, socket.MSG_WAITALL)
            proof = conn.recv(32, socket.MSG_WAITALL)
            proofs.append(proof == bulk_lane.mac(TOKEN, nonce, sender, magic))
            conn.sendall(b"\x01")
            then(conn)

    def accept() -> None:
        with listener:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    peer = dataclasses.replace(
        agent_mod.current().by_name[PEER],
        name=name,
        bulk_address=f"127.0.0.1:{listener.getsockname()[1]}",
    )
    monkeypatch.setitem(agent_mod.current().by_name, name, peer)
    return peer, proofs, listener


def test_a_first_version_lane_gets_transfers_and_no_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer whose listener says ``MAGIC_V1`` (a lane before calls): its calls go by gRPC
    (exchange gives up at once, nothing hangs), its transfers still go on its lane."""
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    old, proofs, listener = _hand_made_lane(
        monkeypatch, "old-peer", bulk_lane.MAGIC_V1, lambda conn: _until_closed(conn, 30)
    )
    try:
        started = time.monotonic()
        frame = fetch_frame_of_nothing()
        assert lane.exchange(old, frame, timeout=None) is None  # no call sent: gRPC's turn
        assert lane.exchange(old, frame, timeout=None) is None  # known now: not even a connect
        assert time.monotonic() - started < 5
        assert proofs == [True]
        conn = lane._take("old-peer", old.bulk_address)  # a connection for transfers
        assert conn is not None
        lane._give_back("old-peer", conn)
        info = lane_info()
        assert info is not None
        assert info["connections_out"]["old-peer"]["call_connections"] == 0
    finally:
        listener.close()
        lane.drop_peer("old-peer")


def test_a_malformed_answer_on_the_lane_fails_the_call_as_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A listener that answers a call with a STATUS record too short for its code: the call
    fails as UNAVAILABLE (the connection is the peer's fault), not with a struct error."""
    lane = agent_mod.current().bulk_lane
    assert lane is not None

    def answer_badly(conn: socket.socket) -> None:
        _, size = struct.unpack("<QQ", conn.recv(16, socket.MSG_WAITALL))
        conn.recv(size, socket.MSG_WAITALL)  # the call
        conn.sendall(struct.pack("<QQ", bulk_lane.STATUS, 2) + b"\0\0")
        _until_closed(conn, 10)

    bad, proofs, listener = _hand_made_lane(monkeypatch, "bad-peer", bulk_lane.MAGIC, answer_badly)
    try:
        with pytest.raises(StreamFailed) as info:
            lane.exchange(bad, fetch_frame_of_nothing(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert proofs == [True]
    finally:
        listener.close()
        lane.drop_peer("bad-peer")


def _read_call(conn: socket.socket) -> bytes:
    record, size = struct.unpack("<QQ", conn.recv(16, socket.MSG_WAITALL))
    assert record == bulk_lane.CALL
    return conn.recv(size, socket.MSG_WAITALL)


def test_a_status_answer_leaves_its_connection_for_the_next_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lane = agent_mod.current().bulk_lane
    assert lane is not None

    def status_then_echo(conn: socket.socket) -> None:
        _read_call(conn)
        details = b"try later"
        body = struct.pack("<I", grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]) + details
        conn.sendall(struct.pack("<QQ", bulk_lane.STATUS, len(body)) + body)
        raw = _read_call(conn)  # the next call, on this same connection
        conn.sendall(struct.pack("<QQ", bulk_lane.CALL, len(raw)) + raw)
        _until_closed(conn, 10)

    fake, proofs, listener = _hand_made_lane(
        monkeypatch, "busy-peer", bulk_lane.MAGIC, status_then_echo
    )
    try:
        frame = fetch_frame_of_nothing()
        with pytest.raises(StreamFailed) as info:
            lane.exchange(fake, frame, timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.details() == "try later"
        reply = lane.exchange(fake, frame, timeout=10)
        assert reply is not None and reply.header == frame.header
        assert proofs == [True]  # one connection for both
    finally:
        listener.close()
        lane.drop_peer("busy-peer")


def test_a_call_behind_parked_answers_is_not_sent_twice_when_their_connection_breaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delete's answer waits parked; an rpc_sync goes behind it; the connection breaks
    before either answer: the call fails as UNAVAILABLE (it may have run: it must not be
    sent again by gRPC), and the parked call's ``done`` hears UNAVAILABLE too."""
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    calls_seen: list[int] = []

    def read_two_then_break(conn: socket.socket) -> None:
        _read_call(conn)
        _read_call(conn)
        calls_seen.append(2)
        conn.shutdown(socket.SHUT_RDWR)

    fake, proofs, listener = _hand_made_lane(
        monkeypatch, "breaking-peer", bulk_lane.MAGIC, read_two_then_break
    )
    _no_parked()
    monkeypatch.setattr(lane, "_hand_over_due", lambda: None)  # the sweeper leaves it be
    outcomes: list[Any] = []
    try:
        frame = fetch_frame_of_nothing()
        encoded = framing_encode(frame)
        # A quick call (housekeeping) never waits on a handshake: it rides an open connection.
        _open_idle_call_connection(lane, fake)
        with ThreadPoolExecutor(1) as readers:
            assert lane.start(
                fake, encoded, 10, readers, lambda r, e: outcomes.append(e), quick=True
            )
            assert (lane_info() or {}).get("parked") == 1
            with pytest.raises(StreamFailed) as info:
                lane.exchange(fake, frame, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert calls_seen == [2] and proofs == [True]  # both on one connection
        assert len(outcomes) == 1 and outcomes[0].code() == grpc.StatusCode.UNAVAILABLE
    finally:
        listener.close()
        lane.drop_peer("breaking-peer")


def _open_idle_call_connection(lane: Any, peer: Any) -> None:
    conn = lane._take(peer.name, peer.bulk_address, True)
    assert conn is not None
    lane._give_back(peer.name, conn, True)


def framing_encode(frame: Any) -> bytes:
    from gradwire._wire import framing

    return framing.encode_frame(frame)


def fetch_frame_of_nothing() -> Any:
    from gradwire._proto import worker_pb2 as pb
    from gradwire._wire import framing

    request = pb.FetchRequest(rref_id=pb.GloballyUniqueId(created_on=1, local_id=1))
    return framing.Frame(pb.FrameHeader(fetch_request=request, last=True), [])


def test_an_idle_connection_is_reused_only_while_open_and_quiet() -> None:
    for how in ("closed", "bytes", "reset"):
        ours, theirs = socket.socketpair()
        with ours:
            assert lane_io.still_open(ours)
            if how == "bytes":
                theirs.sendall(b"x")  # a lane never sends on an idle connection
            elif how == "reset":
                theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if how != "bytes":
                theirs.close()
            assert not lane_io.still_open(ours), how
            theirs.close()
    closed = socket.socket()
    closed.close()
    assert not lane_io.still_open(closed)


def _call_record(frame: bytes) -> bytes:
    return struct.pack("<QQ", bulk_lane.CALL, len(frame)) + frame


def _read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """The record the listener answered a call with: (record id, body)."""

    def exact(n: int) -> bytes:
        got = b""
        while len(got) < n:
            chunk = sock.recv(n - len(got))
            assert chunk, "the listener closed the connection"
            got += chunk
        return got

    sock.settimeout(10)
    record, n = struct.unpack("<QQ", exact(16))
    return record, exact(n)


def test_a_call_on_the_lane_is_checked_by_the_policy_as_any_other() -> None:
    """An authenticated connection (the token, any name) sends a call of os.system by hand:
    the callee refuses it with a PolicyError in the reply, and runs nothing."""
    from gradwire._proto import worker_pb2 as pb
    from gradwire._wire import calls, framing, pickler
    from gradwire._wire.exceptions import decode_exception

    marker = f"/tmp/gradwire-lane-attack-{time.monotonic_ns()}"
    name, _ = calls.function_name(os.system)
    header = pb.CallHeader(message_id=1, caller_id=0, kind=pb.CALL_KIND_PYTHON, function=name)
    plain = pickler.dumps_plain((calls.NO_SELF, (f"touch {marker}",), {}))
    assert plain is not None
    first = pb.FrameHeader(call=header, last=True)
    first.payload.pickle_nbytes = len(plain)
    frame = framing.encode_frame(framing.Frame(first, [plain]))
    with _authenticated() as sock:
        sock.sendall(_call_record(frame))
        record, body = _read_answer(sock)
    assert record == bulk_lane.CALL
    reply = framing.decode_frame(body).header.reply
    assert reply.HasField("error")
    me = agent_mod.current()
    refused = decode_exception(reply.error, me.policy, me.name)
    assert isinstance(refused, gw.errors.PolicyError), refused
    assert "system" in str(refused)
    assert not os.path.exists(marker)
    _serves_large_tensors()


def test_garbage_on_the_lane_gets_a_status_and_an_oversized_call_closes_the_connection() -> None:
    with _authenticated() as sock:
        for garbage in (b"\xff" * 40, b""):
            sock.sendall(_call_record(garbage))
            record, body = _read_answer(sock)
            assert record == bulk_lane.STATUS
            (code,) = struct.unpack_from("<I", body)
            assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0], body
            assert body[4:], "the status names what was wrong"
        sock.sendall(struct.pack("<QQ", bulk_lane.CALL, 1 << 40))  # no such frame is sent
        assert _until_closed(sock, 5) == b""
    with _authenticated() as sock:  # a status record is only ever the listener's
        sock.sendall(struct.pack("<QQ", bulk_lane.STATUS, 4) + b"\0\0\0\0")
        assert _until_closed(sock, 5) == b""
    _serves_large_tensors()


# -- TLS: no lane --------------------------------------------------------------------------------


def tls_body(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    me = agent_mod.current()
    x = np.random.rand(MiB // 8)
    t = gw.tensor(np.random.rand(512, 512), requires_grad=True)
    return {
        "bulk_addresses": [me.by_name[n].bulk_address for n in ("worker0", "worker1")],
        "equal": bool(
            np.array_equal(rpc.rpc_sync(1, echo, (x,)), x)
            and np.array_equal(rpc.rpc_sync(1, echo, (t,)).detach().numpy(), t.detach().numpy())
        ),
        "debug_entry": "bulk_lane" in rpc.get_debug_info(),
        "counters": bulk.stats(),
        "fast_lane_tcp": [me.by_name[n].call_dial for n in ("worker0", "worker1")]
        == [me.by_name[n].dial for n in ("worker0", "worker1")],
    }


def test_under_tls_there_is_no_lane_and_large_tensors_still_travel(
    pki: dict[str, bytes],  # noqa: F811 - the fixture imported above
) -> None:
    tls = {"tls_cert": pki["cert"], "tls_key": pki["key"], "tls_ca": pki["ca"]}
    results = run_cluster(
        2, tls_body, options={"use_unix_socket": False, "shm_transfer": False, **tls}
    )
    out = results[0].value
    assert out["bulk_addresses"] == ["", ""]
    assert out["equal"] is True
    assert out["debug_entry"] is False
    assert out["counters"] == {}
    assert out["fast_lane_tcp"] is True  # no fast lane port either: calls go to the TLS port


def ports_body(rank: int, world_size: int) -> Any:
    me = agent_mod.current()
    peer = me.by_name[f"worker{1 - rank}"]
    return {
        "call": peer.call_dial.rpartition(":")[2],
        "bulk": peer.bulk_address.rpartition(":")[2],
        "echo": rpc.rpc_sync(1 - rank, echo, (np.arange(MiB // 8),)).sum(),
    }


def test_pinned_ports_are_the_ones_advertised() -> None:
    ports = [free_port() for _ in range(4)]
    results = run_cluster(
        2,
        ports_body,
        options={"use_unix_socket": False, "shm_transfer": False},
        rank_options={
            0: {"fast_lane_port": ports[0], "bulk_port": ports[1]},
            1: {"fast_lane_port": ports[2], "bulk_port": ports[3]},
        },
    )
    # Each sees the other's pinned ports, and a large echo crosses both.
    assert results[1].value["call"] == str(ports[0])
    assert results[1].value["bulk"] == str(ports[1])
    assert results[0].value["call"] == str(ports[2])
    assert results[0].value["bulk"] == str(ports[3])
    assert results[0].value["echo"] == np.arange(MiB // 8).sum()


# -- every wait counts against the call's timeout (issue 37) ----------------------------------


@pytest.mark.parametrize("kind", ["accepts, never greets", "never accepts"])
def test_a_call_keeps_its_timeout_when_the_lane_cannot_be_had(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    lane = agent_mod.current().bulk_lane
    assert lane is not None
    listener, held = silent_listener() if kind.startswith("accepts") else full_listener()
    name = f"unreachable-{len(kind)}"
    peer = dataclasses.replace(
        agent_mod.current().by_name[PEER],
        name=name,
        bulk_address=f"127.0.0.1:{listener.getsockname()[1]}",
    )
    monkeypatch.setitem(agent_mod.current().by_name, name, peer)
    try:
        for timeout in (0.3, 1.0):
            lane.drop_peer(name)  # forget the unreachable mark: a fresh connection each time
            started = time.monotonic()
            try:
                reply = lane.exchange(peer, fetch_frame_of_nothing(), timeout=timeout)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                reply = None
            elapsed = time.monotonic() - started
            assert reply is None  # not sent: the caller then has nothing left for gRPC
            assert elapsed < timeout + 0.3, (kind, timeout, elapsed)  # before: 5 s
        # a housekeeping call never waits on a connection: it returns at once, not sent
        lane.drop_peer(name)
        started = time.monotonic()
        with ThreadPoolExecutor(1) as readers:
            assert not lane.start(peer, b"x", 10, readers, lambda r, e: None, quick=True)
        assert time.monotonic() - started < 0.1
    finally:
        listener.close()
        for s in held:
            s.close()
        lane.drop_peer(name)


def test_the_grpc_fallback_gets_what_is_left_of_the_timeout() -> None:
    from gradwire._runtime.transport.transport import _left

    assert _left(None) is None
    assert 0.5 < (_left(time.monotonic() + 1.0) or 0) <= 1.0
    with pytest.raises(grpc.RpcError) as info:
        _left(time.monotonic() - 0.01)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_lane_checks_a_proof_only_once_its_worker_knows_the_token() -> None:
    """A follower learns a made-up token from rank 0's reply; a peer that joined first may dial
    its lane before then. The handshake waits for the rendezvous (within its own time) instead
    of refusing the connection as a wrong token (seen at 16 and 48 workers under load)."""
    from gradwire._runtime.cluster.context import PeerTable, WorkerContext
    from gradwire._runtime.cluster.device_maps import DeviceMaps
    from gradwire._runtime.cluster.events import AgentState, ClusterEvents

    token: list[str | None] = [None]  # not known yet: the worker is still joining
    options = rpc.GrpcRpcBackendOptions(token=None)
    table = PeerTable(DeviceMaps("late", {}), 2)
    ctx = WorkerContext("late", 1, 2, options, options.policy(), table)
    events = ClusterEvents()
    lane = bulk_lane.BulkLane(ctx, events, lambda: token[0])
    address = lane.listen("127.0.0.1", "127.0.0.1")
    host, _, port = address.rpartition(":")
    try:
        conn = socket.create_connection((host, int(port)), timeout=5)
        hello = conn.recv(len(bulk_lane.MAGIC) + 32, socket.MSG_WAITALL)
        name = b"early"
        proof = bulk_lane.mac("made-up", hello[len(bulk_lane.MAGIC) :], name, bulk_lane.MAGIC)
        conn.sendall(struct.pack("<H", len(name)) + name + proof)
        time.sleep(0.3)  # the proof waits: the lane does not know the token yet
        token[0] = "made-up"  # the rendezvous ends: the token is known, the agent runs
        events.state_changed(AgentState.RUNNING)
        assert conn.recv(1) == b"\x01"  # accepted, not refused as a wrong token
        conn.close()
    finally:
        lane.close()
