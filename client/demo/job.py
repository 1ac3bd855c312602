"""The demo job on a running cluster: a parameter server ("ps") and trainers ("trainer0", ...).

The driver (any worker; ``gradwire demo`` makes it trainer0) creates the hidden layers on the
parameter server with ``remote()``, starts every trainer's loop with ``rpc_async`` and shows one
progress bar fed by the trainers' per-epoch reports. Each trainer owns an output head, trains on
its shard of the data with distributed autograd and a DistributedOptimizer over the server's
parameters and its own, and returns its test accuracy.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import manual_seed, nn, no_grad, optim, tensor
from ..distributed import autograd as dist_autograd
from ..distributed import rpc
from ..distributed.optim import DistributedOptimizer
from ..nn import functional as F
from .data import make_spirals
from .model import HiddenLayers, forward_hidden, hidden_parameter_rrefs

__all__ = ["JobConfig", "run_job", "train_on_trainer"]


@dataclass(frozen=True)
class JobConfig:
    epochs: int = 12
    batch_size: int = 32
    lr: float = 0.03
    hidden: int = 32
    points_per_class: int = 300
    ps: str = "ps"
    device: str = "cpu"  # where the model computes ("cuda:0": hidden layers and heads on a GPU)
    profile: str = ""  # after training, one more step under profile_cluster, its trace here


_progress: dict[str, Any] = {}
_progress_lock = threading.Lock()


def report_progress(trainer: str, epoch: int, loss: float) -> None:
    """Runs on the driver: a trainer finished an epoch."""
    with _progress_lock:
        bar = _progress.get("bar")
        _progress.setdefault("loss", {})[trainer] = loss
        if bar is not None:
            bar.update(1)
            bar.set_postfix({k: f"{v:.3f}" for k, v in sorted(_progress["loss"].items())})


def _shard(
    cfg: JobConfig, index: int, count: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = make_spirals(cfg.points_per_class)
    split = int(0.8 * len(x))
    xs, ys = x[:split][index::count], y[:split][index::count]
    return xs, ys, x[split:], y[split:]


def train_on_trainer(
    cfg: JobConfig, hidden_rref: Any, index: int, count: int, driver: str
) -> dict[str, Any]:
    """Runs on trainer ``index``: the training loop; returns its test accuracy."""
    me = rpc.get_worker_info().name
    manual_seed(100 + index)
    x_np, y_np, xt_np, yt_np = _shard(cfg, index, count)
    head = nn.Linear(cfg.hidden, 3).to(cfg.device)
    params = rpc.rpc_sync(cfg.ps, hidden_parameter_rrefs, (hidden_rref,))
    params += [rpc.RRef(p) for p in head.parameters()]
    opt = DistributedOptimizer(optim.Adam, params, lr=cfg.lr)
    rng = np.random.default_rng(index)
    steps = 0
    for epoch in range(cfg.epochs):
        order = rng.permutation(len(x_np))
        total = 0.0
        for start in range(0, len(order), cfg.batch_size):
            idx = order[start : start + cfg.batch_size]
            xb, yb = tensor(x_np[idx]), tensor(y_np[idx])
            with dist_autograd.context() as cid:
                h = rpc.rpc_sync(cfg.ps, forward_hidden, (hidden_rref, xb))
                loss = F.cross_entropy(head(h.to(cfg.device)), yb.to(cfg.device))
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
            total += loss.item() * len(idx)
            steps += 1
        rpc.rpc_sync(driver, report_progress, (me, epoch + 1, total / len(order)))
    with no_grad():
        h = rpc.rpc_sync(cfg.ps, forward_hidden, (hidden_rref, tensor(xt_np)))
        pred = head(h.to(cfg.device)).argmax(dim=1).cpu().numpy()
    return {"trainer": me, "accuracy": float((pred == yt_np).mean()), "steps": steps}


def train_step_once(cfg: JobConfig, hidden_rref: Any) -> float:
    """Runs on a trainer: one training step (forward on the parameter server, a distributed
    backward, an optimizer step), as in ``train_on_trainer``; returns its loss."""
    x_np, y_np, _, _ = _shard(cfg, 0, 1)
    head = nn.Linear(cfg.hidden, 3).to(cfg.device)
    params = rpc.rpc_sync(cfg.ps, hidden_parameter_rrefs, (hidden_rref,))
    params += [rpc.RRef(p) for p in head.parameters()]
    opt = DistributedOptimizer(optim.Adam, params, lr=cfg.lr)
    xb, yb = tensor(x_np[: cfg.batch_size]), tensor(y_np[: cfg.batch_size])
    with dist_autograd.context() as cid:
        h = rpc.rpc_sync(cfg.ps, forward_hidden, (hidden_rref, xb))
        loss = F.cross_entropy(head(h.to(cfg.device)), yb.to(cfg.device))
        dist_autograd.backward(cid, [loss])
        opt.step(cid)
    return float(loss.item())


def profile_one_step(cfg: JobConfig, hidden_rref: Any, trainer: str) -> None:
    """On the driver: one more step of ``trainer`` under ``profile_cluster``; writes the
    merged trace to ``cfg.profile`` and prints the busiest events."""
    from ..distributed.profile import profile_cluster

    with profile_cluster() as prof:
        rpc.rpc_sync(trainer, train_step_once, (cfg, hidden_rref))
    prof.export_chrome_trace(cfg.profile)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12))
    print(f"profile of one training step: {cfg.profile} (open it in https://ui.perfetto.dev)")


def run_job(
    trainers: list[str], cfg: JobConfig | None = None, show_progress: bool = True
) -> dict[str, Any]:
    """Run the demo from the driver; returns accuracies and statistics (and prints them).

    Args:
        trainers: names of the trainer workers (the driver may be one of them).
        cfg: hyper-parameters.
        show_progress: draw a progress bar (tqdm) with each trainer's loss.
    """
    cfg = cfg or JobConfig()
    driver = rpc.get_worker_info().name
    started = time.monotonic()
    hidden = rpc.remote(cfg.ps, HiddenLayers, args=(cfg.hidden, 0, cfg.device))
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(
            total=cfg.epochs * len(trainers), desc="epochs", unit="epoch", dynamic_ncols=True
        )
    with _progress_lock:
        _progress["bar"] = bar
        _progress["loss"] = {}
    try:
        futures = [
            rpc.rpc_async(t, train_on_trainer, (cfg, hidden, i, len(trainers), driver))
            for i, t in enumerate(trainers)
        ]
        results = [f.wait() for f in futures]
    finally:
        if bar is not None:
            bar.close()
        with _progress_lock:
            _progress["bar"] = None
    if cfg.profile:
        profile_one_step(cfg, hidden, trainers[0])
    stats = rpc.get_debug_info()
    ps_stats = rpc.rpc_sync(cfg.ps, rpc.get_debug_info)
    summary = {
        "results": results,
        "seconds": time.monotonic() - started,
        "driver": stats,
        "ps": ps_stats,
    }
    del hidden
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    """The final lines of the demo: accuracy per trainer and RPC/RRef statistics."""
    for r in summary["results"]:
        print(f"{r['trainer']}: test accuracy {r['accuracy']:.3f} after {r['steps']} steps")
    ps, drv = summary["ps"], summary["driver"]
    print(
        f"ps served {ps.get('calls_served')} calls ({ps.get('calls_failed')} failed), "
        f"owns {ps.get('num_owner_rrefs', 0)} RRefs with {ps.get('num_forks', 0)} forks; "
        f"driver served {drv.get('calls_served')} calls; "
        f"{summary['seconds']:.1f} s in all"
    )
