"""A parameter server owning a large embedding table with sparse gradients, and trainers with
small dense heads (after PyTorch's parameter-server tutorials: RRefs, distributed autograd and
DistributedOptimizer).

    python examples/sparse_embedding_ps.py [--rows 1000000] [--dim 64] [--trainers 2]
        [--steps 16] [--bags 256] [--bag-size 20] [--tcp]
    SPARSE_PS_USE_TORCH=1 python examples/sparse_embedding_ps.py   # the same program on PyTorch

The parameter server "ps" owns ``nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)``
(1,000,000 x 64 float32 by default: 256 MB). Each trainer owns a small dense head and its data:
two batches of ``bags`` bags of ``bag_size`` random rows, with random labels of 8 classes, that
it goes through in turn. A step looks the bags up on the ps through an RRef to the table
(``table.rpc_sync().forward(indices)``), computes the loss with the head, runs a distributed
backward and steps a DistributedOptimizer (SGD) over the table and the head. The cluster runs
as local processes on loopback, with a cluster token made up for the run (``--tcp``: no Unix
socket nor shared memory, as between hosts).

What is measured, per trainer and step:

- *sent to the ps*: the gradient the trainer's backward sends back to the ps, which is the
  gradient of the looked-up bags, a dense ``(bags, dim)`` tensor (a hook on the bags reads its
  size). On gradwire the transport's counters say how many of those bytes went by shared
  memory or the bulk lane; below their 128 KiB threshold they ride inside the gradients frame,
  which the transport does not count, so the figure is the tensor's size, not the frame's.
- *table gradient*: the gradient of the table that the ps computes from it and holds in the
  distributed-autograd context, read there: a sparse COO tensor, its indices' and values'
  bytes, beside the bytes of a dense gradient of the table (rows x dim x 4).

In this layout (PyTorch's: the lookup runs where the table is) the table's sparse gradient is
made on the ps and applied there by the optimizer; it does not cross the wire itself, and a
dense gradient of the table is never made anywhere.

Exit status 0 when every trainer's loss fell (mean of its last pass through its data against
its first), every table gradient was sparse, and, of a sample of table rows, the ones no
trainer looked up are unchanged bit for bit and the ones looked up changed.
"""

import argparse
import os
import queue
import secrets
import socket
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np

if os.environ.get("SPARSE_PS_USE_TORCH"):
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
    import torch.nn.functional as F
    from torch import nn, optim
    from torch.distributed.optim import DistributedOptimizer

    FRAMEWORK = "PyTorch"
else:
    import gradwire as torch
    import gradwire.distributed.autograd as dist_autograd
    import gradwire.distributed.rpc as rpc
    import gradwire.multiprocessing as mp
    import gradwire.nn.functional as F
    from gradwire import nn, optim
    from gradwire.distributed.optim import DistributedOptimizer

    FRAMEWORK = "gradwire"

CLASSES, HIDDEN = 8, 32
DATA_BATCHES = 2  # batches of data per trainer, gone through in turn
LR = 3.0  # large: the loss is a mean over the bags, so each bag's rows get 1/bags of it
SAMPLE = 10_000  # table rows whose values are kept to check at the end


@dataclass(frozen=True)
class Config:
    rows: int = 1_000_000
    dim: int = 64
    trainers: int = 2
    steps: int = 16
    bags: int = 256
    bag_size: int = 20
    tcp: bool = False

    @property
    def dense_bytes(self) -> int:
        return self.rows * self.dim * 4


# -- on the parameter server -------------------------------------------------------------------


