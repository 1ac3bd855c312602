"""Backend options of the gRPC agent (the public class is re-exported by gradwire.distributed.rpc)."""

from __future__ import annotations

import enum
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..._wire.framing import DEFAULT_CHUNK_BYTES, DEFAULT_SINGLE_FRAME_BYTES
from ..._wire.policy import DEFAULT_DENY, CallablePolicy
from .device_maps import normalize_device_map

__all__ = [
    "GrpcRpcBackendOptions",
    "RpcBackendOptions",
    "TensorPipeRpcBackendOptions",
    "BackendType",
    "DEFAULT_RPC_TIMEOUT",
    "UNSET_RPC_TIMEOUT",
    "NO_TIMEOUT",
]

#: Default timeout of a call, in seconds.
DEFAULT_RPC_TIMEOUT = 60.0
#: ``timeout=-1`` in a verb means "the agent's rpc_timeout".
UNSET_RPC_TIMEOUT = -1.0
#: ``timeout=0`` means "no timeout" (a dead peer is still noticed through keepalive).
NO_TIMEOUT = 0.0


class RpcBackendOptions:
    """PyTorch's base of the backends' options: only ``rpc_timeout`` and ``init_method``.
    ``init_rpc`` cannot infer a backend from an instance of this class itself (or of a
    subclass other than :class:`GrpcRpcBackendOptions`) and raises TypeError, as PyTorch's
    does; pass :class:`GrpcRpcBackendOptions` (or PyTorch's
    :class:`TensorPipeRpcBackendOptions`)."""

    def __init__(
        self, rpc_timeout: float = DEFAULT_RPC_TIMEOUT, init_method: str | list[str] = "env://"
    ) -> None:
        self.rpc_timeout = rpc_timeout
        self.init_method = init_method

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rpc_timeout={self.rpc_timeout!r}, init_method={self.init_method!r})"


