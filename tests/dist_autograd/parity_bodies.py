"""Worker bodies for test_torch_parity: what PyTorch's own dist-autograd tests observe."""

from __future__ import annotations

import time
from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
from gradwire.distributed import rpc

from .bodies import _leaf, my_add


def context_counts(context_id: int) -> tuple[int, int]:
    """(send functions, recv functions) recorded on this worker in ``context_id``."""
    ctx = dist_autograd._retrieve_context(context_id)
    return len(ctx._send_functions()), len(ctx._recv_functions())


def _here(context_id: int) -> tuple[int, int]:
    ctx = dist_autograd._current_context()
    assert ctx._context_id() == context_id
    return len(ctx._send_functions()), len(ctx._recv_functions())


def discard(x: gw.Tensor) -> None:
    """Takes tensors that require grad and answers nothing that does."""
    return None


def graph_names(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    x, w = _leaf(30, 3), _leaf(31, 3)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", my_add, (x, w))
        ctx = dist_autograd._current_context()
        (send,) = ctx._send_functions().values()
        (recv,) = ctx._recv_functions().values()
        return {
            "send": send.name(),
            "send_next": [n.name() for n, _ in send.next_functions],
            "recv": recv.name(),
            "y_grad_fn_is_recv": y.grad_fn is recv,
            "cid": cid,
        }


def recorded_counts(rank: int, world_size: int) -> Any:
    """What each side records for remote()+to_here(), for a call answering nothing that
    requires grad, and for a remote() never fetched; each pass must still finish exactly."""
    if rank != 0:
        return None
    x = _leaf(32, 3)
    out: dict[str, Any] = {}
    with dist_autograd.context() as cid:
        y = rpc.remote("worker1", my_add, (x, x)).to_here()
        out["remote_caller"] = _here(cid)
        out["remote_owner"] = rpc.rpc_sync("worker1", context_counts, (cid,))
        dist_autograd.backward(cid, [(y * y).sum()])
        out["remote_grad"] = dist_autograd.get_gradients(cid)[x].tolist()
    with dist_autograd.context() as cid:
        rpc.rpc_sync("worker1", discard, (x,))
        out["none_caller"] = _here(cid)
        out["none_callee"] = rpc.rpc_sync("worker1", context_counts, (cid,))
        started = time.monotonic()
        dist_autograd.backward(cid, [(x * x).sum()])
        out["none_grad"] = dist_autograd.get_gradients(cid)[x].tolist()
    with dist_autograd.context() as cid:
        # Never fetched, and the pass starts at once: it waits for the owner's ack, so its
        # send function still fires (test_inflight_calls makes the ack slow).
        rpc.remote("worker1", my_add, (x, x))
        dist_autograd.backward(cid, [(x * x).sum()])
        out["unfetched_grad"] = dist_autograd.get_gradients(cid)[x].tolist()
    out["seconds"] = time.monotonic() - started
    out["x"] = x.tolist()
    return out


class CountPasses(gw.autograd.Function):
    """Identity; its backward records this worker's num_current_backward_passes."""

    seen: list[int] = []

    @staticmethod
    def forward(ctx: Any, t: gw.Tensor) -> gw.Tensor:
        return t * 1

    @staticmethod
    def backward(ctx: Any, g: gw.Tensor) -> gw.Tensor:
        info = dist_autograd._get_debug_info()
        CountPasses.seen.append(int(info["num_current_backward_passes"]))
        return g


def passes_in_debug_info(rank: int, world_size: int) -> Any:
    if rank != 0:
        return None
    x = _leaf(33, 3)
    with dist_autograd.context() as cid:
        # Gradients cross worker0 -> worker1 -> worker0: CountPasses runs in worker0's handler
        # of a gradient message while its own backward() of the same pass is still running.
        y = rpc.rpc_sync("worker1", my_add, (x, x))
        z = rpc.rpc_sync("worker1", my_add, (CountPasses.apply(y), x))
        dist_autograd.backward(cid, [z.sum()])
        after = dist_autograd._get_debug_info()
    return {"during": CountPasses.seen, "after": after["num_current_backward_passes"]}


class _Single(gw.autograd.Function):
    ptr: int = 0

    @staticmethod
    def forward(ctx: Any, t: gw.Tensor) -> gw.Tensor:
        return t * 1

    @staticmethod
    def backward(ctx: Any, g: gw.Tensor) -> gw.Tensor:
        _Single.ptr = g.data_ptr()
        return g


class _Twice(gw.autograd.Function):
    ptr: int = 0

    @staticmethod
    def forward(ctx: Any, a: gw.Tensor, b: gw.Tensor) -> gw.Tensor:
        return a + b

    @staticmethod
    def backward(ctx: Any, g: gw.Tensor) -> tuple[gw.Tensor, gw.Tensor]:
        _Twice.ptr = g.data_ptr()
        return g, g  # one gradient object for two leaves


class _Stash(gw.autograd.Function):
    kept: list[gw.Tensor] = []

    @staticmethod
    def forward(ctx: Any, t: gw.Tensor) -> gw.Tensor:
        return t * 1

    @staticmethod
    def backward(ctx: Any, g: gw.Tensor) -> gw.Tensor:
        _Stash.kept.append(g)  # the user keeps the very gradient it passes on
        return g


def gradient_ownership(rank: int, world_size: int) -> Any:
    """When the context's store takes a gradient's buffer and when it copies it."""
    a, b = _leaf(34, 5, 6), _leaf(35, 5, 6)
    out: dict[str, Any] = {}
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [_Single.apply(a)[1][0]])
        out["single_stolen"] = dist_autograd.get_gradients(cid)[a].data_ptr() == _Single.ptr
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [_Twice.apply(a, b)[1][0]])
        grads = dist_autograd.get_gradients(cid)
        ptrs = grads[a].data_ptr(), grads[b].data_ptr()
        out["twice_ptrs_distinct"] = len({*ptrs, _Twice.ptr}) == 3
        out["twice_values"] = grads[a].tolist() == grads[b].tolist()
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [_Stash.apply(a)[1][0]])
        stored = dist_autograd.get_gradients(cid)[a]
        before = stored.tolist()
        _Stash.kept[0].mul_(0).add_(7)  # must not change the stored gradient
        out["stash_unchanged"] = stored.tolist() == before and before[1][0] == 1.0
    return out


def post_hooks(rank: int, world_size: int) -> Any:
    t = _leaf(36, 4)
    a = t + t
    acc = a.grad_fn.next_functions[0][0]
    calls: list[Any] = []
    acc.register_hook(lambda outs, ins: calls.append((len(outs), ins[0].tolist())))
    acc.register_hook(lambda outs, ins: calls.append("second"))
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [a.sum()])
        grads = dist_autograd.get_gradients(cid)
        return {"calls": calls, "in_store": list(grads) == [t], "grad": t.grad}
