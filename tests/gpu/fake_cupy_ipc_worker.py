"""Consumer process of the CUDA IPC test, under the TEST-ONLY CuPy stand-in (no GPU)."""

from __future__ import annotations

import sys
from typing import Any

import fake_cupy

if "pytest" not in sys.modules:
    # Only in a spawned worker, which imports this module to unpickle its body (before its
    # multiprocessing bootstrap, so parent_process() cannot tell yet). The test process imports
    # it too, at collection, and must keep the real ``cupy`` lookup: there the
    # ``fake_cupy_module`` fixture installs the stand-in for one test at a time.
    fake_cupy.install()


def consume(q: Any, report: Any) -> None:
    """Read a CUDA tensor from the queue, report it, write into it, then drop it."""
    import gc

    t = q.get()
    report.put((str(t.device), float(t.sum()), type(t._data).__module__))
    t.fill_(2.0)  # through gradwire, which makes the tensor's device current
    del t
    gc.collect()
    report.put("released")
