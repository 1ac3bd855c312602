"""``gradwire inspect [HOST:PORT]``: a worker's state, its control messages, and pictures.

    gradwire inspect HOST:PORT                 table of one worker (GetDebugInfo)
    gradwire inspect HOST:PORT --all           ... and one row per worker of its cluster
    gradwire inspect HOST:PORT --json          the raw DebugInfo as JSON
    gradwire inspect HOST:PORT --watch         follow WatchControl (--count, --duration, --kind)
    gradwire inspect HOST:PORT --dot autograd  Graphviz DOT of the distributed autograd graph
    gradwire inspect HOST:PORT --dot rrefs     Graphviz DOT of the RRef fork trees

``--dot`` asks the given worker and every peer it lists (one cluster per worker; peers that do
not answer appear dashed). What the picture is made of is documented in
:mod:`gradwire.server.cli.dot`. Exit codes: 0 done, 1 the worker did not answer or its data
broke the contract, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import grpc
from gradwire._proto import worker_pb2 as pb

from .channel import (
    Target,
    add_target_arguments,
    describe_rpc_error,
    open_channel,
    target_from_args,
)
from .dot import DotInputError, render_autograd, render_rrefs
from .settings import ConfigError
from .table import debug_info_dict, render_cluster, render_event, render_worker

__all__ = [
    "add_inspect_arguments",
    "inspect_command",
    "fetch_debug_info",
    "watch",
    "cluster_views",
    "main",
]

_SERVICE = "/gradwire.v1.Worker"
EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ADDRESS, token/TLS/--timeout and the inspect options to ``parser``."""
    add_target_arguments(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--watch", action="store_true", help="follow the control-message stream")
    mode.add_argument("--dot", choices=("autograd", "rrefs"), help="write a Graphviz DOT picture")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--all", action="store_true", help="table: also one row per worker of the cluster"
    )
    parser.add_argument(
        "--kind", action="append", default=[], help="--watch: only this kind (repeatable)"
    )
    parser.add_argument("--count", type=int, help="--watch: stop after this many messages")
    parser.add_argument("--duration", type=float, help="--watch: stop after this many seconds")
    parser.add_argument("--context", type=int, help="--dot autograd: only this context id")
    parser.add_argument("--rref", help="--dot rrefs: only this RRef (created_on:local_id)")
    parser.add_argument("-o", "--output", help="--dot: write to this file (default stdout)")


def fetch_debug_info(channel: grpc.Channel, target: Target) -> pb.DebugInfo:
    """GetDebugInfo of the worker behind ``channel``, with the target's token and deadline.

    Raises:
        grpc.RpcError: no answer, wrong token, ...
    """
    stub = channel.unary_unary(
        f"{_SERVICE}/GetDebugInfo",
        request_serializer=pb.DebugInfoRequest.SerializeToString,
        response_deserializer=pb.DebugInfo.FromString,
    )
    return stub(pb.DebugInfoRequest(), timeout=target.timeout, metadata=target.metadata)


def _peer_target(target: Target, address: str) -> Target:
    return Target(address, target.token, target.tls, target.timeout)


def cluster_views(
    first: pb.DebugInfo, target: Target
) -> tuple[list[pb.DebugInfo | tuple[str, str]], dict[str, pb.DebugInfo]]:
    """Ask every peer listed by ``first`` for its DebugInfo too.

    Returns:
        (one entry per worker in id order: its DebugInfo or ``(name, error)``, name -> info).
    """
    rows: list[pb.DebugInfo | tuple[str, str]] = []
    found = {first.worker: first}
    for peer in sorted(first.peers, key=lambda p: p.id):
        if peer.name == first.worker:
            rows.append(first)
            continue
        t = _peer_target(target, peer.address)
        with open_channel(t) as channel:
            try:
                info = fetch_debug_info(channel, t)
            except grpc.RpcError as exc:
                rows.append((peer.name, describe_rpc_error(exc, t, "GetDebugInfo")))
                continue
        rows.append(info)
        found[info.worker] = info
    if not first.peers:
        rows.append(first)
    return rows, found


