"""Unit checks of the pieces failure detection adds (no cluster): barrier release of a lost
worker, lost-peer error wording, lenient request parsing, option validation."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime.cluster.rendezvous import BarrierHost
from gradwire._runtime.transport import transport
from gradwire.distributed import rpc
from gradwire.errors import WorkerUnavailableError
from gradwire.server.servicer import Undecodable, lenient


def test_barrier_counts_a_lost_worker_as_arrived() -> None:
    async def scenario() -> tuple[pb.BarrierReply, pb.BarrierReply]:
        host = BarrierHost({0: "w0", 1: "w1", 2: "w2"})
        waiting = asyncio.ensure_future(host.arrive("shutdown", 0, 0, 10.0))
        await asyncio.sleep(0)
        await host.arrive("shutdown", 0, 2, 0.01)  # w1 missing: times out, names it
        host.mark_gone(1)
        first = await asyncio.wait_for(waiting, 5.0)
        later = await host.arrive("rref-drain", 0, 0, 0.01)  # still missing w2 only
        return first, later

    first, later = asyncio.run(scenario())
    assert first.ok
    assert not later.ok and list(later.missing) == ["w2"]


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "Socket closed"


def test_errors_name_a_lost_peer_as_lost() -> None:
    transport.set_lost("w9", "unreachable for 1 s")
    try:
        err = transport.map_rpc_error(_Failed(grpc.StatusCode.UNAVAILABLE), "w9", "to_here()", 0, 1)
        assert isinstance(err, WorkerUnavailableError)
        assert "is lost (unreachable for 1 s); to_here() cannot reach it" in str(err)
    finally:
        transport.set_lost("w9", None)
    err = transport.map_rpc_error(_Failed(grpc.StatusCode.UNAVAILABLE), "w9", "to_here()", 0, 1)
    assert "is unavailable during to_here()" in str(err)


def test_failure_observers_see_every_failed_call() -> None:
    seen: list[tuple[str, grpc.StatusCode]] = []

    def observe(peer: str, code: grpc.StatusCode) -> None:
        seen.append((peer, code))

    transport.add_failure_observer(observe)
    try:
        transport.map_rpc_error(_Failed(grpc.StatusCode.DEADLINE_EXCEEDED), "w3", "x", 0, 1)
    finally:
        transport.remove_failure_observer(observe)
    assert seen == [("w3", grpc.StatusCode.DEADLINE_EXCEEDED)]


def test_lenient_parsing_returns_a_refusal_instead_of_raising() -> None:
    parse = lenient(pb.ForkRequest.FromString, "ForkRequest")
    assert isinstance(parse(pb.ForkRequest(child_id=3).SerializeToString()), pb.ForkRequest)
    bad = parse(b"\xff\xff\xff")
    assert isinstance(bad, Undecodable) and bad.error.startswith("malformed ForkRequest")


def test_peer_lost_seconds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="peer_lost_seconds"):
        rpc.GrpcRpcBackendOptions(peer_lost_seconds=0)


# -- the detector itself, on a stand-in transport whose health checks the test decides ----------

import threading  # noqa: E402
import time  # noqa: E402

from gradwire._runtime.cluster import liveness as liveness_mod  # noqa: E402
from gradwire._runtime.cluster.context import PeerTable, WorkerContext  # noqa: E402
from gradwire._runtime.cluster.device_maps import DeviceMaps  # noqa: E402
from gradwire._runtime.cluster.events import (  # noqa: E402
    AgentState,
    ClusterEvents,
    ControlEvents,
)
from gradwire._runtime.cluster.workers import Peer  # noqa: E402

C = grpc.ChannelConnectivity


class _SlowHealth:
    """A transport whose health check answers after ``answer_after`` seconds (None: never,
    DEADLINE_EXCEEDED at the probe's timeout)."""

    def __init__(self, answer_after: float | None) -> None:
        self.answer_after = answer_after
        self.timeouts: list[float] = []

    def health(self, address: str, timeout: float) -> bytes:
        self.timeouts.append(timeout)
        if self.answer_after is not None and self.answer_after <= timeout:
            time.sleep(self.answer_after)
            return b""
        time.sleep(timeout)
        raise _Failed(grpc.StatusCode.DEADLINE_EXCEEDED)


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector's grace as on a quiet machine (it grows with the load average)."""
    monkeypatch.setattr(liveness_mod, "_load", lambda: 0.0)


def _detector(health: _SlowHealth, grace: float) -> tuple[Any, Peer, list[str]]:
    options = rpc.GrpcRpcBackendOptions(peer_lost_seconds=grace)
    table = PeerTable(DeviceMaps("w0", {}), 2)
    peers = [
        Peer("w0", 0, "127.0.0.1:1", dial="127.0.0.1:1"),
        Peer("w1", 1, "127.0.0.1:2", dial="127.0.0.1:2"),
    ]
    table.fill(peers, DeviceMaps("w0", {}))
    ctx = WorkerContext("w0", 0, 2, options, options.policy(), table)
    events = ClusterEvents()
    events.state_changed(AgentState.RUNNING)
    lost: list[str] = []
    events.on_peer_lost(lambda peer, why: lost.append(peer.name))
    return liveness_mod.Liveness(ctx, health, events, ControlEvents()), peers[1], lost  # type: ignore[arg-type]


def _probe_in_thread(detector: Any, peer: Peer) -> threading.Thread:
    t = threading.Thread(target=detector._probe, args=(peer,), daemon=True)
    t.start()
    return t


def test_a_slow_health_check_within_the_grace_is_an_answer() -> None:
    """One probe may take what is left of the grace (a loaded machine answers late): a peer
    that answers after 1.5 s of a 3 s grace is alive (probes were capped at 1 s before)."""
    health = _SlowHealth(answer_after=1.5)
    detector, peer, lost = _detector(health, grace=3.0)
    _probe_in_thread(detector, peer).join(10)
    assert lost == [] and health.timeouts[0] > 2.5


def test_a_peer_heard_from_within_the_grace_is_not_lost_however_slow_its_health_check() -> None:
    health = _SlowHealth(answer_after=None)
    detector, peer, lost = _detector(health, grace=1.0)
    stop = threading.Event()

    def calls_arrive() -> None:  # the peer keeps calling this worker
        while not stop.is_set():
            detector._ctx.peers.heard[peer.id] = time.monotonic()
            time.sleep(0.1)

    feeder = threading.Thread(target=calls_arrive, daemon=True)
    feeder.start()
    try:
        _probe_in_thread(detector, peer).join(10)
    finally:
        stop.set()
    assert lost == []
    # Silent (a frozen or cut-off peer): lost once the grace passes.
    detector._ctx.peers.heard.clear()
    _probe_in_thread(detector, peer)  # goes on probing the lost peer until stopped
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    detector.stop()
    assert lost == ["w1"]


@pytest.mark.parametrize(
    ("before", "now", "dropped"),
    [
        (C.READY, C.IDLE, True),
        (C.READY, C.TRANSIENT_FAILURE, True),
        (C.CONNECTING, C.IDLE, True),  # connected and closed between two readings
        (C.CONNECTING, C.TRANSIENT_FAILURE, False),  # a first connect failed: gRPC retries
        (C.TRANSIENT_FAILURE, C.IDLE, False),
        (C.IDLE, C.IDLE, False),
        (C.CONNECTING, C.READY, False),
    ],
)
def test_which_connectivity_changes_make_a_suspect(before: C, now: C, dropped: bool) -> None:
    assert liveness_mod._dropped(before, now) is dropped


def test_the_grace_grows_with_the_load_only_on_an_overloaded_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    detector, _, _ = _detector(_SlowHealth(None), grace=2.0)
    cpus = liveness_mod.os.cpu_count() or 1
    monkeypatch.setattr(liveness_mod, "_load", lambda: 1.0 * cpus)
    assert detector._grace() == 2.0
    monkeypatch.setattr(liveness_mod, "_load", lambda: 80.0 * cpus)
    assert detector._grace() == 20.0  # 10 times past OVERLOADED_PER_CPU (8)
    monkeypatch.setattr(liveness_mod, "_load", lambda: 8000.0 * cpus)
    assert detector._grace() == detector._ctx.options.rpc_timeout  # never past it


_REAL_LOAD = liveness_mod._load  # before the fixture replaces it


def test_the_load_is_read_from_this_machine() -> None:
    load = _REAL_LOAD()
    assert load is not None and load >= 0.0  # Linux: /proc/loadavg
