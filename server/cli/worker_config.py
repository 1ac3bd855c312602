"""What a worker process needs to join a cluster, from flags and GRADWIRE_* variables.

Shared by ``gradwire-worker`` and ``gradwire run`` (the driver is a worker too). Everything that
can be checked before touching the network is checked here, so bad configuration exits with
code 2 and a message naming the flag or variable, instead of a timeout later.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gradwire._runtime.cluster.options import GrpcRpcBackendOptions
from gradwire._runtime.cluster.rendezvous import is_loopback, plan
from gradwire._runtime.cluster.workers import RANK_LIMIT, validate_name
from gradwire._wire.policy import DEFAULT_DENY
from gradwire.errors import GradwireError

from .settings import ConfigError, Setting, add_settings, parse_bool, resolve_settings
from .tls_settings import TLS_SETTINGS, TlsFiles, resolve_tls, resolve_token

__all__ = [
    "WORKER_SETTINGS",
    "WorkerConfig",
    "add_worker_arguments",
    "worker_config",
    "LOG_LEVELS",
    "DEFAULT_PORT",
    "NO_TIMEOUT_SECONDS",
]

#: Port of rank 0 when only the master address is given.
DEFAULT_PORT = 29500
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: What "no timeout" means for waits that need a number (30 days).
NO_TIMEOUT_SECONDS = 30 * 24 * 3600.0


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("not an integer") from None


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _port(text: str) -> int:
    value = _int(text)
    if not 0 < value < 65536:
        raise ValueError("must be a TCP port, 1..65535")
    return value


def _port_or_any(text: str) -> int:
    value = _int(text)
    if not 0 <= value < 65536:
        raise ValueError("must be a TCP port, 1..65535, or 0 for any free port")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number of seconds") from None
    if value < 0 or value != value:
        raise ValueError("must be a number of seconds >= 0")
    return value


def _address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError("must be host:port")
    return text


def _name(text: str) -> str:
    try:
        validate_name(text)
    except GradwireError as exc:
        raise ValueError(str(exc)) from None
    return text


def _level(text: str) -> str:
    return text.upper()


JOIN_SETTINGS: tuple[Setting, ...] = (
    Setting("name", "--name", "GRADWIRE_NAME", "unique worker name", _name),
    Setting(
        "names",
        "--names",
        "GRADWIRE_NAMES",
        "every worker's name in rank order (comma-separated); without --name, this rank's "
        "entry is the name (for pods whose rank is their only identity)",
        _name,
        kind="list",
        metavar="NAME",
    ),
    Setting(
        "rank",
        "--rank",
        "GRADWIRE_RANK",
        "worker id in [0, world size); without a world size it may be left out: the group's "
        "host (rank 0) assigns the lowest free rank at join",
        _non_negative_int,
    ),
    Setting(
        "world_size",
        "--world-size",
        "GRADWIRE_WORLD_SIZE",
        "number of workers; without it the worker joins the dynamic group rank 0 hosts (and "
        "leaves it on SIGTERM)",
        _positive_int,
    ),
    Setting(
        "master_addr",
        "--master-addr",
        "GRADWIRE_MASTER_ADDR",
        "host of rank 0, which hosts the rendezvous",
    ),
    Setting(
        "master_port",
        "--master-port",
        "GRADWIRE_MASTER_PORT",
        "port of rank 0",
        _port,
        DEFAULT_PORT,
    ),
    Setting(
        "peers",
        "--peers",
        "GRADWIRE_PEERS",
        "instead of a master: every worker's host:port in rank order (comma-separated)",
        _address,
        kind="list",
        metavar="HOST:PORT",
    ),
    Setting(
        "listen",
        "--listen",
        "GRADWIRE_LISTEN",
        "host:port to serve on (default loopback; rank 0: the master address)",
        _address,
    ),
    Setting(
        "advertise",
        "--advertise",
        "GRADWIRE_ADVERTISE",
        "host:port the peers dial, when it differs from the listen address",
        _address,
    ),
    *TLS_SETTINGS,
    Setting(
        "allow",
        "--allow",
        "GRADWIRE_ALLOW",
        "extra callable-policy patterns to allow (mypkg.* or mypkg.mod:func)",
        kind="list",
        metavar="PATTERN",
    ),
    Setting(
        "deny",
        "--deny",
        "GRADWIRE_DENY",
        "callable-policy patterns refused on top of the built-in deny list",
        kind="list",
        metavar="PATTERN",
    ),
    Setting(
        "trust_everything",
        "--trust-everything",
        "GRADWIRE_TRUST_EVERYTHING",
        "run and unpickle anything importable (closed networks only)",
        kind="bool",
        default=False,
    ),
    Setting(
        "no_callable_guard",
        "--no-callable-guard",
        "GRADWIRE_NO_CALLABLE_GUARD",
        "run default-allowed callables without the guard that refuses files, processes and "
        "sockets (trusted clusters only)",
        kind="bool",
        default=False,
    ),
    Setting(
        "allow_insecure",
        "--allow-insecure",
        "GRADWIRE_ALLOW_INSECURE",
        "serve a non-loopback address without a token or mutual TLS",
        kind="bool",
        default=False,
    ),
    Setting(
        "rpc_timeout",
        "--rpc-timeout",
        "GRADWIRE_RPC_TIMEOUT",
        "default timeout of a call, seconds (0 = none)",
        _seconds,
        60.0,
    ),
    Setting(
        "init_timeout",
        "--init-timeout",
        "GRADWIRE_INIT_TIMEOUT",
        "seconds to wait for every rank to join",
        _seconds,
        120.0,
    ),
    Setting(
        "shutdown_timeout",
        "--shutdown-timeout",
        "GRADWIRE_SHUTDOWN_TIMEOUT",
        "seconds for the graceful shutdown after a signal or the end of a job",
        _seconds,
        60.0,
    ),
    Setting(
        "unix_socket",
        "--unix-socket",
        "GRADWIRE_UNIX_SOCKET",
        "also serve on a Unix socket that same-host peers dial (1/0; off with TLS)",
        parse_bool,
        True,
        metavar="1|0",
    ),
    Setting(
        "fast_lane_tcp",
        "--fast-lane-tcp",
        "GRADWIRE_FAST_LANE_TCP",
        "also serve the latency-bound methods on a second TCP port, for peers on other hosts "
        "(1/0; off with TLS)",
        parse_bool,
        True,
        metavar="1|0",
    ),
    Setting(
        "fast_lane_port",
        "--fast-lane-port",
        "GRADWIRE_FAST_LANE_PORT",
        "TCP port of the fast lane (0: any free port, advertised at the rendezvous)",
        _port_or_any,
        0,
    ),
    Setting(
        "bulk_lane",
        "--bulk-lane",
        "GRADWIRE_BULK_LANE",
        "serve a bulk lane and send large tensors over the peers' (1/0; off with TLS)",
        parse_bool,
        True,
        metavar="1|0",
    ),
    Setting(
        "bulk_port",
        "--bulk-port",
        "GRADWIRE_BULK_PORT",
        "TCP port of the bulk lane (0: any free port, advertised at the rendezvous)",
        _port_or_any,
        0,
    ),
    Setting(
        "num_worker_threads",
        "--num-worker-threads",
        "GRADWIRE_NUM_WORKER_THREADS",
        "threads that may run user code at once",
        _positive_int,
        16,
    ),
    Setting(
        "log_level",
        "--log-level",
        "GRADWIRE_LOG_LEVEL",
        "logging level",
        _level,
        "INFO",
        choices=LOG_LEVELS,
    ),
    Setting(
        "metrics_port",
        "--metrics-port",
        "GRADWIRE_METRICS_PORT",
        "serve Prometheus metrics over HTTP on this port (off when not given; needs the "
        "observability extra; docs/observability.md)",
        _port_or_any,
        metavar="PORT",
    ),
    Setting(
        "metrics_host",
        "--metrics-host",
        "GRADWIRE_METRICS_HOST",
        "address the metrics server binds (default: the host of --listen)",
        metavar="HOST",
    ),
    Setting(
        "tracing",
        "--tracing",
        "GRADWIRE_TRACING",
        "make an OpenTelemetry span of every call, to the tracer provider the process has "
        "(e.g. under opentelemetry-instrument; needs the observability extra)",
        kind="bool",
        default=False,
    ),
)

#: Settings of gradwire-worker only: when it leaves.
SERVE_SETTINGS: tuple[Setting, ...] = (
    Setting(
        "until",
        "--until",
        "GRADWIRE_UNTIL",
        "job: leave when every worker reached the shutdown barrier (the job ended), as PyTorch "
        "workers do; signal: serve until SIGTERM/SIGINT (what a worker without a world size, "
        "a member of a dynamic group, always does)",
        default="job",
        choices=("job", "signal"),
    ),
    Setting(
        "job_timeout",
        "--job-timeout",
        "GRADWIRE_JOB_TIMEOUT",
        "with --until job: give up waiting for the job after this many seconds (0 = never)",
        _seconds,
        0.0,
    ),
)

WORKER_SETTINGS = JOIN_SETTINGS + SERVE_SETTINGS


@dataclass
class WorkerConfig:
    """A checked worker configuration.

    Attributes:
        name, rank, world_size: identity in the cluster (world_size None: a dynamic group;
            rank None: one the group's host assigns at join).
        init_method: ``"tcp://host:port"`` or the peer list.
        listen, advertise: where to serve and what to advertise (None: the defaults).
        token: cluster token (None: none; a loopback cluster then generates one).
        tls: certificate, key and CA file paths.
        log_level, until, job_timeout, shutdown_timeout: process behaviour.
        values: every resolved setting, ``dest -> value``.
    """

    name: str
    rank: int | None
    world_size: int | None
    init_method: str | list[str]
    listen: str | None
    advertise: str | None
    token: str | None
    tls: TlsFiles
    log_level: str
    shutdown_timeout: float
    until: str = "job"
    job_timeout: float = 0.0
    values: dict[str, Any] = field(default_factory=dict)

    def backend_options(self) -> GrpcRpcBackendOptions:
        """The GrpcRpcBackendOptions this configuration describes."""
        v = self.values
        return GrpcRpcBackendOptions(
            rpc_timeout=v["rpc_timeout"],
            num_worker_threads=v["num_worker_threads"],
            init_method=self.init_method,
            init_timeout=v["init_timeout"],
            listen_address=self.listen,
            advertise_address=self.advertise,
            token=self.token,
            allow_insecure=v["allow_insecure"],
            tls_cert=self.tls.cert,
            tls_key=self.tls.key,
            tls_ca=self.tls.ca,
            tls_require_client_auth=self.tls.require_client_auth,
            tls_server_name=self.tls.server_name,
            callable_allow=tuple(v["allow"]),
            callable_deny=DEFAULT_DENY + tuple(v["deny"]),
            trust_everything=v["trust_everything"],
            callable_guard=not v["no_callable_guard"],
            use_unix_socket=v["unix_socket"],
            fast_lane_tcp=v["fast_lane_tcp"],
            fast_lane_port=v["fast_lane_port"],
            bulk_transfer=v["bulk_lane"],
            bulk_port=v["bulk_port"],
        )


def add_worker_arguments(parser: argparse.ArgumentParser, serve: bool = True) -> None:
    """Add the worker flags (``serve``: also --until and --job-timeout) to ``parser``."""
    add_settings(parser, WORKER_SETTINGS if serve else JOIN_SETTINGS)


def _required(values: dict[str, tuple[Any, str]], dest: str, flag: str, env: str) -> Any:
    value = values[dest][0]
    if value is None:
        raise ConfigError(f"missing {flag} (or ${env})")
    return value


def _init_method(
    values: dict[str, tuple[Any, str]], rank: int | None, world_size: int | None
) -> str | list[str]:
    peers, peers_src = values["peers"]
    master, master_src = values["master_addr"]
    listen = values["listen"][0]
    if peers and master:
        raise ConfigError(
            f"give either a master address ({master_src}) or a peer list ({peers_src}), not both"
        )
    if peers and world_size is None:
        return f"tcp://{peers[0]}"  # a dynamic group: the first seed is rank 0, its host
    if peers:
        if len(peers) != world_size:
            raise ConfigError(
                f"{peers_src} lists {len(peers)} addresses but the world size is {world_size}; "
                "give one host:port per rank"
            )
        return list(peers)
    if master:
        host = master.strip("[]")
        return f"tcp://{f'[{host}]' if ':' in host else host}:{values['master_port'][0]}"
    if rank == 0 and listen:
        return f"tcp://{listen}"  # rank 0 hosts the rendezvous where it listens
    raise ConfigError(
        "no rendezvous: set --master-addr (or $GRADWIRE_MASTER_ADDR, with --master-port) or "
        "--peers (or $GRADWIRE_PEERS)"
    )


def worker_config(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None, serve: bool = True
) -> WorkerConfig:
    """Resolve and check a worker configuration.

    Args:
        args: parsed flags (from a parser prepared by :func:`add_worker_arguments`).
        environ: the environment (default ``os.environ``).
        serve: include the gradwire-worker-only settings.

    Returns:
        The checked configuration.

    Raises:
        ConfigError: something is missing, malformed, unreadable or inconsistent; the message
            names the flag or variable.

    Example:
        >>> cfg = worker_config(parser.parse_args(["--name", "w0", "--rank", "0", ...]))
    """
    env = os.environ if environ is None else environ
    values = resolve_settings(args, WORKER_SETTINGS if serve else JOIN_SETTINGS, env)
    world_size = values["world_size"][0]  # None: a dynamic group
    rank = values["rank"][0]  # None in a dynamic group: the host assigns one at join
    if rank is None and world_size is not None:
        raise ConfigError(
            f"missing --rank (or $GRADWIRE_RANK): a worker of a fixed group ({values['world_size'][1]}) "
            "needs its rank; without a world size the group's host assigns one"
        )
    if rank is not None and rank >= RANK_LIMIT:
        raise ConfigError(
            f"rank {rank} ({values['rank'][1]}) is too large: ranks must be below {RANK_LIMIT} "
            "(2**15)"
        )
    if world_size is not None and rank is not None and rank >= world_size:
        raise ConfigError(
            f"rank {rank} ({values['rank'][1]}) is out of range for world size {world_size} "
            f"({values['world_size'][1]}): ranks are 0..{world_size - 1}"
        )
    names, names_src = values["names"]
    if names and world_size is None:
        raise ConfigError(f"{names_src} needs a world size (--world-size or $GRADWIRE_WORLD_SIZE)")
    if names and len(names) != world_size:
        raise ConfigError(
            f"{names_src} lists {len(names)} names but the world size is {world_size}"
        )
    if values["name"][0] is None and names and rank is not None:
        values["name"] = (names[rank], names_src)
    name = _required(values, "name", "--name", "GRADWIRE_NAME")
    init_method = _init_method(values, rank, world_size)
    tls = resolve_tls(values)
    token = resolve_token(values)
    listen = values["listen"][0]
    try:
        where = plan(init_method, -1 if rank is None else rank, world_size or 0, listen).listen
    except GradwireError as exc:
        raise ConfigError(str(exc)) from None
    host = where.rpartition(":")[0]
    secured = token or tls.require_client_auth
    if not is_loopback(host) and not secured and not values["allow_insecure"][0]:
        raise ConfigError(
            f"this worker would serve {where} (not loopback) without authentication: set a token "
            "(--token, --token-file, $GRADWIRE_TOKEN or $GRADWIRE_TOKEN_FILE), use mutual TLS "
            "(--tls-require-client-auth), or pass --allow-insecure on a closed network"
        )
    resolved = {k: v for k, (v, _src) in values.items()}
    return WorkerConfig(
        name=name,
        rank=rank,
        world_size=world_size,
        init_method=init_method,
        listen=listen,
        advertise=values["advertise"][0],
        token=token,
        tls=tls,
        log_level=values["log_level"][0],
        shutdown_timeout=values["shutdown_timeout"][0],
        until=resolved.get("until", "job"),
        job_timeout=resolved.get("job_timeout", 0.0),
        values=resolved,
    )


def setup_logging(level: str) -> None:
    """Log to stderr with a timestamp and the logger name (CLI processes only)."""
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


__all__ += ["setup_logging", "JOIN_SETTINGS", "SERVE_SETTINGS"]
