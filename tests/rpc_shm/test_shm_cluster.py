"""The same-host fast path between real worker processes: when it is used, by-value semantics,
concurrency, switching it off, cross-host, and what kill -9 mid-transfer leaves in /dev/shm."""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Iterator

import pytest
from gradwire.distributed.rpc._testing import run_cluster
from gradwire.multiprocessing import _shm_client
from gradwire.multiprocessing._shm_manager import ENV_VAR, SHM_DIR, segment_prefix

from . import shm_bodies as bodies


@pytest.fixture
def manager_env() -> Iterator[dict[str, str]]:
    """Workers join this process' segment manager, so their segment names share one prefix."""
    token = _shm_client.connect()
    yield {ENV_VAR: token}


def _leftovers(token: str, timeout: float = 10.0) -> list[str]:
    """Segments of manager ``token`` still in /dev/shm once ``timeout`` passed (or none left)."""
    pattern = os.path.join(SHM_DIR, segment_prefix(token) + "*")
    deadline = time.monotonic() + timeout
    while True:
        left = glob.glob(pattern)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)  # the manager gives back dead clients' references asynchronously


def test_same_host_uses_shm_above_threshold_only(manager_env: dict[str, str]) -> None:
    results = run_cluster(
        2,
        bodies.same_host_and_threshold,
        options={"shm_threshold_bytes": 2 << 20},
        env=manager_env,
    )
    out = results[0].value
    assert out["equal"]
    assert out["t_requires_grad"] is True
    assert out["strided_shape"] == (512, 512)
    caller, callee = out["after_small"]
    assert caller.get("sent", 0) == 0 and callee.get("sent", 0) == 0  # 1 MiB < threshold
    caller, callee = out["end"]
    # 3 MiB array, 2 MiB tensor and 2 MiB strided view: each way once.
    assert caller["sent"] == 3 and callee["received"] == 3
    assert callee["sent"] == 3 and caller["received"] == 3
    assert caller["sent_bytes"] == (3 + 2 + 2) << 20
    assert out["dial"].startswith("unix:")
    assert out["debug"]["counters"]["sent"] == 3
    assert out["debug"]["pools"]["worker1"]["created"] >= 1
    assert _leftovers(manager_env[ENV_VAR]) == []


def test_by_value_both_directions() -> None:
    results = run_cluster(2, bodies.by_value)
    checks = results[0].value
    assert checks == dict.fromkeys(checks, True)
    assert len(checks) == 7


def test_segment_reuse_keeps_concurrent_transfers_apart() -> None:
    results = run_cluster(2, bodies.concurrent_reuse, 48, timeout=90)
    out = results[0].value
    assert out["bad"] == []
    assert out["kept_corrupted"] == []
    pool = out["pool"]["worker1"]
    assert pool["reused"] > 0  # the pools were exercised, not bypassed
    assert pool["created"] < 48 + 48 // 2 + 48
    assert out["callee_pool"]["worker0"]["reused"] > 0


def test_switched_off_streams() -> None:
    results = run_cluster(2, bodies.same_host_and_threshold, options={"shm_transfer": False})
    out = results[0].value
    assert out["equal"]
    caller, callee = out["end"]
    assert caller.get("sent", 0) == callee.get("sent", 0) == 0
    assert caller.get("received", 0) == callee.get("received", 0) == 0


def test_cross_host_streams() -> None:
    # Rank 1 claims another host: no Unix socket, no shared memory, data still arrives.
    results = run_cluster(
        2, bodies.same_host_and_threshold, rank_env={1: {"GRADWIRE_HOST_ID": "elsewhere/b"}}
    )
    out = results[0].value
    assert out["equal"]
    caller, callee = out["end"]
    assert caller.get("sent", 0) == callee.get("sent", 0) == 0
    assert not out["dial"].startswith("unix:")


@pytest.mark.parametrize("victim", [0, 1])
def test_kill_9_mid_transfer_leaves_nothing(manager_env: dict[str, str], victim: int) -> None:
    results = run_cluster(
        2,
        bodies.kill_mid_transfer,
        victim,
        env=manager_env,
        expect_failure={victim},
        shutdown_graceful=False,
        timeout=60,
    )
    survivor = results[1 - victim]
    assert results[victim].exitcode != 0
    assert survivor.value["error"] is not None  # the peer died while transfers were running
    assert survivor.value["done"] > 0
    assert survivor.value["seen"] >= 2  # segments of this manager existed while transfers ran
    assert survivor.value["in_flight"] == 0  # the failed calls gave their segments back
    assert _leftovers(manager_env[ENV_VAR]) == []


def test_to_here_takes_the_same_path_by_value() -> None:
    from gradwire.distributed import rpc

    if not hasattr(rpc, "remote"):
        pytest.skip("gradwire.distributed.rpc.remote is not available yet")
    results = run_cluster(2, bodies.to_here_by_value)
    checks = results[0].value
    assert checks == dict.fromkeys(checks, True) and len(checks) == 4


def test_receivers_keep_their_mappings_between_transfers() -> None:
    """30 echoes of a 1 MiB tensor: each side maps the other's pooled segments once or twice,
    not once per transfer, and a reply kept by the caller is never overwritten by later ones."""
    results = run_cluster(2, bodies.repeated_transfers, 30)
    out = results[0].value
    assert out["kept_intact"]
    for side in ("caller", "callee"):
        assert out[side]["received"] == 30, out
        assert 1 <= out[side]["mapped"] <= 3, out  # the kept reply pins one more segment
    assert 1 <= out["cache"]["segments"] <= 3
