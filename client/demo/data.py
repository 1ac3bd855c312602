"""The demo's synthetic data set: three interleaved spirals in 2-D (made here, no download)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["make_spirals"]


def make_spirals(
    n_per_class: int, classes: int = 3, noise: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(points float32 (N, 2), labels int64 (N,)), shuffled."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(classes):
        r = np.linspace(0.1, 1.0, n_per_class)
        start = c * 2 * math.pi / classes
        theta = np.linspace(start, start + 5.0, n_per_class) + rng.normal(0, noise, n_per_class)
        xs.append(np.stack([r * np.sin(theta), r * np.cos(theta)], axis=1))
        ys.append(np.full(n_per_class, c))
    x = np.concatenate(xs).astype(np.float32)
    y = np.concatenate(ys).astype(np.int64)
    perm = rng.permutation(len(x))
    return x[perm], y[perm]
