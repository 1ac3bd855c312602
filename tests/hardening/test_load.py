"""Load: 4 workers, 64 concurrent callers each, mixed calls (sync, async, nested, remote +
to_here). Zero errors, p50/p99 latency reported, memory flat.

Default run: ``GRADWIRE_LOAD_CALLS`` (2,048) calls in all. Full size (``-m slow``):
``GRADWIRE_LOAD_FULL_CALLS`` (100,000). Figures are printed (run with ``-s``) and written to
``$GRADWIRE_LOAD_REPORT`` when set (JSON).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from gradwire.distributed.rpc._testing import run_cluster

from . import load_bodies

WORKERS, CALLERS = 4, 64
#: Allowed growth of a worker's resident memory between the warm-up and the end of the run.
RSS_SLACK_KIB = 64 * 1024


def _load(total: int, timeout: float) -> list[dict[str, Any]]:
    per_caller = max(4, total // (WORKERS * CALLERS))
    results = run_cluster(
        WORKERS,
        load_bodies.load,
        CALLERS,
        per_caller,
        int(os.environ.get("GRADWIRE_LOAD_SEED", "7")),
        timeout=timeout,
        options={"rpc_timeout": 120.0, "num_worker_threads": 16},
    )
    figures = [r.value for r in results]
    summary = {
        "workers": WORKERS,
        "callers_per_worker": CALLERS,
        "calls": sum(f["calls"] for f in figures),
        "errors": sum(f["num_errors"] for f in figures),
        "per_worker": figures,
    }
    print(json.dumps(summary, indent=1, default=str))
    if os.environ.get("GRADWIRE_LOAD_REPORT"):
        with open(os.environ["GRADWIRE_LOAD_REPORT"], "w") as f:
            json.dump(summary, f, indent=1, default=str)
    for f in figures:
        assert f["num_errors"] == 0, f["errors"]
        growth = f["rss_end_kib"] - f["rss_warm_kib"]
        assert growth < RSS_SLACK_KIB, f"RSS grew by {growth} KiB under load"
    assert summary["calls"] >= total * 0.9
    return figures


@pytest.mark.slow  # a soak/load run: with the others, pytest -m slow
def test_load_short() -> None:
    _load(
        int(os.environ.get("GRADWIRE_LOAD_CALLS", "2048")),
        timeout=float(os.environ.get("GRADWIRE_LOAD_TIMEOUT", "240")),
    )


@pytest.mark.slow
@pytest.mark.timeout(3900)  # beyond the suite's default 300 s
def test_load_full() -> None:
    _load(int(os.environ.get("GRADWIRE_LOAD_FULL_CALLS", "100000")), timeout=3600)
