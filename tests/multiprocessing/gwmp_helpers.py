"""Process and /dev/shm helpers shared by the gradwire.multiprocessing tests."""

from __future__ import annotations

import os
import select
import time


def gradwire_shm_files() -> set[str]:
    """Names in /dev/shm that gradwire made."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("gradwire")}


def wait_dead(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie counts), waiting at most ``timeout`` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def manager_pids(token: str) -> list[int]:
    """Pids of the shared-memory manager(s) running with ``token``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"_shm_manager.py" in cmd and token.encode() in cmd:
                pids.append(int(entry))
    return pids


def wait_manager_exit(token: str, timeout: float = 20) -> None:
    """Block until the manager ``token`` exited (it removes leftovers just before)."""
    for pid in manager_pids(token):
        assert wait_dead(pid, timeout), f"shared-memory manager {pid} did not exit"


def wait_gone(path: str, timeout: float = 10) -> bool:
    """True once ``path`` does not exist (the manager works asynchronously; poll briefly)."""
    deadline = time.monotonic() + timeout
    while os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