def watch(
    channel: grpc.Channel,
    target: Target,
    kinds: Sequence[str],
    emit: Callable[[pb.ControlEvent], None],
    count: int | None = None,
    duration: float | None = None,
) -> int:
    """Follow WatchControl, calling ``emit`` per control message.

    Args:
        channel: open channel to the worker.
        target: token and address.
        kinds: only these kinds (empty: all).
        emit: receives each event.
        count: stop after this many events (None: no limit).
        duration: stop after this many seconds (None: until the stream ends or Ctrl-C).

    Returns:
        How many events were emitted.

    Raises:
        grpc.RpcError: the stream failed (not for the end of ``duration``).
    """
    stub = channel.unary_stream(
        f"{_SERVICE}/WatchControl",
        request_serializer=pb.WatchRequest.SerializeToString,
        response_deserializer=pb.ControlEvent.FromString,
    )
    stream = stub(pb.WatchRequest(kinds=list(kinds)), timeout=duration, metadata=target.metadata)
    seen = 0
    try:
        for event in stream:
            emit(event)
            seen += 1
            if count is not None and seen >= count:
                break
    except grpc.RpcError as exc:
        if duration is None or exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    finally:
        stream.cancel()
    return seen


def _write(text: str, path: str | None, out: TextIO) -> None:
    if path is None:
        out.write(text)
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _inspect(args: argparse.Namespace, target: Target, out: TextIO, prog: str) -> int:
    keepalive = 20.0 if args.watch else None
    with open_channel(target, keepalive_seconds=keepalive) as channel:
        if args.watch:
            if args.json:

                def emit(e: pb.ControlEvent) -> None:
                    from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped,unused-ignore]

                    print(json.dumps(MessageToDict(e, preserving_proto_field_name=True)), file=out)
                    out.flush()
            else:

                def emit(e: pb.ControlEvent) -> None:
                    print(render_event(e), file=out)
                    out.flush()

            try:
                watch(channel, target, args.kind, emit, args.count, args.duration)
            except KeyboardInterrupt:
                pass
            return EXIT_OK
        info = fetch_debug_info(channel, target)
    if args.dot:
        _rows, found = cluster_views(info, target)
        for row in _rows:
            if isinstance(row, tuple):
                print(f"{prog}: warning: {row[1]}", file=sys.stderr)
        views = {name: dict(i.extra) for name, i in found.items()}
        dot = (
            render_autograd(views, args.context)
            if args.dot == "autograd"
            else render_rrefs(views, args.rref)
        )
        _write(dot, args.output, out)
        return EXIT_OK
    rows: list[Any] = cluster_views(info, target)[0] if args.all else []
    if args.json:
        data: Any = debug_info_dict(info)
        if args.all:
            data = {
                "worker": data,
                "cluster": [
                    {"worker": r[0], "error": r[1]} if isinstance(r, tuple) else debug_info_dict(r)
                    for r in rows
                ],
            }
        print(json.dumps(data, indent=2, sort_keys=True), file=out)
        return EXIT_OK
    out.write(render_worker(info))
    if args.all:
        out.write("\ncluster\n" + render_cluster(rows))
    return EXIT_OK


def inspect_command(
    args: argparse.Namespace, out: TextIO | None = None, prog: str = "gradwire inspect"
) -> int:
    """Run ``gradwire inspect`` with parsed ``args``.

    Args:
        args: from a parser prepared by :func:`add_inspect_arguments`.
        out: where to print (default stdout).
        prog: command name for messages.

    Returns:
        0 done, 1 the worker did not answer or sent data that breaks the contract, 2 bad
        arguments.
    """
    out = out or sys.stdout
    try:
        target = target_from_args(args)
        if args.count is not None and args.count < 1:
            raise ConfigError("--count must be at least 1")
        if args.duration is not None and args.duration <= 0:
            raise ConfigError("--duration must be positive")
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return _inspect(args, target, out, prog)
    except grpc.RpcError as exc:
        what = "WatchControl" if args.watch else "GetDebugInfo"
        print(f"{prog}: {describe_rpc_error(exc, target, what)}", file=sys.stderr)
        return EXIT_FAILED
    except DotInputError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point (``python -m gradwire.server.cli.inspection``)."""
    parser = argparse.ArgumentParser(prog="gradwire inspect", description=__doc__.split("\n")[0])
    add_inspect_arguments(parser)
    return inspect_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
