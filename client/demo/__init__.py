"""``gradwire demo``: distributed training on a local cluster, with nothing to set up.

    gradwire demo [--epochs N] [--trainers K] [--device cuda:0]

Starts a parameter server and trainers as processes on loopback (a cluster token is made up
for the run), trains a small classifier whose hidden layers live on the parameter server and
whose output heads live on the trainers, with distributed autograd and DistributedOptimizer,
and prints a progress bar, the final accuracy and RPC/RRef statistics. Exit status 0 when every
trainer reaches the target accuracy.

On an existing cluster (``gradwire run``), ``gradwire.demo:job`` runs the same job from the
driver with workers named "ps" and "trainer0", "trainer1", ...

Elastic mode (:mod:`gradwire.demo.elastic`): ``gradwire run gradwire.demo.elastic:job`` hosts a
dynamic group; trainers (``python -m gradwire.demo.member``, compose's scalable ``trainer``
service) join and leave while it runs and take part from the next epoch.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
from typing import Any

from .job import JobConfig, print_summary, run_job

__all__ = ["main", "job"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, cfg: JobConfig, target: float) -> None:
    from ..distributed import rpc

    names = ["ps"] + [f"trainer{i}" for i in range(world_size - 1)]
    # The demo is a program shipped inside gradwire: it opens the policy for its own modules,
    # as any program whose code lives in an installed package does (docs/security.md).
    opts = rpc.GrpcRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}",
        rpc_timeout=120,
        callable_allow=("gradwire.demo.*",),
    )
    rpc.init_rpc(names[rank], rank, world_size, opts)
    failed = False
    try:
        if rank == 1:
            summary = run_job(names[1:], cfg)
            print_summary(summary)
            low = [r for r in summary["results"] if r["accuracy"] < target]
            if low:
                print(f"accuracy below the target {target:.2f}: {low}")
                failed = True
    finally:
        rpc.shutdown()
    if failed:
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``gradwire demo``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="gradwire demo", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=JobConfig.epochs)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument(
        "--target", type=float, default=0.9, help="test accuracy every trainer must reach"
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the model computes: cpu (default) or cuda:N (needs gradwire[cuda] and a GPU)",
    )
    parser.add_argument(
        "--profile",
        metavar="TRACE.json",
        default="",
        help="after training, profile one more step on every worker and write the merged "
        "Chrome/Perfetto trace here (docs/observability.md)",
    )
    ns = parser.parse_args(argv)
    if ns.trainers < 1:
        parser.error("--trainers must be at least 1")
    from .._backend import Device, cuda_unavailable_reason, is_cuda_available

    try:
        device = Device(ns.device)
    except (TypeError, ValueError) as exc:
        parser.error(f"--device {ns.device!r}: {exc}")
    if device.type == "cuda" and not is_cuda_available():
        parser.error(
            f"--device {ns.device}: no CUDA device can be used here: "
            f"{cuda_unavailable_reason()}; or leave --device at cpu"
        )
    from .. import multiprocessing as gmp

    os.environ.setdefault("GRADWIRE_TOKEN", secrets.token_hex(16))
    cfg = JobConfig(
        epochs=ns.epochs,
        device=str(device),
        profile=os.path.abspath(ns.profile) if ns.profile else "",
    )
    world = ns.trainers + 1
    print(
        f"gradwire demo: parameter server + {ns.trainers} trainers on loopback, {cfg.epochs} epochs"
        + (f", model on {cfg.device}" if cfg.device != "cpu" else "")
    )
    try:
        gmp.spawn(_worker, args=(world, _free_port(), cfg, ns.target), nprocs=world, join=True)
    except gmp.ProcessRaisedException as exc:
        print(f"gradwire demo failed on process {exc.error_index}:\n{exc}")
        return 1
    except gmp.ProcessExitedException as exc:
        print(f"gradwire demo: process {exc.error_index} exited with {exc.exit_code}")
        return 1
    return 0


def job(*args: Any) -> None:
    """Driver entry point on an existing cluster (``gradwire run``): workers "ps", "trainer0"..."""
    from ..distributed import rpc

    info = rpc.get_debug_info()
    names = [p["name"] for p in info["peers"]]
    trainers = sorted(n for n in names if n.startswith("trainer"))
    if "ps" not in names or not trainers:
        raise RuntimeError(
            f"the demo needs workers named 'ps' and 'trainer0'...; this cluster has {names}"
        )
    print_summary(run_job(trainers))
