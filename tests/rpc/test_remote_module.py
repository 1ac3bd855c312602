"""RemoteModule over a real 2-worker cluster, and DistributedOptimizer with AdamW, RMSprop and
Adagrad over remote and local parameters. One cluster run (a few seconds) feeds every test."""

from __future__ import annotations

from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
import numpy as np
import pytest
from gradwire.distributed import rpc
from gradwire.distributed.nn import RemoteModule
from gradwire.distributed.nn.remote_module import _parse_remote_device
from gradwire.distributed.optim import DistributedOptimizer
from gradwire.distributed.rpc._testing import run_cluster

OPTIMIZERS = {
    "AdamW": {"lr": 0.05, "weight_decay": 0.1, "amsgrad": True},
    "RMSprop": {"lr": 0.01, "momentum": 0.9, "centered": True},
    "Adagrad": {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1},
}


class Affine(gw.nn.Module):
    """A user module: runnable on the callee as the program's own code."""

    def __init__(self, n: int, bias: float = 0.0) -> None:
        super().__init__()
        self.weight = gw.nn.Parameter(gw.arange(n, dtype=gw.float64) + 1.0)
        self.inner = gw.nn.Linear(n, 1, bias=False).double()
        self.bias = bias

    def forward(self, x: gw.Tensor, scale: float = 1.0) -> gw.Tensor:
        return (x * self.weight).sum(dim=1) * scale + self.bias


