"""``python -m gradwire.demo.member``: a trainer of the elastic demo (a dynamic group member).

The same flags and GRADWIRE_* variables as ``gradwire-worker``, without a world size, with a
default that suits replicas of one service (``docker compose up --scale trainer=N``): the name
defaults to ``trainer-<host name>`` (a container's host name is its id). Without a rank, the
group's host assigns it the lowest free one at join (as ``gradwire-worker`` without ``--rank``).

It serves until SIGTERM/SIGINT or until the group's host (rank 0, the elastic job's driver)
leaves; then it stops its running epoch after the current batch and leaves the group. Exit codes
are gradwire-worker's.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Sequence

from ..errors import RpcInitError

__all__ = ["main"]

log = logging.getLogger("gradwire.demo.member")


def main(argv: Sequence[str] | None = None) -> int:
    """Join the dynamic group, serve, leave; returns the exit code."""
    from gradwire.distributed import rpc
    from gradwire.server.cli.lifecycle import EXIT_CONFIG, EXIT_JOIN, Background, abandon, wait_for
    from gradwire.server.cli.settings import ConfigError
    from gradwire.server.cli.signals import EXIT_SIGNALLED, Interrupted, StopSignals
    from gradwire.server.cli.worker import build_parser
    from gradwire.server.cli.worker_config import setup_logging, worker_config

    from . import elastic

    prog = "gradwire.demo.member"
    args = build_parser(prog).parse_args(argv)
    env = dict(os.environ)
    env.setdefault("GRADWIRE_NAME", f"trainer-{socket.gethostname()}")
    try:
        cfg = worker_config(args, env)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if cfg.world_size is not None:
        print(f"{prog}: error: a member joins a dynamic group: no world size", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(cfg.log_level)
    stops = StopSignals(
        on_second=lambda s: abandon(EXIT_SIGNALLED[s], "second stop signal: exiting at once")
    ).install()
    try:
        with stops.raising():
            rpc.init_rpc(cfg.name, cfg.rank, None, cfg.backend_options())
    except Interrupted as exc:
        log.warning("%s before joining; exiting", exc)
        return EXIT_SIGNALLED[exc.signum]
    except RpcInitError as exc:
        print(f"{prog}: cannot join the group: {exc}", file=sys.stderr)
        return EXIT_JOIN
    log.info("%s joined the group with rank %d", cfg.name, rpc.get_worker_info().id)
    while not stops.event.wait(1.0):
        if all(w.id != 0 for w in rpc.get_worker_infos()):
            log.info("the group's host left (the job ended): leaving too")
            break
    elastic.stop_training(timeout=min(10.0, cfg.shutdown_timeout))
    task = Background(lambda: rpc.shutdown(graceful=True, timeout=cfg.shutdown_timeout), "gw-leave")
    limit = time.monotonic() + cfg.shutdown_timeout + 10.0
    return wait_for(task, "leaving the group", stops, cfg.shutdown_timeout, limit)


if __name__ == "__main__":
    sys.exit(main())
