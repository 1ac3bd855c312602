"""GPU benchmark: device-to-device rpc_sync echo, with and without device maps, and the demo
model on cuda:0. Needs CuPy and a CUDA device (``pip install -e '.[cuda]'``).

    python benchmarks/gpu_bench.py [--sizes 1,16,128] [--reps 5]

Two workers on this machine. Echo: worker0 sends a float32 tensor of 1 / 16 / 128 MiB on
cuda:0 and gets it back; "mapped" uses ``set_device_map("worker1", {0: 1})`` (or ``{0: 0}``
with one GPU), so the tensor lands on the callee's GPU and comes back on cuda:0 by the inverse
map; "via cpu" moves it to the host before sending and back to cuda:0 after. Reported: median
seconds per round trip and GB/s of payload (2 * size / time). Demo: the demo's hidden layers on
cuda:0, forward and backward on a batch, median step time.

Without a GPU it exits with status 2 and says so. ``GRADWIRE_FAKE_CUPY=1`` with
tests/fake_cupy/site on PYTHONPATH runs it on the TEST-ONLY CuPy stand-in (a smoke test of the
script; its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def echo(t: Any) -> Any:
    return t


def _body(rank: int, world_size: int, sizes: list[int], reps: int, mapped: bool) -> Any:
    import gradwire as gw
    from gradwire.distributed import rpc

    if rank != 0:
        return None
    rows = []
    for mib in sizes:
        x = gw.ones(mib << 18, dtype=gw.float32, device="cuda:0")  # mib MiB of float32
        times = []
        for _ in range(reps + 1):  # the first call warms the channel and the pools
            started = time.perf_counter()
            if mapped:
                back = rpc.rpc_sync("worker1", echo, (x,))
            else:
                back = rpc.rpc_sync("worker1", echo, (x.cpu(),)).to("cuda:0")
            times.append(time.perf_counter() - started)
        assert str(back.device) == "cuda:0", back.device
        t = statistics.median(times[1:])
        rows.append((mib, t, 2 * (mib << 20) / t / 1e9))
    return rows


def _demo_step(reps: int) -> float:
    import gradwire as gw
    from gradwire.demo.model import HiddenLayers

    model = HiddenLayers(32)
    for p in model.parameters():
        p.data = p.data.to("cuda:0")
    x = gw.randn(256, 2, device="cuda:0")
    times = []
    for _ in range(reps + 1):
        started = time.perf_counter()
        for p in model.parameters():
            p.grad = None
        model(x).sum().backward()
        times.append(time.perf_counter() - started)
    assert all(str(p.grad.device) == "cuda:0" for p in model.parameters())
    return statistics.median(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,16,128", help="MiB per tensor, comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    ns = parser.parse_args()
    import gradwire as gw

    if not gw.is_cuda_available():
        print(
            "gpu_bench: no CUDA device (CuPy missing or no GPU visible); install gradwire[cuda] "
            "on a machine with an NVIDIA GPU. Nothing measured.",
            file=sys.stderr,
        )
        return 2
    from gradwire._runtime.cluster.device_maps import local_cuda_device_count
    from gradwire.distributed.rpc._testing import run_cluster

    fake = getattr(sys.modules.get("cupy"), "IS_FAKE", False)
    if fake:
        print("gpu_bench: running on the TEST-ONLY CuPy stand-in: the numbers mean nothing")
    sizes = [int(s) for s in ns.sizes.split(",")]
    peer = 1 if local_cuda_device_count() > 1 else 0
    env = {"GRADWIRE_FAKE_CUPY": "1"} if fake else {}
    for mapped in (True, False):
        options = {"device_maps": {"worker1": {0: peer}}} if mapped else {}
        results = run_cluster(
            2, _body, sizes, ns.reps, mapped, rank_options={0: options}, env=env, timeout=600
        )
        label = f"mapped cuda:0->cuda:{peer}" if mapped else "via cpu"
        for mib, t, gbps in results[0].value:
            print(f"echo {mib:4d} MiB {label:22s} {t * 1e3:9.2f} ms  {gbps:6.2f} GB/s")
    print(f"demo model on cuda:0: {_demo_step(ns.reps) * 1e3:.2f} ms per forward+backward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
