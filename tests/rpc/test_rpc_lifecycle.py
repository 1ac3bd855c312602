"""Agents started and stopped by the test itself: lifecycle, init errors, limits, chunking."""

from __future__ import annotations

import operator
import time
from typing import Any

import numpy as np
import pytest
from gradwire import errors
from gradwire.distributed import rpc

from .conftest import solo_options
from .test_rpc_local import async_chain, echo


def test_large_payload_streams_in_chunks_both_ways() -> None:
    rpc.init_rpc("chunky", 0, 1, solo_options(chunk_bytes=256 << 10, single_frame_bytes=1 << 20))
    try:
        big = np.random.default_rng(0).standard_normal((3 << 20) // 8)  # 3 MiB, 3+ frames
        np.testing.assert_array_equal(rpc.rpc_sync("chunky", echo, (big,)), big)
        # Small request, large reply: the reply is parked and fetched as a stream.
        np.testing.assert_array_equal(
            rpc.rpc_sync("chunky", np.ones, ((1 << 19,),)), np.ones(1 << 19)
        )
        fut = rpc.rpc_async("chunky", echo, (big,))
        np.testing.assert_array_equal(fut.wait(), big)
    finally:
        rpc.shutdown()


def test_message_size_limit_is_a_clear_error() -> None:
    rpc.init_rpc("small", 0, 1, solo_options(max_message_bytes=1 << 16))
    try:
        with pytest.raises(errors.MessageTooLargeError, match="max_message_bytes"):
            rpc.rpc_async("small", echo, (np.zeros(1 << 14),))
        with pytest.raises(errors.MessageTooLargeError, match="max_message_bytes"):
            rpc.rpc_sync("small", np.zeros, ((1 << 14,),))
    finally:
        rpc.shutdown()


def test_async_execution_holds_no_serving_thread() -> None:
    rpc.init_rpc("onethread", 0, 1, solo_options(num_worker_threads=1))
    try:
        futs = [rpc.rpc_async("onethread", async_chain, (i,)) for i in range(32)]
        assert [f.wait() for f in futs] == [(i + 1) * 2 for i in range(32)]
        assert rpc.get_debug_info()["serving_threads"] <= 4
    finally:
        rpc.shutdown()


def test_use_before_init_and_after_shutdown_and_reinit() -> None:
    with pytest.raises(errors.RpcNotInitializedError, match="init_rpc"):
        rpc.rpc_sync("x", operator.add, (1, 2))
    rpc.init_rpc("first", 0, 1, solo_options())
    with pytest.raises(errors.RpcInitError, match="already initialized"):
        rpc.init_rpc("again", 0, 1, solo_options())
    assert rpc.rpc_sync("first", operator.add, (1, 2)) == 3
    rpc.shutdown()
    with pytest.raises(errors.RpcNotInitializedError, match="shut down"):
        rpc.rpc_async("first", operator.add, (1, 2))
    with pytest.raises(errors.RpcNotInitializedError):
        rpc.get_worker_info()
    rpc.init_rpc("second", 0, 1, solo_options())
    assert rpc.rpc_sync("second", operator.add, (2, 2)) == 4
    rpc.shutdown()


def test_calls_served_the_moment_the_rendezvous_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    # A peer may call this worker as soon as the rendezvous completes, before init_rpc has
    # returned here; the function it runs must already see the running agent (CI once failed
    # with RpcNotInitializedError from get_worker_info() inside such a call).
    from gradwire._runtime import agent as agent_mod

    join = agent_mod.Agent.join
    seen: list[Any] = []

    def join_then_call(self: agent_mod.Agent) -> None:
        join(self)
        seen.append(rpc.rpc_sync(self.name, rpc.get_worker_info, timeout=10))

    monkeypatch.setattr(agent_mod.Agent, "join", join_then_call)
    rpc.init_rpc("early", 0, 1, solo_options())
    try:
        assert seen == [rpc.WorkerInfo("early", 0)]
    finally:
        rpc.shutdown(graceful=False)


def test_failed_init_leaves_no_agent_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradwire._runtime import agent as agent_mod

    def broken_join(self: agent_mod.Agent) -> None:
        raise errors.RpcInitError("rendezvous failed: injected")

    monkeypatch.setattr(agent_mod.Agent, "join", broken_join)
    with pytest.raises(errors.RpcInitError, match="injected"):
        rpc.init_rpc("broken", 0, 1, solo_options())
    with pytest.raises(errors.RpcNotInitializedError, match="init_rpc"):
        rpc.get_worker_info()
    monkeypatch.undo()
    rpc.init_rpc("after", 0, 1, solo_options())
    try:
        assert rpc.get_worker_info().name == "after"
    finally:
        rpc.shutdown(graceful=False)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "", "rank": 0, "world_size": 1}, "invalid worker name"),
        ({"name": "a b", "rank": 0, "world_size": 1}, "invalid worker name"),
        ({"name": "x" * 128, "rank": 0, "world_size": 1}, "invalid worker name"),
        ({"name": "ok", "rank": 1.5, "world_size": 2}, "rank must be an int"),
        ({"name": "ok", "rank": 2, "world_size": 2}, "out of range"),
        ({"name": "ok", "rank": 0, "world_size": 0}, "world_size must be at least 1"),
    ],
)
def test_init_argument_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(errors.RpcInitError, match=match):
        rpc.init_rpc(**kwargs, rpc_backend_options=solo_options())


