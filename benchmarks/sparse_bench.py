"""One training step of ``examples/sparse_embedding_ps.py``, gradwire beside PyTorch, interleaved
in rounds in one run.

    python benchmarks/sparse_bench.py [--rounds 3] [--steps 30] [--warmup 5] [--trainers 1,2]
        [--rows 1000000] [--dim 64] [--bags 256] [--bag-size 20]
        [--contestants gradwire,gradwire-tcp,torch,torch-tcp] [--json out.json]

Contestants (each a whole cluster of the example: a parameter server owning the
EmbeddingBag(rows, dim, sparse=True) table and its trainers, on this host):
  gradwire       defaults: Unix socket and shared memory between the processes
  gradwire-tcp   use_unix_socket=False, shm_transfer=False (what containers and hosts get)
  torch          TensorPipe's defaults (shm transport, cma channel on one host)
  torch-tcp      TensorPipe with the "uv" (TCP) transport and the "basic" channel only

Both frameworks run the example's own code (``SPARSE_PS_USE_TORCH=1`` switches its imports to
PyTorch). The PyTorch side runs in its own processes under ``$GRADWIRE_TORCH_PYTHON`` when torch
does not import here; it needs torch and NumPy only, not gradwire.

Measures, per contestant and number of trainers:
  step           wall time of one trainer's step: the lookup on the ps (rpc_sync through the
                 table's RRef), the head and loss, the distributed backward and the
                 DistributedOptimizer (SGD) step; every trainer steps at once, each step timed
                 on its trainer; median and p90 over every step of every round
  sent to ps     bytes of the gradient a trainer's backward sends to the ps: the dense
                 (bags, dim) gradient of the looked-up bags (a hook on them reads its size)
  table grad     bytes of the table's sparse gradient that the ps holds in the context
                 (indices + values), read there; it does not cross the wire
gradwire's transport counters (shared memory, bulk lane) are read around each backward; a
gradient below their 128 KiB threshold rides in the gradients frame, which they do not count.

One cluster runs at a time (PyTorch's default transport busy-polls while idle, which would load
a 2-core machine under the others' measures); each round starts every contestant's cluster
afresh in turn. Every process computes on one BLAS/OpenMP thread.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import sparse_embedding_ps as ex  # noqa: E402 - after the thread settings and the path
from torch_env import have_torch  # noqa: E402

ALL = ("gradwire", "gradwire-tcp", "torch", "torch-tcp")
PAIRS = (("gradwire", "torch"), ("gradwire-tcp", "torch-tcp"))

# -- inside one contestant's cluster ----------------------------------------------------------

_barrier: threading.Barrier | None = None
_barrier_lock = threading.Lock()


def start_together(parties: int) -> None:
    """Runs on the ps: returns when ``parties`` trainers have called it."""
    global _barrier
    with _barrier_lock:
        if _barrier is None:
            _barrier = threading.Barrier(parties)
    _barrier.wait(timeout=300)


def measure(cfg: ex.Config, rank: int, warmup: int, steps: int) -> dict[str, Any]:
    """A trainer: warm up, one step measuring the gradient's bytes, then ``steps`` timed."""
    trainer = ex.Trainer(cfg, seed=rank)
    for n in range(warmup):
        trainer.step(n, measure=False)
    figures = trainer.step(warmup, measure=True)
    ex.rpc.rpc_sync("ps", start_together, args=(cfg.trainers,))
    seconds = [trainer.step(warmup + 1 + n, measure=False)["seconds"] for n in range(steps)]
    return {
        "trainer": ex.rpc.get_worker_info().name,
        "seconds": seconds,
        "sent": figures["sent"],
        "transport": figures.get("transport"),
        "table_grad": figures["table_grad"],
    }


