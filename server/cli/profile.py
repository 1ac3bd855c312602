"""``gradwire profile HOST:PORT --seconds N --out trace.json``: one timeline of a running cluster.

Asks the worker at HOST:PORT for its peers (GetDebugInfo), then every worker at once for a
profile window of N seconds (the ``Profile`` method: each records everything it does, every
thread), and merges the answers into one Chrome-trace / Perfetto JSON
(:func:`gradwire.distributed.profile.merge_trace`): a lane per worker, clocks aligned from each
call's round trip, an arrow from each call to its serving and back. ``--only`` profiles the
given worker alone. Exit codes: 0 written, 1 no worker answered (or one failed, with
``--strict``), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

import grpc
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime.calls.profiling import clock_offset
from gradwire.distributed.profile import merge_trace

from .channel import (
    Target,
    add_target_arguments,
    describe_rpc_error,
    open_channel,
    target_from_args,
)
from .inspection import fetch_debug_info
from .settings import ConfigError

__all__ = ["add_profile_arguments", "profile_command", "profile_workers", "main"]

_SERVICE = "/gradwire.v1.Worker"
EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
#: Beyond the window: how long a worker may take to answer once it ends.
_GRACE_SECONDS = 30.0


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ADDRESS, token/TLS/--timeout and the profile options to ``parser``."""
    add_target_arguments(parser)
    parser.add_argument("--seconds", type=float, default=5.0, help="window length (default 5)")
    parser.add_argument("--out", required=True, help="where to write the trace (JSON)")
    parser.add_argument("--record-shapes", action="store_true", help="record op input shapes")
    parser.add_argument("--only", action="store_true", help="profile this worker alone")
    parser.add_argument(
        "--strict", action="store_true", help="fail when any worker does not answer"
    )


def _profile_one(target: Target, seconds: float, shapes: bool) -> tuple[pb.ProfileDump, int] | str:
    """One worker's dump and its clock offset (ns), or the error."""
    with open_channel(target) as channel:
        stub = channel.unary_unary(
            f"{_SERVICE}/Profile",
            request_serializer=pb.ProfileWindow.SerializeToString,
            response_deserializer=pb.ProfileDump.FromString,
        )
        sent = time.monotonic_ns()
        try:
            dump = stub(
                pb.ProfileWindow(seconds=seconds, record_shapes=shapes),
                timeout=seconds + _GRACE_SECONDS,
                metadata=target.metadata,
            )
        except grpc.RpcError as exc:
            return describe_rpc_error(exc, target, "Profile")
        received = time.monotonic_ns()
    return dump, clock_offset(sent, dump.started_ns, dump.clock_ns, received)


def profile_workers(
    targets: Sequence[Target], seconds: float, record_shapes: bool = False
) -> tuple[list[tuple[pb.ProfileDump, int]], dict[str, str]]:
    """Profile every target at once for ``seconds``.

    Returns:
        (the dumps with their clock offsets, address -> error for those that failed).
    """
    results: dict[str, tuple[pb.ProfileDump, int] | str] = {}

    def run(t: Target) -> None:
        results[t.address] = _profile_one(t, seconds, record_shapes)

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join(seconds + _GRACE_SECONDS + 10)
    dumps = [r for r in results.values() if not isinstance(r, str)]
    errors = {a: r for a, r in results.items() if isinstance(r, str)}
    for t in targets:
        if t.address not in results:
            errors[t.address] = "no answer before the deadline"
    return dumps, errors


def profile_command(
    args: argparse.Namespace, out: TextIO | None = None, prog: str = "gradwire profile"
) -> int:
    """Run ``gradwire profile`` with parsed ``args`` (returns the exit code)."""
    out = out or sys.stdout
    try:
        target = target_from_args(args)
        if not 0 < args.seconds <= 3600:
            raise ConfigError(f"--seconds must be in (0, 3600], got {args.seconds}")
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    targets = [target]
    if not args.only:
        try:
            with open_channel(target) as channel:
                info = fetch_debug_info(channel, target)
        except grpc.RpcError as exc:
            print(f"{prog}: {describe_rpc_error(exc, target, 'GetDebugInfo')}", file=sys.stderr)
            return EXIT_FAILED
        others = [p.address for p in info.peers if p.name != info.worker and p.address]
        targets += [Target(a, target.token, target.tls, target.timeout) for a in others]
    dumps, errors = profile_workers(targets, args.seconds, args.record_shapes)
    for address, error in sorted(errors.items()):
        print(f"{prog}: {address}: {error}", file=sys.stderr)
    if not dumps or (errors and args.strict):
        return EXIT_FAILED
    trace = merge_trace(dumps)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    events = sum(len(d.events) for d, _ in dumps)
    print(
        f"wrote {args.out}: {len(dumps)} workers, {events} events, "
        f"{trace['otherData']['flows']} calls with both ends (open it in https://ui.perfetto.dev)",
        file=out,
    )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point (``python -m gradwire.server.cli.profile``)."""
    parser = argparse.ArgumentParser(prog="gradwire profile", description=__doc__.split("\n")[0])
    add_profile_arguments(parser)
    return profile_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
