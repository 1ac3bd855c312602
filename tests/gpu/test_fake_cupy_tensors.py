"""CUDA tensors, moves, options and IPC queues on the TEST-ONLY CuPy stand-in (no GPU here).

The stand-in (tests/fake_cupy) is installed as ``cupy`` by the ``fake_cupy_module`` fixture;
these tests check gradwire's device plumbing, not CuPy (scripts/gpu_check.sh does that).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import gradwire as gw
import gradwire.multiprocessing as gmp
import numpy as np
import pytest
from gradwire.distributed import rpc
from gradwire.multiprocessing import _cuda_refcount

from . import fake_cupy_ipc_worker as worker

pytestmark = pytest.mark.usefixtures("fake_cupy_module")
TIMEOUT = 30


def test_tensors_are_created_on_cuda0_and_cuda1_and_moved_between_them():
    assert gw.is_cuda_available()
    a = gw.ones(3, device="cuda:1")
    b = gw.zeros(2, 2, device="cuda:0")
    c = gw.arange(3.0).cuda(1)
    assert (str(a.device), str(b.device), str(c.device)) == ("cuda:1", "cuda:0", "cuda:1")
    moved = c.to("cuda:0")
    assert str(moved.device) == "cuda:0" and moved.cpu().tolist() == [0.0, 1.0, 2.0]
    assert moved._data.data.ptr != c._data.data.ptr  # a copy, not the same memory
    assert str((a + c).device) == "cuda:1"
    with pytest.raises(TypeError, match="cpu"):
        a.numpy()


def test_gradients_stay_on_the_device_of_their_leaf():
    w = gw.tensor([1.0, 2.0, 3.0], device="cuda:1", requires_grad=True)
    ((w * w).sum() * 2).backward()
    assert str(w.grad.device) == "cuda:1" and w.grad.cpu().tolist() == [4.0, 8.0, 12.0]
    x = gw.tensor([1.0, 2.0], requires_grad=True)
    (x.to("cuda:1") * 3).sum().backward()
    assert str(x.grad.device) == "cpu" and x.grad.tolist() == [3.0, 3.0]


def test_mixing_devices_in_one_op_is_refused_as_by_cupy():
    with pytest.raises(
        RuntimeError, match="same device, but found at least two devices, cuda:1 and cuda:0"
    ):
        gw.ones(2, device="cuda:1") + gw.ones(2, device="cuda:0")


def test_set_device_map_follows_pytorchs_rules():
    opts = rpc.GrpcRpcBackendOptions()
    opts.set_device_map("w1", {0: 1})
    opts.set_device_map("w1", {"cuda:1": "cuda:0"})  # adds to the map already set
    assert opts.device_maps == {"w1": {"cuda:0": "cuda:1", "cuda:1": "cuda:0"}}
    with pytest.raises(ValueError, match="one-to-one: cuda:0 and cuda:2 both map to cuda:1"):
        opts.set_device_map("w1", {2: 1})
    with pytest.raises(ValueError, match="CPU tensors always arrive on the CPU"):
        opts.set_device_map("w2", {"cpu": "cuda:0"})
    with pytest.raises(ValueError, match="devices lists CUDA devices"):
        opts.set_devices(["cpu"])
    with pytest.raises(ValueError, match="one-to-one"):
        rpc.TensorPipeRpcBackendOptions(device_maps={"w1": {0: 1, 1: 1}})


def test_cuda_tensor_through_a_multiprocessing_queue_shares_producer_memory():
    t = gw.ones(16).to("cuda:1")
    ctx = gmp.get_context("spawn")
    q, report = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=worker.consume, args=(q, report))
    p.start()
    try:
        q.put(t)
        assert report.get(timeout=TIMEOUT) == ("cuda:1", 16.0, "fake_cupy._array")
        assert report.get(timeout=TIMEOUT) == "released"
    finally:
        p.join(TIMEOUT if p.exitcode is None else 0)
        if p.is_alive():
            p.kill()
    assert p.exitcode == 0
    np.testing.assert_array_equal(t.cpu().numpy(), np.full(16, 2.0))  # the consumer's write
    assert _cuda_refcount.registry().collect() >= 1  # its slot was released


def test_a_cuda_tensor_sent_back_to_its_producer_uses_its_own_memory():
    t = gw.arange(6.0).to("cuda:0")
    view = t[2:5]
    back = ForkingPickler.loads(ForkingPickler.dumps(view))  # producer == consumer here
    assert str(back.device) == "cuda:0" and back.cpu().tolist() == [2.0, 3.0, 4.0]
    back._data[...] = 9.0
    assert t.cpu().tolist() == [0.0, 1.0, 9.0, 9.0, 9.0, 5.0]
    del back
    gc.collect()
    registry = _cuda_refcount.registry()
    assert registry.collect() == 1 and registry.held() == 0  # dropping it released its slot


def test_a_model_trains_on_cuda1_with_every_kernel_on_that_device():
    # The stand-in refuses an array of another device than the current one, as CuPy does
    # without peer access: ops, backward and the optimizer must each make cuda:1 current.
    gw.manual_seed(0)
    nn = gw.nn
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3)).to(
        "cuda:1"
    )
    opt = gw.optim.Adam(model.parameters(), lr=0.05)
    x = gw.randn(4, 1, 6, 6).to("cuda:1")
    y = gw.tensor([0, 1, 2, 0]).to("cuda:1")
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert {str(p.device) for p in model.parameters()} == {"cuda:1"}
    assert {str(p.grad.device) for p in model.parameters()} == {"cuda:1"}


def test_the_demo_trains_with_its_model_on_cuda0() -> None:
    # The whole demo (spawned parameter server and trainers) under the stand-in, installed in
    # every process through tests/fake_cupy/site (GRADWIRE_FAKE_CUPY=1).
    site = Path(__file__).resolve().parents[1] / "fake_cupy" / "site"
    env = {**os.environ, "GRADWIRE_FAKE_CUPY": "1", "PYTHONPATH": str(site)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gradwire.cli",
            "demo",
            "--device",
            "cuda:0",
            "--epochs",
            "4",
            "--target",
            "0.5",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "model on cuda:0" in done.stdout and "test accuracy" in done.stdout
