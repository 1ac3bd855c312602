"""Autograd engine benchmark: gradwire beside PyTorch (when importable) in the same run.

    python benchmarks/autograd_bench.py [--repeat 30]

Two workloads:
- mlp:   forward + backward of a 3-layer MLP, batch 256, width 512, float32 (compute bound);
- chain: forward + backward of a chain of 1,000 elementwise ops on a (4,) tensor, which measures
         the per-node overhead of the engine (Python dispatch, graph building, the sweep).
Prints the median time per step and, where torch imports, the ratio gradwire / torch.
Install torch only in a separate benchmark environment: pip install torch==2.13.0.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import gradwire as gw
import numpy as np
from timing import median_seconds

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    ns = parser.parse_args()
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
    print(f"torch: {torch.__version__ if torch else 'not importable'}; numpy {np.__version__}")
    print(f"{'workload':36s} {'gradwire':>12s} {'torch':>12s} {'ratio':>8s}")
    for name, gw_make, torch_make in rows:
        t_gw = median_seconds(gw_make(), ns.repeat)
        t_t = median_seconds(torch_make(), ns.repeat) if torch_make else None
        ratio = f"{t_gw / t_t:8.2f}" if t_t else "     n/a"
        t_ts = f"{t_t * 1e3:10.2f}ms" if t_t else "         n/a"
        print(f"{name:36s} {t_gw * 1e3:10.2f}ms {t_ts} {ratio}")
        if name.startswith("chain"):
            # Each op is one graph node: forward op + its backward, per node.
            print(f"{'  per node (gradwire)':36s} {t_gw / CHAIN * 1e6:10.2f}us")
            if t_t:
                print(f"{'  per node (torch)':36s} {t_t / CHAIN * 1e6:10.2f}us")


if __name__ == "__main__":
    main()