class Linear64(gw.nn.Linear):
    """A float64 Linear (dtypes are not among the globals a peer may send)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__(n_in, n_out, dtype=gw.float64)


class NotAModule:
    def __init__(self, n: int) -> None:
        self.n = n


def _numpy(t: Any) -> np.ndarray:
    return t.detach().numpy().copy()


def _errors(x: gw.Tensor) -> dict[str, str]:
    out = {}
    for key, make in {
        "bad_device": lambda: RemoteModule("worker1/gpu", gw.nn.Linear, (4, 3)),
        "bad_rank": lambda: RemoteModule("rank:one/cpu", gw.nn.Linear, (4, 3)),
        "not_module": lambda: RemoteModule("worker1", NotAModule, (4,)),
        "ctor": lambda: RemoteModule("worker1", gw.nn.Linear, (4,)),
        "cuda": lambda: RemoteModule("worker1/cuda:0", gw.nn.Linear, (4, 3)),
    }.items():
        try:
            make()
            out[key] = "no error"
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out[key] = (
                f"{type(exc).__name__}|{'|'.join(c.__name__ for c in type(exc).__mro__)}|{exc}"
            )
    return out


def _optimizer_run(name: str, x: gw.Tensor) -> dict[str, Any]:
    """Two DistributedOptimizer steps over a RemoteModule's parameters and a local one,
    then the same two steps on a local replica."""
    rm = RemoteModule("worker1/cpu", Linear64, args=(4, 3))
    params = rm.remote_parameters()
    start = [_numpy(p.to_here()) for p in params]
    scale = gw.nn.Parameter(gw.tensor([0.5, -1.0, 2.0], dtype=gw.float64))
    scale0 = _numpy(scale)
    opt = DistributedOptimizer(
        getattr(gw.optim, name), params + [rpc.RRef(scale)], **OPTIMIZERS[name]
    )
    for _ in range(2):
        with dist_autograd.context() as cid:
            loss = (rm(x) * scale).sin().sum()
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
    replica = gw.nn.Linear(4, 3, dtype=gw.float64)
    with gw.no_grad():
        replica.weight.copy_(gw.tensor(start[0]))
        replica.bias.copy_(gw.tensor(start[1]))
    ref_scale = gw.nn.Parameter(gw.tensor(scale0))
    ref = getattr(gw.optim, name)(list(replica.parameters()) + [ref_scale], **OPTIMIZERS[name])
    for _ in range(2):
        ref.zero_grad()
        (replica(x) * ref_scale).sin().sum().backward()
        ref.step()
    return {
        "remote": [_numpy(p.to_here()) for p in params],
        "local": _numpy(scale),
        "ref": [_numpy(p) for p in replica.parameters()],
        "ref_local": _numpy(ref_scale),
        "start": start,
    }


def cluster_body(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    out: dict[str, Any] = {}
    x = gw.randn(5, 4)
    rm = RemoteModule("worker1/cpu", gw.nn.Linear, args=(4, 3))
    out["owner"], out["on"], out["device"] = rm.get_module_rref().owner_name(), rm.on, rm.device
    fut = rm.forward_async(x)
    out["future_type"] = type(fut).__name__
    out["forward"] = [_numpy(rm(x)), _numpy(rm.forward(x)), _numpy(fut.wait())]
    out["local_copy"] = _numpy(rm.get_module_rref().to_here()(x))
    params = rm.remote_parameters()
    out["param_owners"] = [p.owner_name() for p in params]
    out["params_not_recursive"] = len(
        RemoteModule("worker1", Affine, (4,)).remote_parameters(recurse=False)
    )
    w0 = [_numpy(p.to_here()) for p in params]
    opt = DistributedOptimizer(gw.optim.SGD, params, lr=0.1)
    with dist_autograd.context() as cid:
        y = rm(x)
        loss = y.sum()
        dist_autograd.backward(cid, [loss])
        out["y_requires_grad"] = y.requires_grad
        opt.step(cid)
    out["sgd"] = (w0, [_numpy(p.to_here()) for p in params], _numpy(x))
    user = RemoteModule("rank:1", Affine, args=(4,), kwargs={"bias": 0.5})
    x64 = gw.randn(2, 4, dtype=gw.float64)
    out["user"] = (_numpy(user(x64, scale=2.0)), _numpy(x64), user.on)
    out["errors"] = _errors(x)
    try:
        rm.parameters()
    except ValueError as exc:
        out["errors"]["local_parameters"] = str(exc)
    xo = gw.randn(6, 4, dtype=gw.float64)
    out["optim"] = {name: _optimizer_run(name, xo) for name in OPTIMIZERS}
    return out


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    results = run_cluster(2, cluster_body, timeout=60.0)
    assert all(r.error is None for r in results), [r.error for r in results]
    return results[0].value


def test_module_lives_on_the_named_worker(cluster):
    assert (cluster["owner"], cluster["on"], cluster["device"]) == ("worker1", "worker1", "cpu")
    assert cluster["param_owners"] == ["worker1", "worker1"]
    assert cluster["params_not_recursive"] == 1  # Affine.weight, not inner.weight


def test_forward_sync_async_and_call_agree_with_the_module_itself(cluster):
    assert cluster["future_type"] == "Future"
    for got in cluster["forward"]:
        np.testing.assert_array_equal(got, cluster["local_copy"])
        assert got.shape == (5, 3)


def test_backward_in_a_dist_autograd_context_reaches_the_remote_weights(cluster):
    assert cluster["y_requires_grad"]
    (w0, b0), (w1, b1), x = cluster["sgd"]
    # loss = sum(x @ W.T + b): dW[j, k] = sum_b x[b, k], db[j] = batch size
    np.testing.assert_allclose(w1, w0 - 0.1 * np.tile(x.sum(axis=0), (3, 1)), rtol=1e-5)
    np.testing.assert_allclose(b1, b0 - 0.1 * 5, rtol=1e-6)


def test_a_user_module_class_with_kwargs_and_a_rank_device(cluster):
    got, x, on = cluster["user"]
    assert on == "worker1"
    np.testing.assert_allclose(got, (x * np.arange(1.0, 5.0)).sum(axis=1) * 2.0 + 0.5)


def test_bad_remote_device_is_a_clear_value_error():
    for bad, match in [
        ("worker1/gpu", "unknown device 'gpu'"),
        ("a/b/c", "valid format"),
        ("rank:x/cpu", "not a non-negative integer"),
        ("/cpu", "valid format"),
        (3, "must be a string"),
    ]:
        with pytest.raises(ValueError, match=match):
            _parse_remote_device(bad)
    assert _parse_remote_device("rank:0/cpu") == (0, gw.device("cpu"))
    assert _parse_remote_device("trainer") == ("trainer", gw.device("cpu"))
    assert _parse_remote_device("ps/cuda:1") == ("ps", gw.device("cuda:1"))


def test_errors_over_the_cluster(cluster):
    errors = cluster["errors"]
    assert errors["bad_device"].startswith("ValueError|") and "worker1/gpu" in errors["bad_device"]
    assert errors["bad_rank"].startswith("ValueError|")
    assert errors["not_module"].startswith("TypeError|") and "nn.Module" in errors["not_module"]
    assert errors["ctor"].startswith("TypeError|") and "worker1" in errors["ctor"]
    assert "remote_parameters()" in errors["local_parameters"]
    # the CUDA device reaches the remote module's .to(); this machine has no GPU
    assert "|RuntimeError|" in errors["cuda"] and "CUDA" in errors["cuda"]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_distributed_optimizer_with_new_optimizers_matches_a_local_replica(cluster, name):
    run = cluster["optim"][name]
    for got, ref, start in zip(run["remote"], run["ref"], run["start"]):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
        assert not np.allclose(got, start)  # the remote weights moved
    np.testing.assert_allclose(run["local"], run["ref_local"], rtol=1e-10, atol=1e-12)