def test_non_loopback_listener_requires_a_token() -> None:
    opts = solo_options(token=None, listen_address="0.0.0.0:0")
    opts.token = None
    with pytest.raises(errors.RpcInitError, match="without authentication"):
        rpc.init_rpc("exposed", 0, 1, opts)


def test_in_flight_limit_per_peer_is_a_clear_error() -> None:
    from .test_rpc_local import slow

    rpc.init_rpc("limited", 0, 1, solo_options(max_in_flight_per_peer=2))
    try:
        busy = [rpc.rpc_async("limited", slow, (0.5,)) for _ in range(2)]
        import time

        time.sleep(0.2)
        with pytest.raises(errors.TooManyRequestsError, match="max_in_flight_per_peer"):
            rpc.rpc_sync("limited", operator.add, (1, 2))
        assert [f.wait() for f in busy] == ["done", "done"]
        assert rpc.rpc_sync("limited", operator.add, (1, 2)) == 3
    finally:
        rpc.shutdown()


def test_the_in_flight_limit_refuses_one_call_of_the_pipe_not_the_pipe() -> None:
    from .bodies import sleep_then

    rpc.init_rpc("limited", 0, 1, solo_options(max_in_flight_per_peer=2, use_unix_socket=False))
    try:
        busy = [rpc.rpc_async("limited", sleep_then, (0.5, "done")) for _ in range(2)]
        time.sleep(0.2)
        refused = rpc.rpc_async("limited", operator.add, (1, 2))
        with pytest.raises(errors.TooManyRequestsError, match="max_in_flight_per_peer"):
            refused.wait()
        assert [f.wait() for f in busy] == ["done", "done"]
        assert rpc.rpc_async("limited", operator.add, (1, 2)).wait() == 3
    finally:
        rpc.shutdown()


def test_idle_worker_uses_no_cpu() -> None:
    import time

    rpc.init_rpc("idle", 0, 1, solo_options())
    try:
        rpc.rpc_sync("idle", operator.add, (1, 2))  # channels and threads exist
        time.sleep(0.2)
        before = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - before < 0.05
    finally:
        rpc.shutdown()


def test_rank_and_world_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    rpc.init_rpc("fromenv", rpc_backend_options=solo_options())
    try:
        assert rpc.get_worker_info() == rpc.WorkerInfo("fromenv", 0)
        with pytest.raises(TypeError, match="args must be a tuple or list"):
            rpc.rpc_async("fromenv", operator.add, 1)
        with pytest.raises(ValueError, match="timeout must be"):
            rpc.rpc_sync("fromenv", operator.add, (1, 2), timeout=-5)
    finally:
        rpc.shutdown()
    with pytest.raises(errors.RpcNotInitializedError, match="shutdown"):
        rpc.shutdown()
    monkeypatch.delenv("RANK")
    with pytest.raises(errors.RpcInitError, match=r"\$RANK"):
        rpc.init_rpc("norank", rpc_backend_options=solo_options())


