"""The elastic demo: trainers join and leave while the job runs (a dynamic group).

The driver is rank 0 of a group started without a world size (``gradwire run`` without
``--world-size``); it is also the parameter server: the whole classifier lives there. Each
epoch it takes the trainers that are members at that moment (workers whose name starts with
"trainer"), splits the epoch's shuffled training set among them and runs the epoch on each with
``rpc_async``. Each trainer trains its share with distributed autograd and a
DistributedOptimizer over the server's parameters. So a trainer that joins during an epoch takes
part from the next one, and a trainer that leaves stops after its current batch (its epoch does
not count). For every epoch the job prints which trainers took part::

    epoch 3/20: 4 trainers took part: trainer-0a1b, trainer-2c3d, ... (loss 0.412)

and at the end the test accuracy and the trainers of every epoch. Run it as:

    gradwire run gradwire.demo.elastic:job [--epochs N] [--min-trainers K] [--epoch-seconds S]
    python -m gradwire.demo.member          # each trainer (docker compose: the trainer service)
"""

from __future__ import annotations

import argparse
import gc
import logging
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import nn, no_grad, optim, tensor
from .._tensor import Tensor
from ..distributed import autograd as dist_autograd
from ..distributed import rpc
from ..distributed.optim import DistributedOptimizer
from ..errors import RpcError, WorkerDepartedError, WorkerUnavailableError
from ..nn import functional as F
from .data import make_spirals
from .model import HiddenLayers

