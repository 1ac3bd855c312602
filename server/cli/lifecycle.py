"""Joining and leaving a cluster from a CLI process, shared by gradwire-worker and gradwire run.

Exit codes of every gradwire process command: 0 clean; 1 the job or the shutdown failed; 2 bad
configuration; 3 could not join; 128+N stopped by signal N before the work was done.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .signals import EXIT_SIGNALLED, Interrupted, StopSignals
from .worker_config import WorkerConfig

__all__ = [
    "Background",
    "abandon",
    "join",
    "wait_for",
    "EXIT_OK",
    "EXIT_FAILURE",
    "EXIT_CONFIG",
    "EXIT_JOIN",
]

log = logging.getLogger("gradwire.worker")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_JOIN = 3


class Background:
    """Runs a blocking call in a daemon thread so the main thread stays free for signals."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._fn = fn
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
        finally:
            self.done.set()


def abandon(code: int, message: str) -> None:
    """Log ``message`` and end the process now with ``code`` (no cleanup)."""
    # The shutdown thread is blocked in a gRPC wait that cannot be cancelled from outside; a
    # process exit is the only way to honour the deadline.
    log.error("%s", message)
    logging.shutdown()
    os._exit(code)


def join(cfg: WorkerConfig, stops: StopSignals, prog: str) -> int | None:
    """Start the agent and rendezvous; a signal meanwhile aborts.

    Args:
        cfg: the checked configuration.
        stops: installed signal handlers.
        prog: command name for error messages.

    Returns:
        None once joined, else the exit code to leave with.
    """
    from gradwire.distributed import rpc
    from gradwire.errors import RpcInitError

    try:
        with stops.raising():
            rpc.init_rpc(cfg.name, cfg.rank, cfg.world_size, cfg.backend_options())
    except Interrupted as exc:
        log.warning("%s before the cluster formed; exiting", exc)
        return EXIT_SIGNALLED[exc.signum]
    except RpcInitError as exc:
        print(f"{prog}: cannot join the cluster: {exc}", file=sys.stderr)
        return EXIT_JOIN
    from gradwire._runtime import agent as _agent

    me = _agent.current()
    log.info(
        "worker %s (rank %d of %s) joined session %s, serving on %s",
        me.name,
        me.rank,
        me.world_size or "a dynamic group",
        me.session,
        me.address,
    )
    return None


def wait_for(
    task: Background, what: str, stops: StopSignals, grace: float, deadline: float | None = None
) -> int:
    """Wait for ``task`` in the main thread, which keeps handling signals.

    Args:
        task: the blocking call running in the background.
        what: what it does, for logs.
        stops: the installed signal handlers.
        grace: seconds still granted after a stop signal.
        deadline: ``time.monotonic()`` at which to give up (None: only after a signal).

    Returns:
        EXIT_OK or EXIT_FAILURE (the task raised); past the deadline the process exits with
        EXIT_FAILURE instead of returning.
    """
    while not task.done.wait(0.2):
        if deadline is None and stops.event.is_set():
            log.info(
                "signal %s: waiting up to %.0f s for the other workers at the shutdown barrier",
                stops.signum,
                grace,
            )
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() > deadline:
            abandon(EXIT_FAILURE, f"{what} did not finish in time; exiting without it")
    if task.error is not None:
        log.error("%s failed: %s", what, task.error)
        return EXIT_FAILURE
    log.info("%s: done", what)
    return EXIT_OK
