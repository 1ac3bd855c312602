"""Make a child process die with its parent, so a killed parent leaves no orphans behind."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing.connection import wait

__all__ = ["die_with_parent"]

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Arrange for this process to be killed when its parent process exits, however it exits.

    Two mechanisms, so either one suffices: on Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; and
    everywhere a daemon thread blocked on the parent's sentinel (a pipe whose write end only the
    parent holds: it reads end-of-file when the parent is gone) that then kills this process.
    """
    parent = multiprocessing.parent_process()
    # Under forkserver the OS parent is the fork server, not the process that asked for us:
    # the death signal would follow the wrong process, so only the watch thread applies there.
    if sys.platform.startswith("linux") and parent is not None and os.getppid() == parent.pid:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except OSError:
            log.debug("prctl unavailable; relying on the parent watch thread")
        if os.getppid() != parent.pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    if parent is not None and parent.sentinel is not None:
        threading.Thread(
            target=_watch, args=(parent.sentinel,), name="gradwire-parent-watch", daemon=True
        ).start()


def _watch(sentinel: int) -> None:
    wait([sentinel])
    log.warning("parent process exited; terminating child %d", os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
