"""What every benchmark here times with: the median wall time of a call after warm-up runs.

The benchmarks run as scripts (``python benchmarks/x.py``), so their folder is on ``sys.path``
and they import this module as ``timing``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

__all__ = ["median_seconds"]


def median_seconds(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> float:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` times; the median in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