class EmbeddingTable(nn.Module):
    """The table: an EmbeddingBag with sparse gradients. It notes which rows were looked up and
    keeps a copy of a sample of rows, to check at the end that only those moved."""

    def __init__(self, rows, dim, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        weight = rng.random((rows, dim), dtype=np.float32)
        weight -= 0.5
        weight *= 0.2  # U(-0.1, 0.1), as the tutorials' encoders start
        self.bag = nn.EmbeddingBag(
            rows, dim, mode="sum", sparse=True, _weight=torch.from_numpy(weight)
        )
        self.looked_up = np.zeros(rows, dtype=bool)
        self.sample = rng.choice(rows, size=min(SAMPLE, rows), replace=False)
        self.sample_before = weight[self.sample].copy()

    def forward(self, indices):
        self.looked_up[indices.numpy().ravel()] = True
        return self.bag(indices)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def gradient_bytes(self, context_id):
        """The table's gradient in the context, as it is held here (not sent anywhere)."""
        grad = dist_autograd.get_gradients(context_id)[self.bag.weight]
        if not grad.is_sparse:
            return {"sparse": False, "rows": grad.shape[0], "bytes": grad.numel() * 4}
        indices, values = grad._indices(), grad._values()
        return {
            "sparse": True,
            "rows": values.shape[0],
            "indices": indices.numel() * indices.element_size(),
            "values": values.numel() * values.element_size(),
        }

    def check_rows(self):
        """How the sampled rows moved: those never looked up must be bit for bit the same."""
        with torch.no_grad():
            now = self.bag.weight[torch.from_numpy(self.sample)].numpy()
        changed = (now != self.sample_before).any(axis=1)
        touched = self.looked_up[self.sample]
        return {
            "sampled": len(self.sample),
            "untouched": int((~touched).sum()),
            "untouched_changed": int((changed & ~touched).sum()),
            "touched": int(touched.sum()),
            "touched_changed": int((changed & touched).sum()),
        }


_table = None
_table_lock = threading.Lock()
_reports = queue.Queue()


def table_on_ps(rows, dim):
    """Runs on the ps: the one table, made by the first trainer that asks."""
    global _table
    with _table_lock:
        if _table is None:
            _table = EmbeddingTable(rows, dim)
        return _table


def report(result):
    """Runs on the ps: a trainer's figures (or its error)."""
    _reports.put(result)


def collect_reports(count, timeout=600):
    """On the ps: wait for ``count`` reports; returns them in the trainers' order, or raises
    RuntimeError with the failed trainers' tracebacks."""
    results = [_reports.get(timeout=timeout) for _ in range(count)]
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError("a trainer failed:\n" + "\n".join(errors))
    return sorted(results, key=lambda r: r["trainer"])


# -- on a trainer ------------------------------------------------------------------------------


def transport_sent_bytes():
    """gradwire's counters of tensor bytes sent around the RPC frames (shared memory, bulk
    lane); PyTorch's TensorPipe has none to read."""
    if FRAMEWORK != "gradwire":
        return None
    from gradwire._wire import bulk, shm

    return shm.stats().get("sent_bytes", 0) + bulk.stats().get("sent_bytes", 0)


class Trainer:
    """A trainer's state: an RRef to the ps's table, its head, its data and the optimizer."""

    def __init__(self, cfg, seed):
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        self.table = rpc.remote("ps", table_on_ps, args=(cfg.rows, cfg.dim))
        self.head = nn.Sequential(nn.Linear(cfg.dim, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
        params = self.table.rpc_sync().parameter_rrefs()
        params += [rpc.RRef(p) for p in self.head.parameters()]
        self.opt = DistributedOptimizer(optim.SGD, params, lr=LR)
        self.data = [
            (
                torch.from_numpy(rng.integers(0, cfg.rows, (cfg.bags, cfg.bag_size))),
                torch.from_numpy(rng.integers(0, CLASSES, cfg.bags)),
            )
            for _ in range(DATA_BATCHES)
        ]

    def step(self, number, measure=True):
        """One training step on batch ``number % DATA_BATCHES``; returns its figures."""
        indices, target = self.data[number % DATA_BATCHES]
        sent = []
        figures = {}
        started = time.perf_counter()
        with dist_autograd.context() as context_id:
            bags = self.table.rpc_sync().forward(indices)
            bags.register_hook(lambda grad: sent.append(grad.numel() * grad.element_size()))
            loss = F.cross_entropy(self.head(bags), target)
            before = transport_sent_bytes()
            dist_autograd.backward(context_id, [loss])
            if before is not None:
                figures["transport"] = transport_sent_bytes() - before
            if measure:
                paused = time.perf_counter()
                figures["table_grad"] = self.table.rpc_sync().gradient_bytes(context_id)
                started += time.perf_counter() - paused  # the measuring call is not the step's
            self.opt.step(context_id)
        figures.update(seconds=time.perf_counter() - started, loss=loss.item(), sent=sum(sent))
        return figures


def train(cfg, rank):
    trainer = Trainer(cfg, seed=rank)
    steps = [trainer.step(n) for n in range(cfg.steps)]
    return {"trainer": rpc.get_worker_info().name, "steps": steps}


# -- the summary, on the ps --------------------------------------------------------------------


def summarize(cfg, results, rows):
    ok = True
    for r in results:
        name, steps = r["trainer"], r["steps"]
        losses = [s["loss"] for s in steps]
        first = statistics.mean(losses[:DATA_BATCHES])
        last = statistics.mean(losses[-DATA_BATCHES:])
        fell = last < first
        ok &= fell
        ms = statistics.median(s["seconds"] for s in steps) * 1e3
        print(
            f"{name}: loss {first:.3f} -> {last:.3f} ({'fell' if fell else 'DID NOT FALL'}); "
            f"{len(steps)} steps, {ms:.1f} ms a step (median)"
        )
        grads = [s["table_grad"] for s in steps]
        if not all(g["sparse"] for g in grads):
            ok = False
            print(f"{name}: table gradient NOT sparse: {grads[0]}")
            continue
        g = grads[len(grads) // 2]
        total = g["indices"] + g["values"]
        print(
            f"{name}: table gradient per step (on the ps): sparse COO, {g['rows']:,} rows "
            "looked up (duplicates not merged): "
            f"indices {g['indices']:,} B + values {g['values']:,} B = {total:,} B; "
            f"dense: {cfg.dense_bytes:,} B; sparse/dense {total / cfg.dense_bytes:.4f}"
        )
        sent = int(statistics.median(s["sent"] for s in steps))
        line = (
            f"{name}: sent to the ps per step: {sent:,} B (the ({cfg.bags}, {cfg.dim}) float32 "
            f"gradient of its bags); sent/dense {sent / cfg.dense_bytes:.6f}"
        )
        if "transport" in steps[0]:
            around = int(statistics.median(s["transport"] for s in steps))
            line += (
                f"; of it by shared memory or the bulk lane: {around:,} B (transport counters)"
                + ("; the rest rode in the gradients frame" if around < sent else "")
            )
        print(line)
    untouched_ok = rows["untouched_changed"] == 0
    touched_ok = rows["touched_changed"] == rows["touched"]
    ok &= untouched_ok and touched_ok
    print(
        f"ps: of {rows['sampled']:,} sampled rows, {rows['untouched']:,} never looked up: "
        f"{rows['untouched_changed']} changed ({'ok' if untouched_ok else 'WRONG'}); "
        f"{rows['touched']:,} looked up: {rows['touched_changed']:,} changed "
        f"({'ok' if touched_ok else 'WRONG'})"
    )
    print("ok" if ok else "FAILED")
    return ok


def serve(cfg):
    """The ps's main thread: wait for every trainer's figures, check the table, summarize."""
    try:
        results = collect_reports(cfg.trainers)
    except RuntimeError as exc:
        print(exc)
        return False
    return summarize(cfg, results, _table.check_rows())


# -- the local cluster -------------------------------------------------------------------------


def backend_options(port, tcp):
    if not tcp:
        extra = {}
    elif FRAMEWORK == "gradwire":
        extra = {"use_unix_socket": False, "shm_transfer": False}
    else:
        extra = {"_transports": ["uv"], "_channels": ["basic"]}
    return rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120, **extra
    )


def run_worker(rank, world_size, port, cfg):
    name = "ps" if rank == 0 else f"trainer{rank}"
    opts = backend_options(port, cfg.tcp)
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)
    ok = True
    try:
        if rank == 0:
            ok = serve(cfg)
        else:
            try:
                result = train(cfg, rank)
            except Exception:
                rpc.rpc_sync("ps", report, args=({"error": traceback.format_exc()},))
                raise
            rpc.rpc_sync("ps", report, args=(result,))
    finally:
        rpc.shutdown()
    if not ok:
        sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in vars(Config()).items():
        if isinstance(default, bool):
            parser.add_argument(f"--{flag}", action="store_true", help="TCP only")
        else:
            parser.add_argument(f"--{flag.replace('_', '-')}", type=int, default=default)
    cfg = Config(**vars(parser.parse_args(argv)))
    if cfg.steps < 2 * DATA_BATCHES:
        parser.error(f"--steps must be at least {2 * DATA_BATCHES} (two passes through the data)")
    if FRAMEWORK == "gradwire":
        os.environ.setdefault("GRADWIRE_TOKEN", secrets.token_hex(16))
    print(
        f"{FRAMEWORK}: table {cfg.rows:,} x {cfg.dim} float32 ({cfg.dense_bytes / 1e6:.1f} MB) "
        f"on the ps, {cfg.trainers} trainers, {cfg.steps} steps of {cfg.bags} bags x "
        f"{cfg.bag_size} rows{', TCP only' if cfg.tcp else ''}",
        flush=True,
    )
    world = cfg.trainers + 1
    try:
        mp.spawn(run_worker, args=(world, free_port(), cfg), nprocs=world, join=True)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        print(f"failed: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
