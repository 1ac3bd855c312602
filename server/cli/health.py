"""``gradwire health [HOST:PORT]``: the standard grpc.health.v1 check of a worker, exit 0 or 1.

A worker reports SERVING once it joined its cluster (RUNNING) and NOT_SERVING before (while it
waits at the rendezvous) and after (shutting down). ``--live`` accepts any answer: the worker
process is up and serving gRPC (Kubernetes liveness). ``--rendezvous`` accepts SERVING, and
also rank 0 while it hosts its rendezvous and waits for the other ranks (health name
``gradwire.v1.Rendezvous``): the container health check of the compose file and the Swarm
stack. Every other worker is healthy only once it joined; rank 0 must be healthy before, since
the others find it by a name that Docker Swarm publishes only for healthy tasks.

Example:
    $ gradwire health 127.0.0.1:29500 && echo joined
    127.0.0.1:29500: SERVING
    joined
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..app import RENDEZVOUS_HEALTH
from .channel import add_target_arguments, describe_rpc_error, open_channel, target_from_args
from .settings import ConfigError

__all__ = ["add_health_arguments", "health_command", "check", "main"]

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_CONFIG = 2


def add_health_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ADDRESS, --service, --live, token/TLS and --timeout to ``parser``."""
    add_target_arguments(parser)
    parser.add_argument(
        "--service",
        default="",
        help='health service name ("" = the whole worker; gradwire.v1.Worker = the same)',
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="healthy when the worker answers at all (SERVING or NOT_SERVING): liveness",
    )
    parser.add_argument(
        "--rendezvous",
        action="store_true",
        help="healthy when SERVING, or while this worker (rank 0) hosts its rendezvous and "
        "waits for the other ranks: the container health check (docs/deploy.md)",
    )


def check(channel: grpc.Channel, service: str, timeout: float) -> str:
    """The status name of ``service`` on the worker behind ``channel``.

    Args:
        channel: an open channel.
        service: health service name.
        timeout: deadline, seconds.

    Returns:
        ``"SERVING"``, ``"NOT_SERVING"``, ``"SERVICE_UNKNOWN"`` or ``"UNKNOWN"``.

    Raises:
        grpc.RpcError: the worker did not answer (NOT_FOUND for an unknown service).
    """
    stub = health_pb2_grpc.HealthStub(channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def health_command(args: argparse.Namespace, prog: str = "gradwire health") -> int:
    """Run the check; print ``ADDRESS: STATUS``.

    Returns:
        0 healthy, 1 not (or unreachable), 2 bad arguments.
    """
    try:
        target = target_from_args(args)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    hosting = False
    with open_channel(target) as channel:
        try:
            status = check(channel, args.service, target.timeout)
            if args.rendezvous and status == "NOT_SERVING":
                hosting = _hosting(channel, target.timeout)
        except grpc.RpcError as exc:
            print(f"{prog}: {describe_rpc_error(exc, target, 'health check')}", file=sys.stderr)
            return EXIT_UNHEALTHY
    print(f"{target.address}: {status}" + (" (hosting the rendezvous)" if hosting else ""))
    healthy = status == "SERVING" or hosting or (args.live and status == "NOT_SERVING")
    return EXIT_HEALTHY if healthy else EXIT_UNHEALTHY


def _hosting(channel: grpc.Channel, timeout: float) -> bool:
    """Rank 0 waiting at its rendezvous for the other ranks (False from an older worker)."""
    try:
        return check(channel, RENDEZVOUS_HEALTH, timeout) == "SERVING"
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point (``python -m gradwire.server.cli.health``)."""
    parser = argparse.ArgumentParser(prog="gradwire health", description=__doc__.split("\n")[0])
    add_health_arguments(parser)
    return health_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
