"""Run tests, each on its own ``world_size`` processes, with a hard deadline per test.

Every rank is a ``python -m torchsuite.worker`` process started in a session of its own; at the
deadline, or shortly after a rank fails, the processes still running are killed by their ids
(the process group each one leads, so helpers it spawned die with it), never by name. A test
passes when no rank raised, every rank exited and rank 0 exited 0 (PyTorch's
``MultiProcessTestCase`` rule); it is skipped when rank 0 skipped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .worker import ERROR_EXIT, SKIP_EXIT

__all__ = ["Outcome", "run_test", "WORLD_SIZE"]

WORLD_SIZE = 4
_AFTER_FAILURE = 3.0  # seconds the other ranks get once one rank failed


@dataclass
class Outcome:
    """How one test went: ``status`` is passed, failed, skipped or timeout."""

    test: str
    status: str
    seconds: float
    detail: str = ""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this process leads (its own id)
        except ProcessLookupError:
            pass
    proc.wait()


def _tail(path: Path, limit: int = 6000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-limit:]


def run_test(test: str, module: str, env: dict[str, str], deadline: float) -> Outcome:
    """Run ``Class.test_name`` of ``module`` as ``WORLD_SIZE`` processes within ``deadline`` s."""
    class_name, test_name = test.split(".")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchsuite-") as scratch:
        env = {**env, "TORCHSUITE_PORT": str(_free_port()), "TORCHSUITE_SCRATCH": scratch}
        procs = []
        logs = []
        for rank in range(WORLD_SIZE):
            log = Path(scratch) / f"rank{rank}.log"
            logs.append(log)
            with open(log, "wb") as out:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "torchsuite.worker",
                            module,
                            class_name,
                            test_name,
                            str(rank),
                        ],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        end = start + deadline
        timed_out = False
        try:
            while True:
                running = [p.poll() is None for p in procs]  # poll() every one: it sets returncode
                if not any(running):
                    break
                failed = any(p.returncode == ERROR_EXIT for p in procs)
                if failed:
                    end = min(end, time.monotonic() + _AFTER_FAILURE)
                if time.monotonic() > end:
                    timed_out = not failed
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                _kill(p)
        seconds = time.monotonic() - start
        codes = [p.returncode for p in procs]
        errored = [r for r, p in enumerate(procs) if p.returncode == ERROR_EXIT]
        detail = "".join(
            f"--- rank {r} (exit {codes[r]}):\n{_tail(logs[r])}"
            for r in range(WORLD_SIZE)
            if _tail(logs[r])
        )
        if errored:
            return Outcome(test, "failed", seconds, detail)
        if timed_out:
            return Outcome(
                test, "timeout", seconds, f"deadline {deadline:.0f} s, exit codes {codes}\n{detail}"
            )
        if codes[0] == SKIP_EXIT:
            return Outcome(test, "skipped", seconds, detail)
        if codes[0] != 0:
            return Outcome(test, "failed", seconds, f"rank 0 exit code {codes[0]}\n{detail}")
        return Outcome(test, "passed", seconds)
