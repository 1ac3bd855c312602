"""Autograd engine benchmark: gradwire beside PyTorch (when importable) in the same run.

    python benchmarks/autograd_bench.py [--repeat 30] [--rounds 5]

Two workloads:
- mlp:   forward + backward of a 3-layer MLP, batch 256, width 512, float32 (compute bound);
- chain: forward + backward of a chain of 1,000 elementwise ops on a (4,) tensor, which measures
         the per-node overhead of the engine (Python dispatch, graph building, the sweep).
Each round measures every workload on gradwire and then on torch (interleaved, so a shared
machine's load hits both alike); prints the median over rounds of each round's median step time,
the per-round range, and the ratio gradwire / torch. Install torch only in a separate benchmark
environment (pip install torch==2.13.0); when it is not importable here, the benchmark re-runs
itself in $GRADWIRE_TORCH_PYTHON (an interpreter with torch and gradwire) if that is set.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable

import gradwire as gw
import numpy as np
from timing import median_seconds
from torch_env import run_where_torch_is

try:  # torch is optional and never a gradwire dependency
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

BATCH, WIDTH, CHAIN = 256, 512, 1000


def _mlp_weights() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = [(WIDTH, WIDTH), (WIDTH,), (WIDTH, WIDTH), (WIDTH,), (10, WIDTH), (10,)]
    return [(rng.standard_normal(s) * 0.05).astype(np.float32) for s in shapes]


def _mlp(lib: Any) -> Callable[[], None]:
    """One forward+backward step of the MLP, for gradwire or torch (same API)."""
    ws = [lib.tensor(w, requires_grad=True) for w in _mlp_weights()]
    x = lib.randn(BATCH, WIDTH)

    def step() -> None:
        h = (x @ ws[0].t() + ws[1]).relu()
        h = (h @ ws[2].t() + ws[3]).relu()
        loss = (h @ ws[4].t() + ws[5]).sum()
        loss.backward()
        for w in ws:
            w.grad = None

    return step


def gradwire_mlp() -> Callable[[], None]:
    return _mlp(gw)


def _chain(lib: Any) -> Callable[[], None]:
    x = lib.ones(4, requires_grad=True)

    def step() -> None:
        y = x
        for _ in range(CHAIN // 2):
            y = y * 1.0001
            y = y + 0.5
        y.sum().backward()
        x.grad = None

    return step


def _fmt(seconds: list[float], scale: float, unit: str) -> str:
    med = statistics.median(seconds)
    return f"{med * scale:.2f}{unit} ({min(seconds) * scale:.2f}-{max(seconds) * scale:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="steps timed per round")
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    run_where_torch_is()
    if torch is not None:
        torch.set_num_threads(2)
    rows = [
        ("mlp fwd+bwd (256x512, 3 layers)", gradwire_mlp, (lambda: _mlp(torch)) if torch else None),
        (
            f"chain of {CHAIN} ops fwd+bwd",
            lambda: _chain(gw),
            (lambda: _chain(torch)) if torch else None,
        ),
    ]
    steps = [
        (name, gw_make(), torch_make() if torch_make else None)
        for name, gw_make, torch_make in rows
    ]
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(ns.rounds):
        for name, gw_step, torch_step in steps:
            times.setdefault((name, "gradwire"), []).append(median_seconds(gw_step, ns.repeat))
            if torch_step is not None:
                times.setdefault((name, "torch"), []).append(median_seconds(torch_step, ns.repeat))
    print(f"torch: {torch.__version__ if torch else 'not importable'}; numpy {np.__version__}")
    print(f"{ns.rounds} rounds interleaved; median (per-round range)")
    print(f"{'workload':34s} {'gradwire':>24s} {'torch':>24s} {'ratio':>6s}")
    for name, _, _ in steps:
        t_gw = times[(name, "gradwire")]
        t_t = times.get((name, "torch"))
        ratio = f"{statistics.median(t_gw) / statistics.median(t_t):6.2f}" if t_t else "   n/a"
        print(
            f"{name:34s} {_fmt(t_gw, 1e3, 'ms'):>24s} {_fmt(t_t, 1e3, 'ms') if t_t else 'n/a':>24s} {ratio}"
        )
        if name.startswith("chain"):  # each op is one graph node: its forward and backward
            per = [t / CHAIN for t in t_gw]
            print(f"{'  per node (gradwire)':34s} {_fmt(per, 1e6, 'us'):>24s}")
            if t_t:
                print(
                    f"{'  per node (torch)':34s} {_fmt([t / CHAIN for t in t_t], 1e6, 'us'):>24s}"
                )


if __name__ == "__main__":
    main()
