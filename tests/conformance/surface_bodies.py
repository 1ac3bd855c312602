"""Worker bodies of test_pytorch_surface.py (spawned processes import them by name)."""

from __future__ import annotations

import time
import warnings
from typing import Any

import gradwire as gw
from gradwire import errors
from gradwire.distributed import autograd as dist_autograd
from gradwire.distributed import rpc
from gradwire.distributed.optim import DistributedOptimizer


def add(a: Any, b: Any) -> Any:
    return a + b


def relay(to: str, a: Any) -> Any:
    return rpc.rpc_sync(to, add, (a, 1))


def num_contexts() -> int:
    return int(dist_autograd._get_debug_info()["num_autograd_contexts"])


def contexts_released_everywhere(rank: int, world_size: int, loops: int) -> Any:
    """``loops`` contexts, each calling a peer with plain arguments (half through a nested call
    to a third worker); then no context may be left anywhere within 1 s."""
    if rank != 0:
        return None
    for i in range(loops):
        with dist_autograd.context():
            if i % 2:
                rpc.rpc_sync("worker1", relay, ("worker2", i))
            else:
                rpc.rpc_sync("worker1", add, (i, 1))
    deadline = time.monotonic() + 1.0
    while True:
        counts = [rpc.rpc_sync(f"worker{r}", num_contexts) for r in range(world_size)]
        if not any(counts) or time.monotonic() > deadline:
            return counts


class GradStep(gw.optim.Optimizer):
    """Only PyTorch's contract: ``step()`` reading ``p.grad``; records what it saw."""

    seen: list[Any] = []

    def __init__(self, params: Any, lr: float = 0.5) -> None:
        super().__init__(params, {"lr": lr})

    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                GradStep.seen.append(None if p.grad is None else p.grad.tolist())
                if p.grad is not None:
                    with gw.no_grad():
                        p.sub_(p.grad * group["lr"])


class BrokenStep(gw.optim.Optimizer):
    def __init__(self, params: Any) -> None:
        super().__init__(params, {})

    def step(self, closure: Any = None) -> None:
        raise KeyError("no step today")


def make_param() -> Any:
    return gw.ones(2, requires_grad=True)


def loss_of(rref: Any) -> Any:
    return (rref.local_value() * 3).sum()


def state_of(rref: Any) -> Any:
    p = rref.local_value()
    return [p.tolist(), None if p.grad is None else p.grad.tolist(), GradStep.seen]


def set_grad(rref: Any, values: list[float]) -> None:
    rref.local_value().grad = gw.tensor(values)


def optimizer_contract(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    param = rpc.remote("worker1", make_param)
    rpc.rpc_sync("worker1", set_grad, (param, [7.0, 7.0]))  # a .grad of the owner's own
    opt = DistributedOptimizer(GradStep, [param], lr=0.5)
    with dist_autograd.context() as ctx:
        dist_autograd.backward(ctx, [rpc.rpc_sync("worker1", loss_of, (param,))])
        opt.step(ctx)
    out: dict[str, Any] = {"state": rpc.rpc_sync("worker1", state_of, (param,))}
    broken = DistributedOptimizer(BrokenStep, [param])
    with dist_autograd.context() as ctx:
        dist_autograd.backward(ctx, [rpc.rpc_sync("worker1", loss_of, (param,))])
        try:
            broken.step(ctx)
        except KeyError as exc:
            out["broken"] = [type(exc).__name__, "no step today" in str(exc), "worker1" in str(exc)]
    return out


def _backward_without_roots() -> None:
    with dist_autograd.context() as ctx:
        dist_autograd.backward(ctx, [])


def names_and_errors(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    out: dict[str, Any] = {}
    out["available"] = [rpc.is_available(), dist_autograd.is_available()]
    rpc.set_rpc_timeout(3.5)
    out["timeout"] = [rpc.get_rpc_timeout()]
    rpc._set_rpc_timeout(60)
    out["timeout"].append(rpc.get_rpc_timeout())
    try:
        rpc.set_rpc_timeout(-1)
    except errors.ArgumentError as exc:
        out["negative_timeout"] = isinstance(exc, (ValueError, RuntimeError))
    with dist_autograd.context() as ctx:
        rpc.rpc_sync("worker1", add, (1, 2))
        out["known"] = sorted(dist_autograd._retrieve_context(ctx)._known_worker_ids())
        out["current"] = dist_autograd._current_context()._context_id() == ctx
        out["max_id_ok"] = ctx <= dist_autograd._get_max_id() < (1 << 48)
    keep = rpc.remote("worker1", add, (1, 2))
    keep.to_here()
    out["rref_info"] = sorted(rpc._rref_context_get_debug_info())
    out["dist_info"] = sorted(dist_autograd._get_debug_info())
    for name, call in {
        "negative_rank": lambda: rpc.rpc_sync(-1, add, (1, 2)),
        "rank_too_big": lambda: rpc.get_worker_info("worker9"),
        "future_argument": lambda: rpc.rpc_sync("worker1", add, (gw.futures.Future(), 1)),
        "empty_roots": _backward_without_roots,
    }.items():
        try:
            call()
            out[name] = "no error"
        except RuntimeError as exc:
            out[name] = type(exc).__name__
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opts = rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=4, rpc_timeout=9, _transports=["uv"], devices=[0]
        )
    out["tensorpipe"] = [
        opts.num_worker_threads,
        opts.rpc_timeout,
        opts.devices,
        any("gRPC" in str(w.message) for w in seen),
    ]
    del keep
    return out
