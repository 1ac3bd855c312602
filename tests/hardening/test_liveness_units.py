"""Unit checks of the pieces failure detection adds (no cluster): barrier release of a lost
worker, lost-peer error wording, lenient request parsing, option validation."""

from __future__ import annotations

import asyncio

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
