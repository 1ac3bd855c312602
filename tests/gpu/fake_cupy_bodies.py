"""Worker bodies of the device-map tests, run under the TEST-ONLY CuPy stand-in (no GPU).

Importing this module installs the stand-in (tests/fake_cupy) as ``cupy``: spawned workers
import it to unpickle their body, before gradwire looks for CuPy.
"""

from __future__ import annotations

import sys
from typing import Any

import fake_cupy

if "pytest" not in sys.modules:
    # Only in a spawned worker, which imports this module to unpickle its body (before its
    # multiprocessing bootstrap, so parent_process() cannot tell yet). The test process imports
    # it too, at collection, and must keep the real ``cupy`` lookup: there the
    # ``fake_cupy_module`` fixture installs the stand-in for one test at a time.
    fake_cupy.install()

import gradwire as gw  # noqa: E402
import gradwire.distributed.autograd as dist_autograd  # noqa: E402
from gradwire.distributed import rpc  # noqa: E402


def echo(t: gw.Tensor) -> tuple[str, gw.Tensor]:
    """Where the argument landed on the callee, and the argument itself sent back."""
    return str(t.device), t


def plus_one(t: gw.Tensor) -> gw.Tensor:
    return t + 1


def to_cuda0(t: gw.Tensor) -> gw.Tensor:
    return t.to("cuda:0")


def square_sum(t: gw.Tensor) -> gw.Tensor:
    return (t * t).sum()


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def maps_both_ways(rank: int, world_size: int) -> dict[str, Any]:
    """worker0 maps {cuda:0 -> cuda:1, cuda:1 -> cuda:0} to worker1; worker1 has no map."""
    if rank != 0:
        return {}
    out: dict[str, Any] = {"fake": gw.is_cuda_available()}
    for dev in ("cuda:0", "cuda:1", "cpu"):
        x = gw.arange(4.0, device=dev) if dev == "cpu" else gw.arange(4.0).to(dev)
        where, back = rpc.rpc_sync("worker1", echo, (x,))
        out[dev] = (where, str(back.device), back.cpu().tolist())
        rref = rpc.remote("worker1", plus_one, (x,))
        value = rref.to_here()
        out[f"remote {dev}"] = (str(value.device), value.cpu().tolist())
    return out


def autograd_on_devices(rank: int, world_size: int) -> dict[str, Any]:
    """Dist-autograd gradients of leaves on cuda:0 and cuda:1 (worker0 maps 0->1, 1->0)."""
    if rank != 0:
        return {}
    out: dict[str, Any] = {}
    for dev in ("cuda:0", "cuda:1"):
        w = gw.tensor([1.0, 2.0, 3.0], device=dev, requires_grad=True)
        with dist_autograd.context() as cid:
            loss = rpc.rpc_sync("worker1", square_sum, (w,))
            dist_autograd.backward(cid, [loss])
            g = dist_autograd.get_gradients(cid)[w]
            out[dev] = (str(loss.device), str(g.device), g.cpu().tolist(), type(g._data).__module__)
    return out


def missing_entries(rank: int, world_size: int) -> dict[str, Any]:
    """worker0 maps only cuda:0 -> cuda:1; worker1 has no map at all."""
    x0 = gw.ones(2).to("cuda:0")
    x1 = gw.ones(2).to("cuda:1")
    if rank == 1:  # worker1 calls worker0 with a CUDA tensor: no map of its own
        return {"request_without_map": _error(lambda: rpc.rpc_sync("worker0", echo, (x0,)))}
    return {
        "request_unmapped_device": _error(lambda: rpc.rpc_sync("worker1", echo, (x1,))),
        # The callee's result is on its cuda:0, which the inverse map {cuda:1: cuda:0} lacks.
        "reply_unmapped_device": _error(lambda: rpc.rpc_sync("worker1", to_cuda0, (x0,))),
        "cpu_untouched": str(rpc.rpc_sync("worker1", echo, (gw.ones(2),))[1].device),
    }


def nothing(rank: int, world_size: int) -> None:
    return None
