"""Helpers of tests/deploy: start gradwire commands as real processes, with deadlines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gradwire.distributed.rpc._testing import free_port

__all__ = ["TOKEN", "ROOT", "PY", "Proc", "start", "worker_env", "free_port", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]
#: Cluster token of the ``cluster`` fixture (conftest.py).
TOKEN = "inspect-test-token"
PY = sys.executable


def worker_env(**overrides: str) -> dict[str, str]:
    """A clean environment for a gradwire process: no inherited GRADWIRE_* or torch-style vars."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GRADWIRE_")
        and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update({"GRADWIRE_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"})
    env.update(overrides)
    return env


class Proc:
    """A started command; ``finish`` waits with a deadline and kills on expiry."""

    def __init__(self, args: Sequence[str], env: dict[str, str], cwd: Path = ROOT) -> None:
        self.args = list(args)
        self.popen = subprocess.Popen(
            self.args,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.out = ""
        self.err = ""

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.popen.send_signal(sig)

    def finish(self, timeout: float) -> int:
        """Wait at most ``timeout`` s; on expiry kill and fail with the output so far."""
        try:
            self.out, self.err = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.out, self.err = self.popen.communicate(timeout=10)
            raise AssertionError(
                f"{self.args} did not end within {timeout} s\nstdout:\n{self.out}\nstderr:\n{self.err}"
            ) from None
        return self.popen.returncode

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.communicate(timeout=10)

    @property
    def output(self) -> str:
        return f"exit {self.popen.returncode}\nstdout:\n{self.out}\nstderr:\n{self.err}"


def start(command: str, *args: str, env: dict[str, str]) -> Proc:
    """Start ``gradwire-worker`` (command "worker") or ``gradwire <command>`` with ``args``."""
    if command == "worker":
        argv = [PY, "-m", "gradwire.server", *args]
    else:
        argv = [PY, "-m", "gradwire.cli", command, *args]
    return Proc(argv, env)


def run(command: str, *args: str, env: dict[str, str], timeout: float = 30.0) -> Proc:
    """Run a gradwire command to completion (deadline ``timeout``)."""
    p = start(command, *args, env=env)
    p.finish(timeout)
    return p


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``pred`` every 0.1 s until true; fail after ``timeout`` s naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


__all__ += ["run"]
