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


# -- DistributedOptimizer, RRef.backward, dead peers ------------------------------------------


def make_param(seed: int, n: int) -> gw.Tensor:
    return gw.nn.Parameter(_leaf(seed, n).detach())


def param_rref(seed: int, n: int) -> Any:
    return rpc.RRef(make_param(seed, n))


def param_value(rref: Any) -> np.ndarray:
    return rref.local_value().detach().numpy().copy()


def use_param(rref: Any, x: gw.Tensor) -> gw.Tensor:
    return rref.local_value() * x


class BrokenOptimizer(gw.optim.SGD):
    def __init__(self, params: Any, **kwargs: Any) -> None:
        raise RuntimeError("cannot build this optimizer here")


def dist_optimizer(rank: int, world_size: int, opt_name: str) -> Any:
    from gradwire.distributed.optim import DistributedOptimizer

    if rank != 0:
        return None
    cls = {"SGD": gw.optim.SGD, "Adam": gw.optim.Adam}[opt_name]
    kwargs = {"lr": 0.1, "momentum": 0.9} if opt_name == "SGD" else {"lr": 0.05}
    remote_p = rpc.remote("worker1", make_param, (11, 4))  # owner: worker1
    untouched = rpc.remote("worker2", make_param, (12, 4))  # gets no gradient
    local_p = make_param(13, 4)
    start = {
        "remote": remote_p.to_here().detach().numpy().copy(),
        "local": local_p.detach().numpy().copy(),
        "untouched": untouched.to_here().detach().numpy().copy(),
    }
    opt = DistributedOptimizer(cls, [remote_p, untouched, rpc.RRef(local_p)], **kwargs)
    x = _leaf(14, 4).detach()
    for _ in range(2):
        with dist_autograd.context() as cid:
            y = rpc.rpc_sync("worker1", use_param, (remote_p, x))
            loss = ((y * local_p).sin()).sum()
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
    # The same two steps on a local replica.
    rp, lp = gw.nn.Parameter(gw.tensor(start["remote"])), gw.nn.Parameter(gw.tensor(start["local"]))
    ref = cls([rp, lp], **kwargs)
    for _ in range(2):
        ref.zero_grad()
        ((rp * x * lp).sin()).sum().backward()
        ref.step()
    errors = {}
    try:
        DistributedOptimizer(BrokenOptimizer, [remote_p], lr=0.1)
    except RuntimeError as exc:
        errors["ctor"] = str(exc)
    try:
        DistributedOptimizer(gw.optim.SGD, [local_p])
    except TypeError as exc:
        errors["not_rref"] = str(exc)
    return {
        "remote": (rpc.rpc_sync("worker1", param_value, (remote_p,)), rp.detach().numpy()),
        "local": (local_p.detach().numpy().copy(), lp.detach().numpy()),
        "untouched": (rpc.rpc_sync("worker2", param_value, (untouched,)), start["untouched"]),
        "errors": errors,
    }


def scalar_loss(x: gw.Tensor) -> gw.Tensor:
    return (x * x).sum()