def bench_worker(
    rank: int, world_size: int, port: int, cfg: ex.Config, warmup: int, steps: int, out: str
) -> None:
    opts = ex.backend_options(port, cfg.tcp)
    name = "ps" if rank == 0 else f"trainer{rank}"
    ex.rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)
    try:
        if rank == 0:
            Path(out).write_text(json.dumps(ex.collect_reports(cfg.trainers)))
        else:
            try:
                result = measure(cfg, rank, warmup, steps)
            except Exception:
                import traceback

                ex.rpc.rpc_sync("ps", ex.report, args=({"error": traceback.format_exc()},))
                raise
            ex.rpc.rpc_sync("ps", ex.report, args=(result,))
    finally:
        ex.rpc.shutdown()


def run_cluster(ns: argparse.Namespace) -> int:
    """``--cluster``: one contestant's cluster, in this interpreter; its figures as JSON on the
    last line of stdout."""
    cfg = ex.Config(
        rows=ns.rows,
        dim=ns.dim,
        trainers=ns.cluster_trainers,
        bags=ns.bags,
        bag_size=ns.bag_size,
        tcp=ns.cluster.endswith("-tcp"),
    )
    if ex.FRAMEWORK == "gradwire":
        os.environ.setdefault("GRADWIRE_TOKEN", secrets.token_hex(16))
    world = cfg.trainers + 1
    with tempfile.TemporaryDirectory(prefix="sparse-bench-") as tmp:
        out = str(Path(tmp) / "figures.json")
        ex.mp.spawn(
            bench_worker,
            args=(world, ex.free_port(), cfg, ns.warmup, ns.steps, out),
            nprocs=world,
            join=True,
        )
        print(Path(out).read_text())
    return 0


# -- the orchestrator -------------------------------------------------------------------------


def _torch_python() -> str | None:
    if have_torch():
        return sys.executable
    other = os.environ.get("GRADWIRE_TORCH_PYTHON")
    if other:
        probe = subprocess.run([other, "-c", "import torch.distributed.rpc, numpy"])
        if probe.returncode == 0:
            return os.path.abspath(other)
    return None


