"""deploy/netns/cluster.sh for real: workers in their own network namespaces, a job, a cut link.

Skips with the script's reason where namespaces cannot be made (exit 77: not root, no iproute2,
no permission).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .procs import ROOT

SCRIPT = ROOT / "deploy" / "netns" / "cluster.sh"


def run_script(*args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        ["bash", str(SCRIPT), "--python", sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if p.returncode == 77:
        reason = re.search(r"SKIP: (.*)", p.stdout)
        pytest.skip(f"deploy/netns/cluster.sh: {reason.group(1) if reason else p.stdout}")
    return p


def leftovers(out: str) -> list[str]:
    prefix = re.search(r"namespaces (gw[0-9a-f]{4})-0\.\.", out)
    assert prefix, out
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line for line in listed.splitlines() if line.startswith(prefix.group(1))]


@pytest.mark.slow  # a long fault run (~25 s): a cluster across namespaces, a cut link
def test_job_across_namespaces_and_a_cut_link_reported_within_the_timeout() -> None:
    p = run_script("--workers", "3", "--rpc-timeout", "3")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "ping_all: 3 workers answered: w1, w2, w3" in out
    # Between namespaces (other "hosts"): the fast lane and the bulk lane carried the round.
    assert "ping_all: fast lane to 3 of 3 workers, bulk lane sent 3 and took 3 tensors" in out
    assert "job: PASS (driver and every worker exited 0)" in out
    latency = re.search(r"w3's failure reported ([0-9.]+) s after the cut", out)
    assert latency and float(latency.group(1)) <= 3 + 5, out
    assert re.search(
        r"3\s+w3\s+10\.\d+\.\d+\.13:29500\s+READY", out
    )  # inspect --all before the cut
    assert leftovers(out) == []


def test_everything_is_removed_when_a_check_fails() -> None:
    p = run_script("--workers", "1", "--no-cut", "--job", "gradwire.no_such_job:main")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAIL: the job exited with 2" in p.stdout
    assert "cannot import 'gradwire.no_such_job'" in p.stdout  # the driver's log, shown on failure
    assert leftovers(p.stdout) == []
