"""``python -m gradwire.demo.member``: a trainer of the elastic demo (a dynamic group member).

The same flags and GRADWIRE_* variables as ``gradwire-worker``, without a world size, with two
defaults that suit replicas of one service (``docker compose up --scale trainer=N``):

- the name defaults to ``trainer-<host name>`` (a container's host name is its id);
- without a rank it picks one at join: a rank derived from the name, and the next one when the
  group's host answers that a member has it.

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
import zlib
from collections.abc import Iterator, Sequence

from ..errors import RpcInitError

__all__ = ["main", "candidate_ranks", "MAX_RANK"]

log = logging.getLogger("gradwire.demo.member")

#: Ranks stay below 2**15: a worker id is the top 16 bits of a signed 64-bit autograd id.
MAX_RANK = 2**15 - 1
#: Ranks tried before giving up (each refusal means a member has that rank).
ATTEMPTS = 16


def candidate_ranks(name: str) -> Iterator[int]:
    """Ranks to try for ``name``: one derived from it, then the following ones (1..MAX_RANK)."""
    first = zlib.crc32(name.encode()) % MAX_RANK
    for i in range(ATTEMPTS):
        yield 1 + (first + i) % MAX_RANK


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
    given = args.rank is not None or "GRADWIRE_RANK" in env
    env.setdefault("GRADWIRE_RANK", "1")  # replaced below by the rank picked at join
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
    ranks = [cfg.rank] if given else list(candidate_ranks(cfg.name))
    for rank in ranks:
        try:
            with stops.raising():
                rpc.init_rpc(cfg.name, rank, None, cfg.backend_options())
            break
        except Interrupted as exc:
            log.warning("%s before joining; exiting", exc)
            return EXIT_SIGNALLED[exc.signum]
        except RpcInitError as exc:
            if given or f"rank {rank} is taken" not in str(exc):
                print(f"{prog}: cannot join the group: {exc}", file=sys.stderr)
                return EXIT_JOIN
            log.info("rank %d is taken; trying the next one", rank)
    else:
        print(f"{prog}: cannot join: ranks {ranks} are all taken", file=sys.stderr)
        return EXIT_JOIN
    log.info("%s joined the group with rank %d", cfg.name, rank)
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
