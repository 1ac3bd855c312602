"""Fault injection: partitions through the fault proxy, SIGKILL during a call, a backward and a
shutdown. Three real workers; worker1 is the victim, worker2 a bystander.

Bounds are behaviour, with generous margins: "fails well within the RPC timeout" means under
half of it; "reclaimed" means within ``peer_lost_seconds`` plus slack.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from gradwire.distributed.rpc._testing import free_port, run_cluster

from . import fault_bodies as bodies
from .faultproxy import FaultProxy

RPC_TIMEOUT = 30.0
PEER_LOST = 1.0


def _shm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("gradwire")}


def _options(**extra: Any) -> dict[str, Any]:
    return {
        "rpc_timeout": RPC_TIMEOUT,
        "use_unix_socket": False,  # every peer dials TCP, so the proxy sees the traffic
        # ... on the main port only: the proxy fronts that one (advertise_address), so the
        # second ports (fast lane, bulk lane) are off here
        "fast_lane_tcp": False,
        "bulk_transfer": False,
        "peer_lost_seconds": PEER_LOST,
        **extra,
    }


@pytest.mark.parametrize("mode", ["blackhole", "reset"])
def test_partition_and_heal(mode: str) -> None:
    ports = [free_port() for _ in range(3)]
    with FaultProxy(f"127.0.0.1:{ports[1]}") as proxy:
        results = run_cluster(
            3,
            bodies.partition_and_heal,
            ("127.0.0.1", proxy.control_port),
            mode,
            timeout=120,
            # A partition shorter than peer_lost_seconds: nothing is declared lost.
            options={
                **_options(peer_lost_seconds=60.0),
                "init_method": [f"127.0.0.1:{p}" for p in ports],
            },
            rank_options={1: {"advertise_address": proxy.address}},
        )
    r = results[0].value
    assert r["contexts_before"] == 1
    want = "RpcTimeoutError" if mode == "blackhole" else "WorkerUnavailableError"
    for message, elapsed in r["outcomes"]:
        # User calls fail clearly (type, worker name) and are never retried.
        assert message.startswith(want), message
        assert "worker1" in message, message
        assert elapsed < RPC_TIMEOUT / 2
    assert r["healed_call"][0] == "ok", r["healed_call"]
    # Non-idempotent counter on the callee: no call ran twice. Calls cut by a reset never
    # reached it; calls held in a black hole may have run once after the heal (their caller
    # had given up: the run is not a retry).
    tags = r["tags"]
    assert len(tags) == len(set(tags)), tags
    # A call held in a black hole on rpc_async's call pipe is delivered when the link heals,
    # possibly after the first call made once healed: order is not promised, once-only is.
    assert tags[0] == "before" and any(t.startswith("after-") for t in tags), tags
    if mode == "reset":
        assert tags == ["before", tags[-1]], tags
    # The control message (ReleaseContext) went through once healed: retried, not lost.
    assert r["released_after_heal_s"] < 20
    assert r["lost"] == []
    print(f"partition[{mode}]: {r}")


def test_kill_during_call_fails_pending_at_once_and_reclaims_contexts() -> None:
    before = _shm_names()
    results = run_cluster(
        3,
        bodies.kill_during_call,
        2 << 20,
        timeout=120,
        options=_options(),
        expect_failure={1},
    )
    r0, r2 = results[0].value, results[2].value
    message, elapsed = r0["call"]
    assert message.startswith("WorkerUnavailableError") and "worker1" in message, message
    assert elapsed < RPC_TIMEOUT / 2
    for message, _elapsed in r0["pending"]:
        assert message.startswith("WorkerUnavailableError"), message
    assert r0["pending_done_s"] < RPC_TIMEOUT / 2
    # Contexts worker1 created are reclaimed on both survivors (rank 2 never called worker1:
    # its channel subscription noticed the dropped connection).
    assert r0["reclaimed_s"] < PEER_LOST + 15 and r2["reclaimed_s"] < PEER_LOST + 30
    assert r0["lost"] == ["worker1"] and r2["lost"] == ["worker1"]
    assert r0["after"][0].startswith("WorkerUnavailableError"), r0["after"]
    assert results[1].exitcode == -9
    assert r0["shm"].get("sent", 0) >= 1, r0["shm"]  # the 2 MiB argument went through /dev/shm
    leaked = _shm_names() - before
    assert not leaked, f"shared memory left behind: {sorted(leaked)}"
    print(f"kill during call: {r0} / {r2}")


def test_kill_during_backward_fails_the_backward_within_the_timeout() -> None:
    results = run_cluster(
        3, bodies.kill_during_backward, timeout=120, options=_options(), expect_failure={1}
    )
    r = results[0].value
    message, elapsed = r["backward"]
    assert message != "ok" and "worker1" in message, message
    assert elapsed < RPC_TIMEOUT / 2
    assert r["contexts_left"] == 0
    print(f"kill during backward: {r}")


def test_kill_during_shutdown_survivors_still_shut_down() -> None:
    before = _shm_names()
    timeout = 20.0
    results = run_cluster(
        3,
        bodies.kill_during_shutdown,
        timeout,
        timeout=120,
        options=_options(),
        expect_failure={1},
    )
    for rank in (0, 2):
        message, elapsed = results[rank].value["shutdown"]
        # The barrier stops waiting for the dead worker once it is declared lost.
        assert elapsed < timeout, (rank, message, elapsed)
        print(f"kill during shutdown: rank {rank}: {message} in {elapsed:.2f} s")
    leaked = _shm_names() - before
    assert not leaked, f"shared memory left behind: {sorted(leaked)}"


def test_fault_proxy_modes_on_a_plain_socket() -> None:
    """The proxy itself: pass, delay, blackhole + heal, reset (against an echo server)."""
    import socket
    import threading
    import time

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def echo() -> None:
        server.settimeout(5)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    while data := conn.recv(1024):
                        conn.sendall(data)
                except OSError:
                    pass

    threading.Thread(target=echo, daemon=True).start()
    port = server.getsockname()[1]
    with FaultProxy(f"127.0.0.1:{port}") as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as c:
            c.sendall(b"a")
            assert c.recv(1) == b"a"
            proxy.set_mode("delay", 0.3)
            start = time.monotonic()
            c.sendall(b"b")
            assert c.recv(1) == b"b" and time.monotonic() - start >= 0.3
            proxy.set_mode("blackhole")
            c.sendall(b"c")
            c.settimeout(0.5)
            with pytest.raises(TimeoutError):
                c.recv(1)
            proxy.set_mode("pass")
            c.settimeout(5)
            assert c.recv(1) == b"c"  # held, then delivered once healed
            proxy.set_mode("reset")
            with pytest.raises((ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
                c.sendall(b"d")
                c.recv(1)
                c.recv(1)
    stop.set()
    server.close()


def test_rref_forks_under_transient_drops() -> None:
    ports = [free_port() for _ in range(4)]
    with FaultProxy(f"127.0.0.1:{ports[1]}") as proxy:
        results = run_cluster(
            4,
            bodies.rref_forks_under_drops,
            ("127.0.0.1", proxy.control_port),
            timeout=180,
            options={
                **_options(peer_lost_seconds=60.0),
                "init_method": [f"127.0.0.1:{p}" for p in ports],
            },
            rank_options={1: {"advertise_address": proxy.address}},
        )
    r = results[0].value
    print(f"rref forks under drops: {r}")
    assert r["values"] == [10, 11, 12, 13]  # no early delete
    assert isinstance(r["owner_clear_s"], float), r["owner_clear_s"]  # no leak once healed


def test_rref_owner_killed_users_get_a_clear_error_and_shut_down() -> None:
    timeout = 20.0
    results = run_cluster(
        3,
        bodies.rref_owner_killed,
        timeout,
        timeout=120,
        options=_options(),
        expect_failure={1},
    )
    r0, r2 = results[0].value, results[2].value
    print(f"rref owner killed: {r0} / {r2}")
    for message, elapsed in (r0["first"], r0["later"], r2["use"]):
        assert message.startswith("WorkerUnavailableError") and "worker1" in message, message
        assert elapsed < RPC_TIMEOUT / 2
    assert "lost" in r0["later"][0] and "lost" in r2["use"][0]
    for r in (r0, r2):
        message, elapsed = r["shutdown"]
        assert elapsed < timeout, r["shutdown"]


@pytest.mark.slow
@pytest.mark.xfail(
    reason="measured: with keepalive_seconds=6 the calls into a silent (black-holed) peer still "
    "end only at their 60 s deadline; the detector declares it lost 1 s later. Keepalive does "
    "not end them; see docs/reliability.md",
    strict=False,
)
def test_blackholed_peer_is_noticed_by_keepalive_before_the_timeout() -> None:
    """No RST ever comes: the keepalive (6 s + its timeout) should end the calls, the detector
    then declare the peer lost; all well before the 60 s RPC timeout."""
    ports = [free_port() for _ in range(3)]
    with FaultProxy(f"127.0.0.1:{ports[1]}") as proxy:
        results = run_cluster(
            3,
            bodies.blackholed_for_good,
            ("127.0.0.1", proxy.control_port),
            timeout=150,
            options={
                **_options(rpc_timeout=60.0, keepalive_seconds=6.0),
                "init_method": [f"127.0.0.1:{p}" for p in ports],
            },
            rank_options={1: {"advertise_address": proxy.address}},
            expect_failure={1, 2},
        )
    r = results[0].value
    print(f"black hole for good: {r}")
    message, elapsed = r["blocked_call"]
    assert message.startswith("WorkerUnavailableError") and "worker1" in message, message
    assert elapsed < 30
    assert r["lost_after_s"] < 40
