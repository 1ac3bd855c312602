"""``gradwire-worker`` (also ``python -m gradwire.server``): join a cluster and serve.

Exit codes: 0 left cleanly; 1 the job or the shutdown failed (a peer vanished, the shutdown
barrier timed out); 2 bad configuration; 3 could not join (rendezvous failed or timed out,
address in use); 128+N stopped by signal N before the cluster formed.

Example:
    $ GRADWIRE_NAME=ps GRADWIRE_RANK=0 GRADWIRE_WORLD_SIZE=3 GRADWIRE_LISTEN=0.0.0.0:29500 \\
      GRADWIRE_MASTER_ADDR=ps GRADWIRE_TOKEN_FILE=/run/secrets/token gradwire-worker
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from gradwire._runtime import agent as _agent

from .lifecycle import EXIT_CONFIG, Background, abandon, join, wait_for
from .observe import observe
from .settings import ConfigError
from .signals import EXIT_SIGNALLED, StopSignals
from .worker_config import (
    NO_TIMEOUT_SECONDS,
    WorkerConfig,
    add_worker_arguments,
    setup_logging,
    worker_config,
)

__all__ = ["main", "build_parser", "serve", "console_main"]

log = logging.getLogger("gradwire.worker")


def build_parser(prog: str = "gradwire-worker") -> argparse.ArgumentParser:
    """The gradwire-worker argument parser (every flag also reads a GRADWIRE_* variable)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Join a gradwire cluster as a worker and serve calls until the job ends "
        "(--until job, the default) or until SIGTERM/SIGINT (--until signal).",
        epilog="Exit codes: 0 clean, 1 job/shutdown failed, 2 bad configuration, 3 could not join.",
    )
    add_worker_arguments(parser, serve=True)
    return parser


def serve(cfg: WorkerConfig, prog: str = "gradwire-worker") -> int:
    """Join, serve, leave as ``cfg.until`` says.

    Args:
        cfg: the checked configuration.
        prog: command name for error messages.

    Returns:
        The process exit code (see the module docstring).
    """
    from gradwire.distributed import rpc

    stops = StopSignals(
        on_second=lambda s: abandon(EXIT_SIGNALLED[s], "second stop signal: exiting at once")
    ).install()
    code = observe(cfg, prog)  # before the join: a scrape sees the worker joining too
    if code is not None:
        return code
    code = join(cfg, stops, prog)
    if code is not None:
        return code
    if cfg.until == "job" and cfg.world_size is not None:
        # As a PyTorch worker: enter the shutdown barrier at once and keep serving until every
        # worker (the driver last) arrived there.
        timeout = cfg.job_timeout or NO_TIMEOUT_SECONDS
        _agent.current("gradwire-worker").serving_until_job = True  # health: SERVING meanwhile
        task = Background(lambda: rpc.shutdown(graceful=True, timeout=timeout), "gw-leave")
        return wait_for(task, "leaving with the job", stops, cfg.shutdown_timeout)
    # --until signal, or a member of a dynamic group (no job end to wait for): serve until
    # SIGTERM, then leave (a dynamic member leaves the group without waiting for the others).
    while not stops.event.wait(1.0):
        pass
    log.info("stop signal %s: graceful shutdown", stops.signum)
    task = Background(
        lambda: rpc.shutdown(graceful=True, timeout=cfg.shutdown_timeout), "gw-shutdown"
    )
    limit = time.monotonic() + cfg.shutdown_timeout + 10.0
    return wait_for(task, "graceful shutdown", stops, cfg.shutdown_timeout, limit)


def main(argv: Sequence[str] | None = None, prog: str = "gradwire-worker") -> int:
    """Entry point of ``gradwire-worker``.

    Args:
        argv: arguments (default ``sys.argv[1:]``).
        prog: command name for messages.

    Returns:
        The exit code.
    """
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        cfg = worker_config(args)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(cfg.log_level)
    return serve(cfg, prog)


def console_main() -> None:
    """``[project.scripts]`` target: exit with :func:`main`'s code."""
    sys.exit(main())