def rref_backward(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    x = _leaf(15, 3)
    with dist_autograd.context() as cid:
        loss_rref = rpc.remote("worker1", scalar_loss, (x,))
        loss_rref.backward(cid)
        g = dist_autograd.get_gradients(cid)[x].numpy().copy()
    return {"got": g, "ref": 2 * x.detach().numpy()}


def remote_chain(rank: int, world_size: int) -> Any:
    """rpc_sync, remote and to_here across four workers, nested."""
    if rank != 0:
        return None
    x, w = _leaf(16, 4), _leaf(17, 4)
    with dist_autograd.context() as cid:
        a = rpc.rpc_sync("worker1", scaled_tanh, (x, w))
        r = rpc.remote("worker2", hop, (["worker3"], a, w))
        loss = (r.to_here() * x).sum()
        dist_autograd.backward(cid, [loss])
        grads = dist_autograd.get_gradients(cid)
        got = grads[x].numpy().copy(), grads[w].numpy().copy()
    lx, lw = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ly = (lx * lw).tanh()
    for _ in range(2):
        ly = (ly * lw).sin()
    (ly * lx).sum().backward()
    return {"got": got, "ref": (lx.grad.numpy(), lw.grad.numpy())}


def die_in_backward(x: gw.Tensor) -> gw.Tensor:
    class Die(gw.autograd.Function):
        @staticmethod
        def forward(ctx: Any, t: gw.Tensor) -> gw.Tensor:
            return t * 1

        @staticmethod
        def backward(ctx: Any, g: gw.Tensor) -> gw.Tensor:
            import os

            os._exit(9)

    return Die.apply(x)


def peer_dies_in_backward(rank: int, world_size: int) -> Any:
    if rank != 0:
        time.sleep(30)  # serve until the backward pass kills this process
        return None
    x = _leaf(18, 2)
    started = time.monotonic()
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", die_in_backward, (x,))
        try:
            dist_autograd.backward(cid, [y.sum()])
        except Exception as exc:  # noqa: BLE001
            return {
                "error": type(exc).__name__,
                "message": str(exc),
                "seconds": time.monotonic() - started,
            }
    return {"error": None}


_SENDS: list[tuple[str, int, bool]] = []


def watch_gradient_sends() -> None:
    """Record, on this worker, which thread sends each gradient message and whether it was
    sent ``here`` (by the thread that then waits for its answer), and which threads handle
    incoming gradient messages."""
    from gradwire._runtime.dist_autograd.engine import DistAutogradEngine
    from gradwire._runtime.dist_autograd.service import DistAutogradService

    send, handle = DistAutogradService.send_gradients, DistAutogradEngine.on_gradients

    def sending(self: Any, *args: Any, here: bool = False) -> Any:
        _SENDS.append(("send", threading.get_ident(), here))
        return send(self, *args, here=here)

    def handling(self: Any, *args: Any) -> Any:
        _SENDS.append(("handle", threading.get_ident(), False))
        return handle(self, *args)

    DistAutogradService.send_gradients = sending  # type: ignore[method-assign]
    DistAutogradEngine.on_gradients = handling  # type: ignore[method-assign]


def gradient_sends() -> list[tuple[str, int, bool]]:
    return list(_SENDS)


def matmul(x: gw.Tensor, w: gw.Tensor) -> gw.Tensor:
    return x @ w


def sends_from_the_waiting_thread(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    watch_gradient_sends()
    rpc.rpc_sync("worker1", watch_gradient_sends)
    x, w = _leaf(1, 4, 3), _leaf(2, 3, 5)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", matmul, (x, w))
        dist_autograd.backward(cid, [(y * y).sum()])
        one = {"grads": dist_autograd.get_gradients(cid), "sends": gradient_sends()}
    _SENDS.clear()
    peer_one = rpc.rpc_sync("worker1", gradient_sends)
    with dist_autograd.context() as cid:  # two recv functions ready at once: one is handed off
        y1 = rpc.rpc_sync("worker1", matmul, (x, w))
        y2 = rpc.rpc_sync("worker1", my_add, (x, x))
        dist_autograd.backward(cid, [(y1.sum() * y2.sum())])
        two = {"grads": dist_autograd.get_gradients(cid), "sends": gradient_sends()}
    xl, wl = (t.detach().requires_grad_(True) for t in (x, w))
    ((xl @ wl) * (xl @ wl)).sum().backward()
    ref_one = (xl.grad.numpy().copy(), wl.grad.numpy().copy())
    xl.grad = wl.grad = None
    ((xl @ wl).sum() * (xl + xl).sum()).backward()
    ref_two = (xl.grad.numpy().copy(), wl.grad.numpy().copy())
    return {
        "main": threading.get_ident(),
        "one": [one["sends"], peer_one],
        "two": two["sends"],
        "got": [
            (one["grads"][x].numpy(), one["grads"][w].numpy()),
            (two["grads"][x].numpy(), two["grads"][w].numpy()),
        ],
        "ref": [ref_one, ref_two],
    }


def received_gradients_kept_without_copy(rank: int, world_size: int) -> Any:
    """Count the copies the caller's store makes of gradients that came in a message."""
    if rank != 0:
        return None
    x, z = _leaf(3, 64, 32), _leaf(4, 64, 32)
    w = _leaf(5, 32, 16)
    clones = []
    clone = gw.Tensor.clone

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        clones.append(self.shape)
        return clone(self, *args, **kwargs)

    gw.Tensor.clone = counting  # type: ignore[method-assign]
    try:
        with dist_autograd.context() as cid:
            y = rpc.rpc_sync("worker1", matmul, (x, w))
            dist_autograd.backward(cid, [(y * y).sum()])
            grads = dist_autograd.get_gradients(cid)
            mm = {"x": grads[x].numpy().copy(), "w": grads[w].numpy().copy()}
        mm_clones = len(clones)
        with dist_autograd.context() as cid:  # one gradient object for both x and z
            s = rpc.rpc_sync("worker1", my_add, (x, z))
            dist_autograd.backward(cid, [(s * s).sum()])
            grads = dist_autograd.get_gradients(cid)
            add = {"x": grads[x].numpy(), "z": grads[z].numpy()}
    finally:
        gw.Tensor.clone = clone  # type: ignore[method-assign]
    xl, zl, wl = (t.detach().requires_grad_(True) for t in (x, z, w))
    ((xl @ wl) * (xl @ wl)).sum().backward()
    ((xl + zl) * (xl + zl)).sum().backward()
    return {
        "mm_clones": mm_clones,
        "mm": mm,
        "add": add,
        "shared": bool(np.shares_memory(add["x"], add["z"])),
        "ref_mm": {"x": 2 * (x.detach().numpy() @ w.detach().numpy()) @ w.detach().numpy().T},
        "ref_w": wl.grad.numpy(),
        "ref_add": zl.grad.numpy(),
    }
