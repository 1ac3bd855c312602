"""Train a small MLP on a synthetic three-class spiral with gradwire's autograd (one process).

    python examples/train_local.py            # about 10 s on 2 cores; ends at >= 95% accuracy

The data set is made here (no download): three interleaved spirals in 2-D with a little noise.
"""

from __future__ import annotations

import argparse
import sys

import gradwire as gw
import numpy as np
from gradwire import nn
from gradwire.demo.data import make_spirals
from gradwire.nn import functional as F


def build_model(hidden: int = 64) -> nn.Module:
    return nn.Sequential(
        nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 3)
    )


def accuracy(model: nn.Module, x: gw.Tensor, y: gw.Tensor) -> float:
    with gw.no_grad():
        pred = model(x).argmax(dim=1)
    return float((pred == y).float().mean().item())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--target", type=float, default=0.95, help="accuracy the run must reach")
    args = parser.parse_args(argv)

    gw.manual_seed(0)
    x_np, y_np = make_spirals(400)
    split = int(0.8 * len(x_np))
    x_train, y_train = gw.tensor(x_np[:split]), gw.tensor(y_np[:split])
    x_test, y_test = gw.tensor(x_np[split:]), gw.tensor(y_np[split:])

    model = build_model()
    opt = gw.optim.Adam(model.parameters(), lr=args.lr)
    rng = np.random.default_rng(1)
    n = x_train.shape[0]
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(n)
        total = 0.0
        for start in range(0, n, args.batch_size):
            idx = gw.tensor(order[start : start + args.batch_size])
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        if epoch == 1 or epoch % 10 == 0 or epoch == args.epochs:
            print(
                f"epoch {epoch:3d}  loss {total / n:.4f}  train acc {accuracy(model, x_train, y_train):.3f}"
            )
    acc = accuracy(model, x_test, y_test)
    print(f"test accuracy {acc:.3f} (target {args.target:.2f})")
    return 0 if acc >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
