"""The ``run``, ``inspect`` and ``health`` subcommands of ``gradwire``, for its dispatcher.

``gradwire.cli`` (owned by the SDK) calls :func:`register` once with its subparsers; each
subcommand stores its handler in ``args.handler``, which takes the parsed namespace and returns
the exit code.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register", "COMMANDS"]

#: Subcommands this module adds to ``gradwire``.
COMMANDS = ("run", "inspect", "health")


def register(subparsers: Any) -> None:
    """Add ``run``, ``inspect``, ``profile`` and ``health`` to an argparse subparsers object.

    Args:
        subparsers: what ``ArgumentParser.add_subparsers()`` returned.

    Example:
        >>> sub = parser.add_subparsers(dest="command")
        >>> register(sub)
        >>> args = parser.parse_args(["health", "127.0.0.1:29500"])
        >>> args.handler(args)
    """
    from .health import add_health_arguments, health_command
    from .inspection import add_inspect_arguments, inspect_command
    from .profile import add_profile_arguments, profile_command
    from .run import add_run_arguments, run_command

    run = subparsers.add_parser(
        "run",
        allow_abbrev=False,  # the job's own arguments (``--b``) are never taken for ours
        help="join the cluster as a worker, run a job's entry point, leave",
        description="Join the cluster (flags or GRADWIRE_* variables, as gradwire-worker), run "
        "TARGET (script.py, package.module:function or package.module), then leave through "
        "the graceful shutdown. The job must not call init_rpc or shutdown itself.",
    )
    add_run_arguments(run)
    run.set_defaults(handler=run_command)

    inspect = subparsers.add_parser(
        "inspect",
        help="a worker's state, its control messages (--watch), DOT pictures (--dot)",
        description="Read a worker's debug RPC (table, --json, --all), follow its control "
        "messages (--watch), or write Graphviz DOT of the distributed autograd graph or the "
        "RRef fork trees (--dot).",
    )
    add_inspect_arguments(inspect)
    inspect.set_defaults(handler=inspect_command)

    profile = subparsers.add_parser(
        "profile",
        help="one timeline of a running cluster: profile every worker for N seconds",
        description="Profile every worker of the cluster of ADDRESS at once for --seconds "
        "(each records everything it does) and merge their events into one Chrome-trace / "
        "Perfetto JSON (--out): a lane per worker, an arrow for each call.",
    )
    add_profile_arguments(profile)
    profile.set_defaults(handler=profile_command)

    health = subparsers.add_parser(
        "health",
        help="grpc.health.v1 check of a worker: exit 0 healthy, 1 not",
        description="Check a worker with the standard gRPC health service. SERVING once it "
        "joined its cluster; --live accepts any answer (the process is up).",
    )
    add_health_arguments(health)
    health.set_defaults(handler=health_command)


def handler_of(args: argparse.Namespace) -> Any:
    """The handler a registered subcommand stored (None for other subcommands)."""
    return getattr(args, "handler", None)


__all__ += ["handler_of"]
