"""Nothing of gradwire's is left in /dev/shm after normal exit, exceptions and kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gwmp_helpers import gradwire_shm_files, wait_dead, wait_manager_exit

SCENARIOS = str(Path(__file__).with_name("gwmp_scenarios.py"))
STRATEGIES = ["file_descriptor", "file_system"]


def _read(proc: subprocess.Popen, tag: str) -> list[str]:
    while True:
        line = proc.stdout.readline()
        assert line, f"scenario ended before printing {tag}: {proc.stderr.read()}"
        if line.startswith(tag):
            return line.split()[1:]


def _no_leftovers(token: str, before: set[str]) -> None:
    if token != "-":
        wait_manager_exit(token)
        assert not [n for n in os.listdir("/dev/shm") if token in n]
    assert gradwire_shm_files() - before == set()


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("mode", ["normal", "exception", "kill_child"])
def test_no_leak_after_exit(strategy, mode, script_env):
    before = gradwire_shm_files()
    proc = subprocess.Popen(
        [sys.executable, SCENARIOS, strategy, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=script_env,
        text=True,
    )
    try:
        (token,) = _read(proc, "TOKEN")
        assert (token == "-") == (strategy == "file_descriptor")
        _read(proc, "READY")
        if mode != "normal":
            failed = _read(proc, "FAILED")
            expected = "ProcessRaisedException" if mode == "exception" else "ProcessExitedException"
            assert failed == [expected, "1"]
        (live,) = _read(proc, "LIVE")
        if strategy == "file_system":
            assert int(live) >= 1  # the parent's tensor is still mapped
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
    _no_leftovers(token, before)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_leak_after_the_parent_raises(strategy, script_env):
    before = gradwire_shm_files()
    out = subprocess.run(
        [sys.executable, SCENARIOS, strategy, "parent_raises"],
        env=script_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "parent failed on purpose" in out.stderr
    token = out.stdout.split()[1]
    live = int(out.stdout.split("LIVE")[1].split()[0])
    assert live >= (1 if strategy == "file_system" else 0)
    _no_leftovers(token, before)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_leak_after_parent_is_killed(strategy, script_env):
    before = gradwire_shm_files()
    proc = subprocess.Popen(
        [sys.executable, SCENARIOS, strategy, "kill_parent"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=script_env,
        text=True,
    )
    try:
        (token,) = _read(proc, "TOKEN")
        children = [int(p) for p in _read(proc, "READY")]
        (live,) = _read(proc, "LIVE")
        if strategy == "file_system":
            assert int(live) >= 3  # the parent's tensor and one segment per child
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert all(wait_dead(pid, 20) for pid in children), "children outlived the parent"
    finally:
        proc.kill()
        proc.wait()
    _no_leftovers(token, before)