@dataclass
class GrpcRpcBackendOptions(RpcBackendOptions):
    """How a worker serves, connects and protects itself.

    Args:
        rpc_timeout: default timeout of a call, seconds (``0`` disables it).
        num_worker_threads: serving threads that may run user code at once.
        init_method: ``"env://"`` (MASTER_ADDR / MASTER_PORT), ``"tcp://host:port"`` (the
            address of rank 0), ``"file:///path"`` (rank 0 writes its address to the file, the
            others read it), or a list of ``"host:port"`` addresses, one per rank (each rank
            listens on its own entry; rank 0 hosts the rendezvous).
        init_timeout: seconds to wait for every rank to join.
        listen_address: ``"host:port"`` this worker serves on; default loopback, port 0 (rank 0:
            MASTER_PORT). A non-loopback address requires a token (or ``allow_insecure``).
        advertise_address: address the peers should use, when it differs from the listen one.
        token: cluster token; default ``$GRADWIRE_TOKEN``; a loopback cluster without one
            generates its own at rendezvous.
        allow_insecure: permit a non-loopback listener without a token or TLS.
        tls_cert, tls_key: PEM bytes or file paths of this worker's certificate and key.
        tls_ca: PEM bytes or path of the CA that signs the peers' certificates.
        tls_require_client_auth: mutual TLS: the server requires a client certificate.
        tls_server_name: name to verify in the peers' certificates, when it differs from the host.
        max_message_bytes: largest payload (pickle plus tensors) sent or accepted.
        chunk_bytes: raw bytes per frame of a streamed payload.
        single_frame_bytes: payloads up to this size go as one frame over the unary fast path;
            larger ones are streamed in ``chunk_bytes`` frames.
        max_in_flight_per_peer: calls a worker runs at once for one caller; more are refused.
        callable_allow: extra policy patterns (``"mypkg.*"`` or ``"mypkg.mod:func"``).
        callable_deny: patterns refused even if allowed (defaults to the built-in deny list).
        trust_everything: run and unpickle anything importable, unguarded (closed networks
            only).
        callable_guard: run callables that only the default lists allow, and the unpickling
            of payloads, under the guard that refuses files, processes and sockets (on by
            default; docs/security.md).
        device_maps: per peer name, local device -> peer device, for the CUDA tensors of the
            requests sent to that peer; replies and gradients come back by the inverse map
            (one-to-one, checked at ``init_rpc`` against every worker; docs/gpu.md).
        devices: the local CUDA devices this worker uses (PyTorch's option), e.g.
            ``["cuda:0"]``; when set, device maps may only name these.
        keepalive_seconds: ping interval on active connections, to notice dead peers. gRPC
            re-arms the timer on idle connections too (without pinging), and each firing
            wakes its event-engine threads: with one connection per peer that is N-1
            wake-ups per interval per worker. 120 s keeps an idle 64-worker cluster on 2
            cores under 0.05 core (20 s cost 0.06-0.09 core more; benchmarks/RESULTS.md).
        use_unix_socket: also serve on a Unix domain socket that peers on the same host dial
            (faster than loopback TCP); off when TLS is on.
        shm_transfer: send tensors of at least ``shm_threshold_bytes`` to peers on the same
            host through shared memory (only a handle crosses gRPC); the sender's setting decides.
        shm_threshold_bytes: smallest tensor, in bytes, that takes the shared-memory path
            (128 KiB: from there on it beats one gRPC frame, 0.91 vs 0.96 ms for an echo here).
        shm_pool_bytes: shared memory this worker keeps per same-host peer for reuse; a tensor
            that does not fit streams instead.
        fast_lane_tcp: serve the fast lane (the synchronous server of the latency-bound
            methods, ``gradwire.server.fast_lane``) on a second TCP port too, for peers on
            other hosts (off under TLS). A peer whose fast-lane port cannot be reached at the
            first call sends everything to the main port.
        fast_lane_port: the fast lane's TCP port (0: any free port, advertised at the
            rendezvous); fix it when a firewall must let it through.
        bulk_transfer: serve a bulk lane (a plain TCP listener next to the gRPC server) and
            send tensors of at least ``bulk_threshold_bytes`` to peers without shared memory
            over theirs, each tensor's bytes straight from its array, only its transfer id in
            the message (off under TLS; docs/wire.md, "The bulk lane"). A peer whose lane
            cannot be reached gets its tensors in the messages, as without it.
        bulk_threshold_bytes: smallest tensor, in bytes, that takes the bulk lane.
        lane_calls: send the one-frame calls for a peer's fast lane (rpc_sync, to_here(),
            remote()'s first attempt, RRef control messages, gradients) on its bulk lane
            instead, same-host peers included (their tensors still go through shared
            memory): the caller's thread writes the call and reads the answer, the callee's
            lane thread serves it (one thread wake-up per side; docs/wire.md, "Calls on the
            lane"). Needs ``bulk_transfer``; off under TLS.
        bulk_port: the bulk lane's TCP port (0: any free port, advertised at the rendezvous);
            fix it when a firewall must let it through.
        rref_leak_check: what graceful shutdown does when an owner still knows forks of its
            OwnerRRefs after every worker deleted its UserRRefs (PyTorch's RRef leak):
            ``"warn"`` (log a warning), ``"error"`` (raise RRefLeakError) or ``"off"``.
        rref_tombstone_ttl: seconds an owner remembers deleted RRefs and forks, to ignore stale
            retries of control messages (must exceed one attempt's deadline, 10 s at most).
        peer_lost_seconds: after a call to a peer fails as unreachable, how long its health
            check may keep failing before the peer is declared lost (its pending calls fail at
            once, its dist-autograd contexts are reclaimed; see ``_runtime.cluster.liveness``).
    """

    rpc_timeout: float = DEFAULT_RPC_TIMEOUT
    num_worker_threads: int = 16
    init_method: str | list[str] = "env://"
    init_timeout: float = 120.0
    listen_address: str | None = None
    advertise_address: str | None = None
    token: str | None = None
    allow_insecure: bool = False
    tls_cert: bytes | str | None = None
    tls_key: bytes | str | None = None
    tls_ca: bytes | str | None = None
    tls_require_client_auth: bool = False
    tls_server_name: str | None = None
    max_message_bytes: int = 64 << 30
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    single_frame_bytes: int = DEFAULT_SINGLE_FRAME_BYTES
    max_in_flight_per_peer: int = 4096
    callable_allow: tuple[str, ...] = ()
    callable_deny: tuple[str, ...] = DEFAULT_DENY
    trust_everything: bool = False
    callable_guard: bool = True
    device_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)
    keepalive_seconds: float = 120.0
    use_unix_socket: bool = True
    shm_transfer: bool = True
    shm_threshold_bytes: int = 128 << 10
    shm_pool_bytes: int = 2 << 30
    fast_lane_tcp: bool = True
    fast_lane_port: int = 0
    bulk_transfer: bool = True
    bulk_threshold_bytes: int = 128 << 10
    lane_calls: bool = True
    bulk_port: int = 0
    rref_leak_check: str = "warn"
    rref_tombstone_ttl: float = 120.0
    peer_lost_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.num_worker_threads < 1:
            raise ValueError(f"num_worker_threads must be >= 1, got {self.num_worker_threads}")
        if self.rpc_timeout < 0:
            raise ValueError(f"rpc_timeout must be >= 0 (0 = none), got {self.rpc_timeout}")
        if self.chunk_bytes < 1024:
            raise ValueError(f"chunk_bytes must be at least 1024, got {self.chunk_bytes}")
        if self.single_frame_bytes < 0:
            raise ValueError(f"single_frame_bytes must be >= 0, got {self.single_frame_bytes}")
        if self.shm_threshold_bytes < 1:
            raise ValueError(f"shm_threshold_bytes must be >= 1, got {self.shm_threshold_bytes}")
        if self.bulk_threshold_bytes < 1:
            raise ValueError(f"bulk_threshold_bytes must be >= 1, got {self.bulk_threshold_bytes}")
        if not 0 <= self.fast_lane_port < 65536:
            raise ValueError(
                f"fast_lane_port must be in [0, 65535] (0: any free port), got {self.fast_lane_port}"
            )
        if not 0 <= self.bulk_port < 65536:
            raise ValueError(
                f"bulk_port must be in [0, 65535] (0: any free port), got {self.bulk_port}"
            )
        if self.shm_pool_bytes < 0:
            raise ValueError(f"shm_pool_bytes must be >= 0, got {self.shm_pool_bytes}")
        if self.rref_leak_check not in ("warn", "error", "off"):
            raise ValueError(
                f"rref_leak_check must be 'warn', 'error' or 'off', got {self.rref_leak_check!r}"
            )
        if self.rref_tombstone_ttl < 0:
            raise ValueError(f"rref_tombstone_ttl must be >= 0, got {self.rref_tombstone_ttl}")
        if self.peer_lost_seconds <= 0:
            raise ValueError(f"peer_lost_seconds must be > 0, got {self.peer_lost_seconds}")
        if self.token is None:
            self.token = os.environ.get("GRADWIRE_TOKEN") or None
        self.device_maps = {to: normalize_device_map(to, m) for to, m in self.device_maps.items()}
        self.devices = [_cuda_device(d) for d in self.devices]

    def set_device_map(self, to: str, device_map: dict[Any, Any]) -> None:
        """Declare where this worker's GPU tensors land on worker ``to``.

        Args:
            to: peer worker name.
            device_map: ``{"cuda:0": "cuda:1"}`` (local device -> device on ``to``); an int
                ``n`` means ``"cuda:n"``, as in PyTorch. Calls add to the map already set.

        Raises:
            ValueError: a non-CUDA device, or a map that would not be one-to-one.

        Example:
            >>> opts.set_device_map("worker1", {0: 1})  # my cuda:0 -> worker1's cuda:1
        """
        merged = {**self.device_maps.get(to, {}), **dict(device_map)}
        self.device_maps[to] = normalize_device_map(to, merged)

    def set_devices(self, devices: list[Any]) -> None:
        """Declare the local CUDA devices this worker uses (PyTorch's ``set_devices``).

        Raises:
            ValueError: a device that is not a CUDA device.
        """
        self.devices = [_cuda_device(d) for d in devices]

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert is not None or self.tls_ca is not None

    def policy(self) -> CallablePolicy:
        """The callable policy these options describe."""
        return CallablePolicy(
            allow=tuple(self.callable_allow),
            deny=tuple(self.callable_deny),
            trust_everything=self.trust_everything,
            guard=self.callable_guard,
        )


