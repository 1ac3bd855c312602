"""Model-layer benchmark: gradwire beside PyTorch's CPU build in the same run, rounds interleaved.

    python benchmarks/nn_bench.py [--rounds 3] [--repeat 7] [--threads N]

Run it in an environment that has both gradwire and torch (gradwire never depends on torch):
``python3 -m venv /tmp/bench && /tmp/bench/bin/pip install -e . torch==2.13.0``. Without torch
only gradwire's times are printed. Workloads (float32, forward + backward):

- conv2d:   one Conv2d layer, 64x32x28x28 input, 32->64 channels, 3x3, padding 1;
- cnn step: two 3x3 conv layers (1->32->64) with relu and max_pool2d, a Linear, cross_entropy
            and an SGD step, batch 64, 28x28 (issue 21's "small CNN step");
- lstm step: Embedding(10000, 256) -> 2-layer LSTM(256) -> Linear(256, 10000) -> cross_entropy
            and an SGD step, sequence 35, batch 20 (issue 21's LSTM training step).

Each round times every workload on gradwire, then on torch (median of ``--repeat`` runs after
two warm-ups); the table shows the median over rounds and the spread (min-max) of the rounds,
and the ratio gradwire / torch of the medians (below 1: gradwire faster). ``--threads N`` sets
the BLAS threads of both sides (environment variables before NumPy loads, and
``torch.set_num_threads``); the default leaves both on their defaults.
"""

from __future__ import annotations

import argparse
import os
import sys

if "--threads" in sys.argv:  # must happen before NumPy (and its BLAS) is imported
    _n = sys.argv[sys.argv.index("--threads") + 1]
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = _n

import statistics  # noqa: E402
from typing import Any, Callable  # noqa: E402

import gradwire as gw  # noqa: E402
import numpy as np  # noqa: E402
from timing import median_seconds

try:  # torch is optional and never a gradwire dependency
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

VOCAB, EMBED, HIDDEN, LAYERS, BATCH, SEQ = 10000, 256, 256, 2, 20, 35


def conv2d(lib: Any) -> Callable[[], None]:
    lib.manual_seed(0)
    conv = lib.nn.Conv2d(32, 64, 3, padding=1)
    x = lib.randn(64, 32, 28, 28, requires_grad=True)

    def step() -> None:
        conv(x).sum().backward()

    return step


def cnn_step(lib: Any) -> Callable[[], None]:
    nn, F = lib.nn, lib.nn.functional
    lib.manual_seed(0)

    class Net(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(1, 32, 3, padding=1)
            self.c2 = nn.Conv2d(32, 64, 3, padding=1)
            self.fc = nn.Linear(64 * 7 * 7, 10)

        def forward(self, x: Any) -> Any:
            x = F.max_pool2d(F.relu(self.c1(x)), 2)
            x = F.max_pool2d(F.relu(self.c2(x)), 2)
            return self.fc(lib.flatten(x, 1))

    net = Net()
    opt = lib.optim.SGD(net.parameters(), lr=0.01)
    xb = lib.randn(64, 1, 28, 28)
    yb = lib.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(net(xb), yb).backward()
        opt.step()

    return step


def lstm_step(lib: Any) -> Callable[[], None]:
    nn = lib.nn
    lib.manual_seed(0)
    emb, rnn, dec = (
        nn.Embedding(VOCAB, EMBED),
        nn.LSTM(EMBED, HIDDEN, LAYERS),
        nn.Linear(HIDDEN, VOCAB),
    )
    params = [*emb.parameters(), *rnn.parameters(), *dec.parameters()]
    opt = lib.optim.SGD(params, lr=0.1)
    rng = np.random.default_rng(0)
    x = lib.tensor(rng.integers(0, VOCAB, (SEQ, BATCH)))
    y = lib.tensor(rng.integers(0, VOCAB, (SEQ * BATCH,)))
    state = (lib.zeros(LAYERS, BATCH, HIDDEN), lib.zeros(LAYERS, BATCH, HIDDEN))

    def step() -> None:
        opt.zero_grad()
        out, _ = rnn(emb(x), state)
        lib.nn.functional.cross_entropy(dec(out.reshape(-1, HIDDEN)), y).backward()
        opt.step()

    return step


WORKLOADS = {"conv2d fwd+bwd": conv2d, "cnn step": cnn_step, "lstm step": lstm_step}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="BLAS threads of both sides")
    ns = parser.parse_args()
    if torch is not None and ns.threads:
        torch.set_num_threads(ns.threads)
    libs = {"gradwire": gw, **({"torch": torch} if torch is not None else {})}
    steps = {(w, name): make(lib) for w, make in WORKLOADS.items() for name, lib in libs.items()}
    times: dict[tuple[str, str], list[float]] = {key: [] for key in steps}
    for _ in range(ns.rounds):
        for w in WORKLOADS:
            for name in libs:
                times[(w, name)].append(median_seconds(steps[(w, name)], ns.repeat, warmup=2) * 1e3)
    print(
        f"torch {torch.__version__ if torch else 'not importable'}; numpy {np.__version__}; "
        f"threads {ns.threads or 'default'}; {ns.rounds} rounds x median of {ns.repeat}"
    )
    print(
        f"{'workload':16s} {'gradwire ms (spread)':>24s} {'torch ms (spread)':>24s} {'ratio':>6s}"
    )
    for w in WORKLOADS:
        cells, medians = [], []
        for name in ("gradwire", "torch"):
            ts = times.get((w, name))
            if not ts:
                cells.append(f"{'-':>24s}")
                continue
            medians.append(statistics.median(ts))
            cells.append(f"{medians[-1]:9.1f} ({min(ts):6.1f}-{max(ts):6.1f})")
        ratio = f"{medians[0] / medians[1]:6.2f}" if len(medians) == 2 else ""
        print(f"{w:16s} {cells[0]:>24s} {cells[1]:>24s} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