def test_socket_dirs_of_dead_workers_are_swept(tmp_path: Any) -> None:
    import os
    import socket
    import subprocess
    import sys

    from gradwire._runtime.agent import sweep_socket_dirs

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(gone.stdout)

    def socket_dir(name: str) -> Any:
        d = tmp_path / name
        d.mkdir()
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(d / "0.sock"))
        s.close()
        return d

    dead = socket_dir(f"gw-{dead_pid}-abc")
    alive = socket_dir(f"gw-{os.getpid()}-abc")
    other = tmp_path / f"gw-{dead_pid}-data"
    other.mkdir()
    (other / "notes.txt").write_text("not a socket")  # not ours to delete: only sockets go
    unrelated = socket_dir("gw-notapid")
    assert sweep_socket_dirs(str(tmp_path)) == 1
    assert not dead.exists()
    assert alive.exists() and other.exists() and unrelated.exists()


def test_agent_socket_dir_names_its_pid() -> None:
    import os

    rpc.init_rpc("named", 0, 1, solo_options(use_unix_socket=True))
    try:
        dial = rpc.get_debug_info()["peers"][0]["address"]
        assert os.path.basename(os.path.dirname(dial)).startswith(f"gw-{os.getpid()}-"), dial
    finally:
        rpc.shutdown(graceful=False)


@pytest.mark.parametrize("lane", [False, True], ids=["call_stream", "lane"])
def test_shutdown_with_open_call_streams_does_not_wait_out_the_grace(lane: bool) -> None:
    from .test_call_streams import _open, _streams

    rpc.init_rpc("solo", 0, 1, solo_options(lane_calls=lane))
    try:
        assert rpc.rpc_sync("solo", operator.add, (1, 2)) == 3
        if lane:  # rpc_sync left a lane connection open
            info = rpc.get_debug_info()["bulk_lane"]
            assert info["connections_out"]["solo"]["call_connections"] == 1
        else:
            assert _open(_streams()) == 1  # rpc_sync left its stream open
    finally:
        started = time.monotonic()
        rpc.shutdown()
    # A stopping server gives open calls a grace of up to 2 s: the worker's own idle stream
    # would hold it that long if the streams were not ended first.
    assert time.monotonic() - started < 1.8


_UNREVIEWED_NUMPY_WORKER = """
import logging, sys
import numpy
numpy.__version__ = "2.9.1"  # a series the policy's lists were not reviewed against
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from gradwire.distributed import rpc
sys.path.insert(0, sys.argv[1])
from tests.rpc.conftest import solo_options
for name in ("first", "second"):
    rpc.init_rpc(name, 0, 1, solo_options())
    assert rpc.rpc_sync(name, numpy.add, (1, 2)) == 3  # the reviewed names still serve
    rpc.shutdown()
print("served")
"""


def test_a_worker_on_an_unreviewed_numpy_series_says_so_once() -> None:
    import subprocess
    import sys
    from pathlib import Path

    from gradwire._wire.policy import unreviewed_numpy

    root = str(Path(__file__).resolve().parents[2])
    run = subprocess.run(
        [sys.executable, "-c", _UNREVIEWED_NUMPY_WORKER, root],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "served" in run.stdout, run.stderr
    notes = [line for line in run.stderr.splitlines() if "NumPy 2.9.1 is installed" in line]
    assert len(notes) == 1, run.stderr
    assert "reviewed only against NumPy 2.2, 2.3, 2.4" in notes[0]
    assert "pip install 'numpy>=2.2,<2.5'" in notes[0]
    assert notes[0].startswith("WARNING")
    assert unreviewed_numpy("2.4.0") == "" and unreviewed_numpy("2.2.6") == ""
    assert "NumPy 3.0.0 is installed" in unreviewed_numpy("3.0.0")