__all__ = [
    "ElasticConfig",
    "Classifier",
    "run_elastic",
    "train_epoch",
    "end_job",
    "stop_training",
    "job",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ElasticConfig:
    epochs: int = 20
    batch_size: int = 32
    lr: float = 0.03
    hidden: int = 32
    points_per_class: int = 300
    min_trainers: int = 1  # the job starts once this many trainers joined
    wait_seconds: float = 300.0  # for min_trainers (and whenever no trainer is left)
    epoch_seconds: float = 0.0  # an epoch lasts at least this long (time to watch scaling)
    trainer_prefix: str = "trainer"


class Classifier(nn.Module):
    """The whole model, on the parameter server: HiddenLayers and an output head."""

    def __init__(self, hidden: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.hidden = HiddenLayers(hidden, seed)
        self.head = nn.Linear(hidden, 3)

    def forward(self, x: Tensor) -> Tensor:
        # Trainers update the head concurrently (Hogwild), as HiddenLayers explains.
        return F.linear(self.hidden(x), self.head.weight.clone(), self.head.bias.clone())


def forward_model(model_rref: Any, x: Tensor) -> Tensor:
    """Runs on the parameter server: the classifier's forward pass."""
    return model_rref.local_value()(x)


def model_parameter_rrefs(model_rref: Any) -> list[Any]:
    """Runs on the parameter server: RRefs of the classifier's parameters."""
    return [rpc.RRef(p) for p in model_rref.local_value().parameters()]


def evaluate(model_rref: Any, x: Tensor, y: Tensor) -> float:
    """Runs on the parameter server: accuracy on (x, y)."""
    with no_grad():
        pred = model_rref.local_value()(x).argmax(dim=1).numpy()
    return float((pred == y.numpy()).mean())


# -- the trainer's side ---------------------------------------------------------------------------

#: Per job (by its id): this trainer's DistributedOptimizer, kept from epoch to epoch.
_optimizers: dict[str, DistributedOptimizer] = {}
_lock = threading.Lock()
#: Set when this trainer leaves: a running epoch stops after its current batch.
_leaving = threading.Event()
_active = 0  # epochs running here
_idle = threading.Condition(_lock)


def _optimizer(cfg: ElasticConfig, ps: str, model_rref: Any, job_id: str) -> DistributedOptimizer:
    with _lock:
        opt = _optimizers.get(job_id)
    if opt is None:
        params = rpc.rpc_sync(ps, model_parameter_rrefs, (model_rref,))
        opt = DistributedOptimizer(optim.Adam, params, lr=cfg.lr)
        with _lock:
            opt = _optimizers.setdefault(job_id, opt)
    return opt


def _data(cfg: ElasticConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = make_spirals(cfg.points_per_class)
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def train_epoch(
    cfg: ElasticConfig, ps: str, model_rref: Any, job_id: str, epoch: int, index: int, count: int
) -> dict[str, Any]:
    """Runs on a trainer: its share (``index`` of ``count``) of epoch ``epoch``.

    Returns:
        ``{"trainer", "epoch", "completed", "batches", "loss"}``; ``completed`` is False when
        the trainer began to leave during the epoch (it stopped after its current batch).
    """
    global _active
    me = rpc.get_worker_info().name
    with _lock:
        if _leaving.is_set():
            return {"trainer": me, "epoch": epoch, "completed": False, "batches": 0, "loss": 0.0}
        _active += 1
    try:
        opt = _optimizer(cfg, ps, model_rref, job_id)
        x_np, y_np, _, _ = _data(cfg)
        order = np.random.default_rng(epoch).permutation(len(x_np))[index::count]
        total, batches = 0.0, 0
        for start in range(0, len(order), cfg.batch_size):
            if _leaving.is_set():
                break
            idx = order[start : start + cfg.batch_size]
            with dist_autograd.context() as cid:
                logits = rpc.rpc_sync(ps, forward_model, (model_rref, tensor(x_np[idx])))
                loss = F.cross_entropy(logits, tensor(y_np[idx]))
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
            total += loss.item() * len(idx)
            batches += 1
        completed = not _leaving.is_set()
        loss_mean = total / max(1, len(order))
        return {
            "trainer": me,
            "epoch": epoch,
            "completed": completed,
            "batches": batches,
            "loss": loss_mean,
        }
    finally:
        with _lock:
            _active -= 1
            _idle.notify_all()


def end_job(job_id: str) -> None:
    """Runs on a trainer: the job ended; drop its optimizer (and the RRefs it holds)."""
    with _lock:
        _optimizers.pop(job_id, None)
    gc.collect()


def stop_training(timeout: float) -> None:
    """On a trainer that leaves: running epochs stop after their current batch; wait for them
    (up to ``timeout`` s) and drop every optimizer, so leaving releases the server's RRefs."""
    _leaving.set()
    with _lock:
        _idle.wait_for(lambda: _active == 0, timeout)
        _optimizers.clear()
    gc.collect()


# -- the driver -----------------------------------------------------------------------------------


def _trainers(cfg: ElasticConfig, gone: set[str]) -> list[str]:
    names = (w.name for w in rpc.get_worker_infos())
    return sorted(n for n in names if n.startswith(cfg.trainer_prefix) and n not in gone)


def _wait_for_trainers(cfg: ElasticConfig, count: int, gone: set[str]) -> list[str]:
    deadline = time.monotonic() + cfg.wait_seconds
    while len(trainers := _trainers(cfg, gone)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the elastic job waited {cfg.wait_seconds:.0f} s for {count} trainer(s) "
                f"(workers named {cfg.trainer_prefix}*); members: "
                f"{[w.name for w in rpc.get_worker_infos()]}"
            )
        time.sleep(0.2)
    return trainers


def run_elastic(
    cfg: ElasticConfig | None = None, show: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the elastic job from the driver, which is also the parameter server.

    Args:
        cfg: hyper-parameters and pacing.
        show: where the per-epoch lines go.

    Returns:
        ``{"epochs": [{"epoch", "trainers", "left", "loss"}], "accuracy", "trainers",
        "seconds"}``: ``trainers`` of an epoch are those that completed their share of it;
        ``left`` maps the others to why they did not.

    Raises:
        RuntimeError: no trainer joined within ``cfg.wait_seconds``.
    """
    cfg = cfg or ElasticConfig()
    ps = rpc.get_worker_info().name
    started = time.monotonic()
    job_id = secrets.token_hex(4)
    model = rpc.remote(ps, Classifier, args=(cfg.hidden,))
    gone: set[str] = set()  # lost trainers: not asked again
    epochs: list[dict[str, Any]] = []
    _wait_for_trainers(cfg, cfg.min_trainers, gone)
    try:
        for epoch in range(1, cfg.epochs + 1):
            began = time.monotonic()
            trainers = _wait_for_trainers(cfg, 1, gone)
            futures = [
                (
                    t,
                    rpc.rpc_async(
                        t, train_epoch, (cfg, ps, model, job_id, epoch, i, len(trainers))
                    ),
                )
                for i, t in enumerate(trainers)
            ]
            took_part, left, losses = [], {}, []
            for t, fut in futures:
                try:
                    r = fut.wait()
                except WorkerDepartedError:
                    left[t] = "departed"
                    continue
                except WorkerUnavailableError as exc:
                    gone.add(t)
                    left[t] = f"lost: {exc}"
                    continue
                except RpcError as exc:  # e.g. it was shutting down: count it out
                    left[t] = f"{type(exc).__name__}: {exc}"
                    continue
                if r["completed"]:
                    took_part.append(t)
                    losses.append(r["loss"])
                else:
                    left[t] = "left during the epoch"
            loss = float(np.mean(losses)) if losses else float("nan")
            epochs.append({"epoch": epoch, "trainers": took_part, "left": left, "loss": loss})
            line = (
                f"epoch {epoch}/{cfg.epochs}: {len(took_part)} trainers took part: "
                f"{', '.join(took_part) or '-'} (loss {loss:.3f})"
            )
            if left:
                line += "; not counted: " + ", ".join(f"{t} ({why})" for t, why in left.items())
            show(line)
            time.sleep(max(0.0, cfg.epoch_seconds - (time.monotonic() - began)))
        _, _, xt, yt = _data(cfg)
        accuracy = rpc.rpc_sync(ps, evaluate, (model, tensor(xt), tensor(yt)))
    finally:
        for t in _trainers(cfg, gone):
            try:
                rpc.rpc_sync(t, end_job, (job_id,), timeout=30)
            except RpcError as exc:
                log.info("could not end the job on %s: %s", t, exc)
        del model
        gc.collect()
    every = sorted({t for e in epochs for t in e["trainers"]})
    show(f"elastic job: test accuracy {accuracy:.3f} after {cfg.epochs} epochs")
    show(f"trainers that took part: {len(every)}: {', '.join(every)}")
    per_epoch = "; ".join(f"{e['epoch']}: {len(e['trainers'])}" for e in epochs)
    show(f"trainers per epoch: {per_epoch}")
    return {
        "epochs": epochs,
        "accuracy": accuracy,
        "trainers": every,
        "seconds": time.monotonic() - started,
    }


def _parser() -> argparse.ArgumentParser:
    d = ElasticConfig()
    p = argparse.ArgumentParser(
        prog="gradwire run gradwire.demo.elastic:job",
        description="The elastic demo job: trainers that join take part from the next epoch.",
    )
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--min-trainers", type=int, default=d.min_trainers)
    p.add_argument("--wait-seconds", type=float, default=d.wait_seconds)
    p.add_argument(
        "--epoch-seconds",
        type=float,
        default=d.epoch_seconds,
        help="each epoch lasts at least this long (time to scale while you watch)",
    )
    p.add_argument("--target", type=float, default=0.0, help="test accuracy to reach (exit 1)")
    return p


def job() -> int:
    """``gradwire run gradwire.demo.elastic:job [options]``: the driver's entry point."""
    ns = _parser().parse_args(sys.argv[1:])
    cfg = ElasticConfig(
        epochs=ns.epochs,
        min_trainers=ns.min_trainers,
        wait_seconds=ns.wait_seconds,
        epoch_seconds=ns.epoch_seconds,
    )
    summary = run_elastic(cfg, show=lambda line: print(line, flush=True))
    return 0 if summary["accuracy"] >= ns.target else 1
