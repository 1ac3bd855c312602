"""A gRPC channel from a tool (health, inspect) to one worker, with token, TLS and deadlines."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from gradwire._runtime.cluster.options import read_pem

from .settings import ConfigError, Setting, add_settings, resolve_settings
from .tls_settings import TLS_SETTINGS, TlsFiles, resolve_tls, resolve_token

__all__ = [
    "Target",
    "add_target_arguments",
    "target_from_args",
    "open_channel",
    "local_address",
    "describe_rpc_error",
]

_TOKEN_KEY = "x-gradwire-token"

TIMEOUT_SETTING = Setting(
    "timeout",
    "--timeout",
    "GRADWIRE_TOOL_TIMEOUT",
    "seconds to wait for the worker's answer",
    float,
    5.0,
)


@dataclass(frozen=True)
class Target:
    """Where and how a tool talks to a worker.

    Attributes:
        address: ``host:port`` (or ``unix:path``).
        token: cluster token sent as ``x-gradwire-token`` (None: none).
        tls: TLS files (disabled: plaintext).
        timeout: deadline of each unary call, seconds.
    """

    address: str
    token: str | None
    tls: TlsFiles
    timeout: float

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the token."""
        return ((_TOKEN_KEY, self.token),) if self.token else ()


def local_address(listen: str) -> str:
    """The address a process on the same host dials for a worker listening on ``listen``.

    ``0.0.0.0:29500`` and ``[::]:29500`` become ``127.0.0.1:29500``; others are unchanged.
    """
    host, _, port = listen.rpartition(":")
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        return f"127.0.0.1:{port}"
    return listen


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ADDRESS (optional: default the local worker's $GRADWIRE_LISTEN), token, TLS, timeout."""
    parser.add_argument(
        "address",
        nargs="?",
        help="HOST:PORT of the worker (default: this host's worker, from $GRADWIRE_LISTEN)",
    )
    add_settings(parser, (*TLS_SETTINGS, TIMEOUT_SETTING))


def target_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Target:
    """Resolve the worker address, token, TLS and timeout.

    Raises:
        ConfigError: no address, a malformed one, or bad token/TLS settings.
    """
    env = os.environ if environ is None else environ
    values = resolve_settings(args, (*TLS_SETTINGS, TIMEOUT_SETTING), env)
    address = args.address
    if not address:
        listen = env.get("GRADWIRE_LISTEN", "").strip()
        if not listen:
            raise ConfigError("give the worker's HOST:PORT (or set $GRADWIRE_LISTEN)")
        address = local_address(listen)
    if not address.startswith("unix:"):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"{address!r} is not HOST:PORT")
    timeout = values["timeout"][0]
    if timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {timeout}")
    return Target(address, resolve_token(values), resolve_tls(values), timeout)


def open_channel(target: Target, keepalive_seconds: float | None = None) -> grpc.Channel:
    """A channel to ``target`` (TLS when a CA or certificate is configured).

    Args:
        target: the resolved target.
        keepalive_seconds: ping the worker this often while a stream is open, to notice a dead
            worker on long watches (None: gRPC's default).

    Returns:
        A grpc.Channel; close it when done.
    """
    options: list[tuple[str, Any]] = [("grpc.enable_http_proxy", 0)]
    if keepalive_seconds:
        options += [
            ("grpc.keepalive_time_ms", int(keepalive_seconds * 1000)),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    tls = target.tls
    if not tls.enabled:
        return grpc.insecure_channel(target.address, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    cert, key = read_pem(tls.cert), read_pem(tls.key)
    creds = grpc.ssl_channel_credentials(
        root_certificates=read_pem(tls.ca),
        private_key=key if cert and key else None,
        certificate_chain=cert if cert and key else None,
    )
    return grpc.secure_channel(target.address, creds, options=options)


def describe_rpc_error(exc: grpc.RpcError, target: Target, what: str) -> str:
    """One line saying what failed and the likely fix."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    hint = {
        grpc.StatusCode.UNAVAILABLE: "is the worker running and the address reachable?",
        grpc.StatusCode.DEADLINE_EXCEEDED: f"no answer within {target.timeout} s (--timeout)",
        grpc.StatusCode.UNAUTHENTICATED: "give the cluster token (--token-file, "
        "--token or $GRADWIRE_TOKEN)",
    }.get(code, "")
    return f"{what} on {target.address} failed: {code.name}: {details}" + (
        f" ({hint})" if hint else ""
    )