def read_pem(value: bytes | str | None) -> bytes | None:
    """PEM bytes from bytes, a PEM string or a file path."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    with open(value, "rb") as f:
        return f.read()


__all__ += ["read_pem"]


def _device_name(device: Any) -> str:
    """``0`` -> ``"cuda:0"`` (PyTorch's convention for an int); anything else as ``str()``."""
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    return str(device)


def _cuda_device(device: Any) -> str:
    name = _device_name(device)
    if not name.startswith("cuda"):
        raise ValueError(f"devices lists CUDA devices ('cuda:N' or an int), got {name!r}")
    return name if ":" in name else f"{name}:0"


class BackendType(enum.Enum):
    """PyTorch's ``rpc.BackendType``. gRPC is gradwire's only backend; ``TENSORPIPE`` is
    accepted by ``init_rpc`` and runs on it too."""

    TENSORPIPE = "TENSORPIPE"
    GRPC = "GRPC"


class TensorPipeRpcBackendOptions(GrpcRpcBackendOptions):
    """PyTorch's options class, accepted as-is: its arguments map onto gradwire's options.

    Args:
        num_worker_threads, rpc_timeout, init_method, device_maps, devices: as in PyTorch.
        _transports, _channels: TensorPipe's transport choices; accepted and ignored with a
            warning (gradwire always speaks gRPC).
        **options: any other :class:`GrpcRpcBackendOptions` field (token, TLS, policy, ...).

    Example:
        >>> opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=20)
        >>> opts.set_device_map("worker1", {0: 1})
    """

    def __init__(
        self,
        *,
        num_worker_threads: int = 16,
        rpc_timeout: float = DEFAULT_RPC_TIMEOUT,
        init_method: str | list[str] = "env://",
        device_maps: dict[str, dict[Any, Any]] | None = None,
        devices: list[Any] | None = None,
        _transports: list[str] | None = None,
        _channels: list[str] | None = None,
        **options: Any,
    ) -> None:
        if _transports is not None or _channels is not None:
            warnings.warn(
                "TensorPipeRpcBackendOptions: _transports and _channels select TensorPipe "
                "transports; gradwire always uses gRPC and ignores them",
                stacklevel=2,
            )
        super().__init__(
            num_worker_threads=num_worker_threads,
            rpc_timeout=rpc_timeout,
            init_method=init_method,
            devices=[_cuda_device(d) for d in devices or ()],
            **options,
        )
        for to, mapping in (device_maps or {}).items():
            self.set_device_map(to, mapping)
