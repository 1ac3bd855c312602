"""Functions run on spawned workers by the distributed-autograd cluster tests."""

from __future__ import annotations

import threading
import time
from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
import numpy as np
from gradwire.distributed import rpc


def my_add(a: gw.Tensor, b: gw.Tensor) -> gw.Tensor:
    return a + b


def scaled_tanh(x: gw.Tensor, w: gw.Tensor) -> gw.Tensor:
    return (x * w).tanh()


def hop(path: list[str], x: gw.Tensor, w: gw.Tensor) -> gw.Tensor:
    """x * w, then on to the next worker of ``path`` (nested calls join the context)."""
    y = (x * w).sin()
    if not path:
        return y
    return rpc.rpc_sync(path[0], hop, (path[1:], y, w))


def boom_backward(x: gw.Tensor) -> gw.Tensor:
    class Boom(gw.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: gw.Tensor) -> gw.Tensor:
            return t * 1

        @staticmethod
        def backward(ctx: Any, g: gw.Tensor) -> gw.Tensor:
            raise ValueError("exploded in backward")

    return Boom.apply(x)


def num_contexts() -> int:
    return int(rpc.get_debug_info()["num_autograd_contexts"])


def _leaf(seed: int, *shape: int) -> gw.Tensor:
    rng = np.random.default_rng(seed)
    return gw.tensor(rng.standard_normal(shape), dtype=gw.float64, requires_grad=True)


def design_note(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    t1, t2, t4 = _leaf(1, 3, 3), _leaf(2, 3, 3), _leaf(3, 3, 3)
    with dist_autograd.context() as cid:
        t3 = rpc.rpc_sync("worker1", my_add, args=(t1, t2))
        loss = (t3 * t4).sum()
        dist_autograd.backward(cid, [loss])
        grads = dist_autograd.get_gradients(cid)
        got = [grads[t].numpy().copy() for t in (t1, t2, t4)]
    assert t1.grad is None and t2.grad is None and t4.grad is None
    l1, l2, l4 = (t.detach().clone().requires_grad_() for t in (t1, t2, t4))
    local = ((l1 + l2) * l4).sum()
    local.backward()
    return {
        "loss": (loss.item(), local.item()),
        "grads": [(g, lt.grad.numpy()) for g, lt in zip(got, (l1, l2, l4))],
        "cid": cid,
    }


def chain_four(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    x, w = _leaf(5, 4), _leaf(6, 4)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", hop, (["worker2", "worker3"], x, w))
        loss = (y * y).sum()
        dist_autograd.backward(cid, [loss])
        grads = dist_autograd.get_gradients(cid)
        got = grads[x].numpy().copy(), grads[w].numpy().copy()
    lx, lw = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ly = lx
    for _ in range(3):
        ly = (ly * lw).sin()
    (ly * ly).sum().backward()
    return {"got": got, "ref": (lx.grad.numpy(), lw.grad.numpy())}


def unused_output(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    x = _leaf(7, 3)
    started = time.monotonic()
    with dist_autograd.context() as cid:
        used = rpc.rpc_sync("worker1", scaled_tanh, (x, x))
        rpc.rpc_sync("worker1", scaled_tanh, (x, x * 2))  # dropped on the floor
        rpc.rpc_sync("worker2", my_add, (x, x))  # dropped too
        dist_autograd.backward(cid, [used.sum()])
        g = dist_autograd.get_gradients(cid)[x].numpy().copy()
    lx = x.detach().clone().requires_grad_()
    (lx * lx).tanh().sum().backward()
    return {"got": g, "ref": lx.grad.numpy(), "seconds": time.monotonic() - started}


def remote_error(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    x = _leaf(8, 2)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", boom_backward, (x,))
        try:
            dist_autograd.backward(cid, [y.sum()])
        except ValueError as exc:
            return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": None}


def cleanup_everywhere(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    x = _leaf(9, 2)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", hop, (["worker2"], x, x))
        during = [rpc.rpc_sync(f"worker{i}", num_contexts) for i in range(world_size)]
        dist_autograd.backward(cid, [y.sum()])
    deadline = time.monotonic() + 10
    after = []
    while time.monotonic() < deadline:
        after = [rpc.rpc_sync(f"worker{i}", num_contexts) for i in range(world_size)]
        if not any(after):
            break
        time.sleep(0.05)
    return {"during": during, "after": after}


def threads_and_retain(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    results: dict[int, Any] = {}
    errors: list[str] = []

    def one(k: int) -> None:
        try:
            x = gw.full((3,), float(k + 1), dtype=gw.float64, requires_grad=True)
            with dist_autograd.context() as cid:
                y = rpc.rpc_sync(f"worker{1 + k % (world_size - 1)}", my_add, (x, x * x))
                loss = y.sum()
                dist_autograd.backward(cid, [loss], retain_graph=True)
                dist_autograd.backward(cid, [loss])
                results[k] = dist_autograd.get_gradients(cid)[x].numpy().copy()
        except BaseException as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return {"results": results, "errors": errors}