def _one_cluster(
    python: str, contestant: str, trainers: int, ns: argparse.Namespace
) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env.pop("SPARSE_PS_USE_TORCH", None)
    if contestant.startswith("torch"):
        env["SPARSE_PS_USE_TORCH"] = "1"
    args = [python, __file__, "--cluster", contestant, "--cluster-trainers", str(trainers)]
    for flag in ("rows", "dim", "bags", "bag_size", "steps", "warmup"):
        args += [f"--{flag.replace('_', '-')}", str(getattr(ns, flag))]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{contestant}: exit {done.returncode}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _report(
    names: list[str],
    trainer_counts: list[int],
    runs: dict[tuple[str, int], list[list[dict[str, Any]]]],
    errors: dict[tuple[str, int], str],
    ns: argparse.Namespace,
) -> None:
    pairs = [(g, t) for g, t in PAIRS if g in names and t in names]
    header = ["measure", *names, *(f"{g}/{t}" for g, t in pairs)]
    table: list[list[str]] = []
    dense = ns.rows * ns.dim * 4

    def add(label: str, cell: Any, value: Any) -> None:
        row = [label]
        values = {}
        for c in names:
            values[c] = value(c)
            if values[c] is not None:
                row.append(cell(c, values[c]))
            else:
                row.append("error" if any(key[0] == c for key in errors) else "-")
        for g, t in pairs:
            a, b = values.get(g), values.get(t)
            row.append(f"{a / b:.2f}" if a and b else "-")
        table.append(row)

    for k in trainer_counts:

        def samples(c: str, k: int = k) -> list[float]:
            return [s for rnd in runs.get((c, k), []) for r in rnd for s in r["seconds"]]

        def round_medians(c: str, k: int = k) -> list[float]:
            return [
                statistics.median([s for r in rnd for s in r["seconds"]])
                for rnd in runs.get((c, k), [])
            ]

        def median_cell(c: str, v: float, k: int = k) -> str:
            per_round = round_medians(c, k)
            short = (
                f", {len(per_round)} of {ns.rounds} rounds" if len(per_round) < ns.rounds else ""
            )
            return f"{_ms(v)} ({_ms(min(per_round))}-{_ms(max(per_round))}{short})"

        trainers = f"{k} trainer{'s' if k > 1 else ''}"
        add(
            f"step, {trainers}: median (per-round medians)",
            median_cell,
            lambda c, k=k: statistics.median(samples(c, k)) if samples(c, k) else None,
        )
        add(
            f"step, {trainers}: p90",
            lambda c, v: _ms(v),
            lambda c, k=k: _p90(samples(c, k)) if len(samples(c, k)) > 1 else None,
        )

    def first(c: str) -> dict[str, Any] | None:
        for k in trainer_counts:
            if runs.get((c, k)):
                return runs[(c, k)][0][0]
        return None

    def grad_bytes(c: str) -> int | None:
        r = first(c)
        g = r["table_grad"] if r else None
        if not g:
            return None
        return g["indices"] + g["values"] if g["sparse"] else g["bytes"]

    add(
        "sent to the ps per step (B)", lambda c, v: f"{v:,}", lambda c: (first(c) or {}).get("sent")
    )
    add(
        "  of it by shm / bulk lane (gradwire's counters, B)",
        lambda c, v: f"{v:,}",
        lambda c: (first(c) or {}).get("transport"),
    )
    add("table gradient on the ps per step, sparse (B)", lambda c, v: f"{v:,}", grad_bytes)
    add("dense gradient of the table (B)", lambda c, v: f"{v:,}", lambda c: dense)
    print(
        f"sparse_bench: {ns.rounds} rounds interleaved, {ns.steps} timed steps per trainer and "
        f"round after {ns.warmup} warm-up steps; table {ns.rows:,} x {ns.dim} float32, "
        f"{ns.bags} bags x {ns.bag_size} rows a step; ratios gradwire/torch (below 1: gradwire "
        "faster or smaller)"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in table:
        print("| " + " | ".join(row) + " |")
    for (c, k), e in errors.items():
        print(f"error: {c}, {k} trainers: {e}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per trainer and round")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--trainers", default="1,2", help="cluster sizes to measure")
    parser.add_argument("--rows", type=int, default=ex.Config.rows)
    parser.add_argument("--dim", type=int, default=ex.Config.dim)
    parser.add_argument("--bags", type=int, default=ex.Config.bags)
    parser.add_argument("--bag-size", type=int, default=ex.Config.bag_size)
    parser.add_argument("--contestants", default=",".join(ALL))
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--cluster", choices=ALL, help=argparse.SUPPRESS)
    parser.add_argument("--cluster-trainers", type=int, default=1, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.cluster:
        return run_cluster(ns)
    wanted = [c.strip() for c in ns.contestants.split(",") if c.strip()]
    unknown = set(wanted) - set(ALL)
    if unknown:
        parser.error(f"unknown contestants {sorted(unknown)}; choose from {', '.join(ALL)}")
    torch_python = _torch_python()
    if torch_python is None and any(c.startswith("torch") for c in wanted):
        print("torch: not importable here nor in $GRADWIRE_TORCH_PYTHON; its columns are skipped")
        wanted = [c for c in wanted if not c.startswith("torch")]
    trainer_counts = [int(k) for k in ns.trainers.split(",")]
    print(
        f"load average {os.getloadavg()[0]:.2f}; torch in {torch_python}",
        file=sys.stderr,
        flush=True,
    )
    runs: dict[tuple[str, int], list[list[dict[str, Any]]]] = {}
    errors: dict[tuple[str, int], str] = {}
    for r in range(ns.rounds):
        for k in trainer_counts:
            for c in wanted:
                if (c, k) in errors:
                    continue
                python = torch_python if c.startswith("torch") else sys.executable
                try:
                    runs.setdefault((c, k), []).append(_one_cluster(python, c, k, ns))
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                    errors[(c, k)] = str(exc)
        print(
            f"round {r + 1}/{ns.rounds} done; load average {os.getloadavg()[0]:.2f}",
            file=sys.stderr,
            flush=True,
        )
    _report(wanted, trainer_counts, runs, errors, ns)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(
                {
                    "argv": sys.argv[1:],
                    "runs": {f"{c} | {k}": v for (c, k), v in runs.items()},
                    "errors": {f"{c} | {k}": e for (c, k), e in errors.items()},
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
