"""The ``gradwire`` command: ``gradwire demo`` and the deployment subcommands.

    gradwire demo      the distributed demo job (gradwire.demo; issue 5)
    gradwire run       join a cluster as a worker, run a job's entry point, leave
    gradwire inspect   a worker's state, control messages, DOT pictures
    gradwire profile   one timeline of a running cluster (Chrome trace)
    gradwire health    grpc.health.v1 check of a worker (exit 0 healthy, 1 not)

``run``, ``inspect``, ``profile`` and ``health`` live in :mod:`gradwire.server.cli` and are added by
:func:`_register_deploy_commands`; ``demo`` imports :mod:`gradwire.demo` only when used.
The worker itself is the separate command ``gradwire-worker`` (``python -m gradwire.server``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "build_parser"]


def _demo(args: argparse.Namespace) -> int:
    try:
        demo = importlib.import_module("gradwire.demo")
    except ImportError as exc:
        if exc.name not in ("gradwire.demo", "demo"):
            raise
        print(
            "gradwire demo: the demo module gradwire.demo is not installed in this version",
            file=sys.stderr,
        )
        return 2
    result = demo.main(list(args.demo_args))
    return int(result or 0)


# -- deployment subcommands (issue 7): run, inspect, health ---------------------------------------


def _register_deploy_commands(subparsers: Any) -> None:
    from gradwire.server.cli.commands import register

    register(subparsers)


# ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``gradwire`` parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="gradwire", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    demo = sub.add_parser(
        "demo",
        help="run the distributed demo job (gradwire demo --help for its options)",
        add_help=False,
    )
    demo.set_defaults(handler=_demo, demo_args=[])
    _register_deploy_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gradwire``.

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        The exit code of the subcommand.
    """
    parser = build_parser()
    # The demo parses its own options (argparse.REMAINDER does not take "--x" after a
    # subcommand), every other subcommand must consume all of its arguments.
    args, extra = parser.parse_known_args(argv)
    if args.handler is _demo:
        args.demo_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
