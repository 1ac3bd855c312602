"""A cluster of 32 workers on loopback (``pytest -m scale``; CI runs it as its own step): all-to-all,
fan-in, a large tensor to every worker, RRefs and a distributed backward across all of them,
the values checked, nothing left behind (contexts, RRefs, shared-memory segments) and a clean
shutdown of every process."""

from __future__ import annotations

import glob
import os

import pytest
from gradwire.distributed.rpc._testing import run_cluster
from gradwire.multiprocessing import _shm_client
from gradwire.multiprocessing._shm_manager import ENV_VAR, SHM_DIR, segment_prefix

from . import scale_bodies as bodies

pytestmark = pytest.mark.scale

WORLD = 32


def test_32_workers_all_to_all_fan_in_rrefs_and_a_distributed_backward() -> None:
    token = _shm_client.connect()  # the workers' segments share this process' prefix
    big = 2 << 20  # over the shared-memory threshold
    results = run_cluster(
        WORLD,
        bodies.cluster,
        big,
        timeout=280.0,
        env={ENV_VAR: token},
        options={"shm_threshold_bytes": 1 << 20},
    )
    for r in results:
        assert r.error is None, r.error
        assert r.exitcode == 0, f"worker{r.rank} exited with {r.exitcode}"
        assert r.value["connect_failed"] == [], (r.rank, r.value["connect_failed"])
        assert r.value["a2a_wrong"] == [], (r.rank, r.value["a2a_wrong"])
    out = results[0].value
    assert out["fanin_done"] and out["fanin_wrong"] == []
    assert out["big_sums"] == [float(big // 4)]
    n = WORLD - 1
    # loss = sum over owners r of sum(w_r * x) = 8 * (1 + ... + n)
    assert out["loss"] == 8.0 * n * (n + 1) / 2
    assert out["x_grad"] == [float(n * (n + 1) / 2)] * 8  # d/dx: the sum of the parameters
    assert out["param_grads"] == [(1.0,) * 8]  # d/dw_r: x, on every owner
    assert out["clean"], out.get("left")
    assert out["here"]["num_autograd_contexts"] == 0
    assert out["here"]["num_users"] == 0
    assert glob.glob(os.path.join(SHM_DIR, segment_prefix(token) + "*")) == []
