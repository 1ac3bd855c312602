"""Descriptors stay bounded: 10,000 tensors received and kept under a 512-descriptor limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCENARIOS = str(Path(__file__).with_name("gwmp_scenarios.py"))


@pytest.mark.slow  # a load run: 10,000 of them (pytest -m slow)
@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_ten_thousand_tensors_do_not_exhaust_descriptors(strategy, script_env):
    # The scenario lowers RLIMIT_NOFILE to 512 before anything opens (its sender child inherits
    # it) and keeps every received tensor alive: holding one descriptor per tensor would fail.
    out = subprocess.run(
        [sys.executable, SCENARIOS, strategy, "many", "10000"],
        env=script_env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    fields = out.stdout.split()
    assert fields[:2] == ["MANY", "10000"], out.stdout
    assert int(fields[fields.index("fds") + 1]) < 64  # the receiver holds none per tensor
    assert fields[fields.index("exit") + 1] == "0"
    assert "Too many open files" not in out.stderr
