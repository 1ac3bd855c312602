"""Worker bodies for test_inflight_calls: a backward started while calls of its context are
still in flight waits for their answers, or fails naming them."""

from __future__ import annotations

import time
from typing import Any

import gradwire as gw
import gradwire.distributed.autograd as dist_autograd
from gradwire.distributed import rpc

from .bodies import _leaf


def slow_add(a: gw.Tensor, b: gw.Tensor, seconds: float = 1.0) -> gw.Tensor:
    """a + b, answered after ``seconds``: the caller's backward starts before the answer."""
    time.sleep(seconds)
    return a + b


def raises(a: gw.Tensor) -> gw.Tensor:
    raise ValueError("refused on purpose")


def fan_out(x: gw.Tensor) -> gw.Tensor:
    """Runs on worker1: starts a slow call to worker2 with ``x`` and answers without waiting
    for it, so worker1 joins the pass with that call still in flight."""
    rpc.remote("worker2", slow_add, (x, x))
    return x * 2


def _exact(ctx_id: int, x: gw.Tensor) -> list[float]:
    grads = dist_autograd.get_gradients(ctx_id)
    assert x in grads, "the leaf's gradient is missing"
    return grads[x].tolist()


def in_flight(rank: int, world_size: int) -> Any:
    """remote() and rpc_async() whose answers arrive after backward() started."""
    if rank != 0:
        return None
    x = _leaf(40, 3)
    out: dict[str, Any] = {"x": x.tolist()}
    with dist_autograd.context() as cid:
        rref = rpc.remote("worker1", slow_add, (x, x))  # never fetched
        started = time.monotonic()
        dist_autograd.backward(cid, [(x * x).sum()])
        out["remote_waited"] = time.monotonic() - started
        out["remote_acked"] = rref._get_future().done()
        out["remote_grad"] = _exact(cid, x)
    with dist_autograd.context() as cid:
        fut = rpc.rpc_async("worker1", slow_add, (x, x))  # its result is never used
        dist_autograd.backward(cid, [(x * x).sum()])
        out["async_done"] = fut.done()
        out["async_grad"] = _exact(cid, x)
    with dist_autograd.context() as cid:
        # The answer already arrived: nothing to wait for.
        rpc.remote("worker1", slow_add, (x, x, 0.0))._get_future().wait()
        dist_autograd.backward(cid, [(x * x).sum()])
        out["acked_grad"] = _exact(cid, x)
    return out


def joined_worker_waits(rank: int, world_size: int) -> Any:
    """worker1's own call to worker2 is still in flight when worker1 joins the pass."""
    if rank != 0:
        return None
    x = _leaf(41, 3)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", fan_out, (x,))
        dist_autograd.backward(cid, [y.sum()])
        return {"x": x.tolist(), "grad": _exact(cid, x)}


def _error_of(fn: Any) -> tuple[str, str, float]:
    started = time.monotonic()
    try:
        fn()
    except RuntimeError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - started
    return "", "no error", time.monotonic() - started


def failed_calls(rank: int, world_size: int) -> Any:
    """A call that times out or fails makes the backward fail naming it, never hang."""
    if rank != 0:
        return None
    x = _leaf(42, 3)
    out: dict[str, Any] = {}
    with dist_autograd.context() as cid:
        # Its ack comes after the context is left: the owner answers it all the same (else the
        # caller retries it until shutdown, which then hangs).
        rpc.remote("worker1", slow_add, (x, x, 5.0), timeout=0.5)
        out["timeout"] = _error_of(lambda: dist_autograd.backward(cid, [(x * x).sum()]))
    with dist_autograd.context() as cid:
        fut = rpc.rpc_async("worker1", raises, (x,))
        out["failed"] = _error_of(lambda: dist_autograd.backward(cid, [(x * x).sum()]))
        # Failed before the pass (the caller saw it): the next pass fails the same way.
        out["failed_seen"] = _error_of(fut.wait)[0]
        out["failed_again"] = _error_of(lambda: dist_autograd.backward(cid, [(x * x).sum()]))
    with dist_autograd.context() as cid:
        # A call that sent nothing requiring grad leaves no gradient missing: neither its
        # failure nor its slowness concerns the pass.
        rpc.rpc_async("worker1", raises, (gw.ones(3),))
        slow = rpc.rpc_async("worker1", slow_add, (gw.ones(3), gw.ones(3), 3.0))
        time.sleep(0.2)
        dist_autograd.backward(cid, [(x * x).sum()])
        out["no_grad_call_grad"] = _exact(cid, x)
        out["no_grad_call_waited"] = slow.done()
        slow.wait()
    out["x"] = x.tolist()
    return out
