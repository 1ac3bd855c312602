"""The caller side of gRPC: channels per peer, the calls, and the one grpc.RpcError mapping.

Channels are synchronous gRPC channels. A blocking single-frame call (rpc_sync) rides one of
the address's long-lived call streams from the caller's thread (``calls.streams``), or a unary
call when they are all busy. Keepalive pings only while calls are active (an open call stream
is one), so a dead peer is noticed. Every call has a deadline unless the user asked for none
(timeout 0); on a stream the transport's watchdog keeps it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

# gRPC core logs connection chatter (GOAWAY on every peer shutdown) at INFO to stderr; gradwire
# reports what matters through its own errors and `logging`. Users can still set it themselves.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402

from ... import _traffic
from ..._proto import worker_pb2 as pb
from ..._wire.framing import Frame, decode_frame, encode_frame
from ...errors import (
    AuthenticationError,
    GradwireError,
    MessageTooLargeError,
    RpcError,
    RpcInitError,
    RpcShutdownError,
    RpcTimeoutError,
    TooManyRequestsError,
    WorkerDepartedError,
    WorkerUnavailableError,
)
from ..calls.pipe import CorePipe, Done, LaneDone, Pipe, PipeClosed, open_pipe
from ..calls.streams import StreamFailed, Streams, Watchdog
from ..cluster.options import GrpcRpcBackendOptions, read_pem
from ..cluster.workers import Peer
from .bulk_lane import BulkLane, ConnectBudget
from .lane_calls import Parked
from .loop import in_loop_thread
from .stuck import shut_connections_to

__all__ = [
    "Transport",
    "connectivity",
    "map_rpc_error",
    "SERVICE",
    "channel_options",
    "IN_FLIGHT_MARK",
    "FAST_LANE_CONTROL",
    "add_failure_observer",
    "remove_failure_observer",
    "set_lost",
    "set_departed",
]

log = logging.getLogger(__name__)
SERVICE = "gradwire.v1.Worker"
#: Text the servicer puts in RESOURCE_EXHAUSTED details for the in-flight limit.
IN_FLIGHT_MARK = "calls in flight"
_HEADER_SLACK = 1 << 20
#: The unary control methods the fast lane (gradwire.server.fast_lane) serves besides Call and
#: Gradients: their handlers answer at once, so a sender may use ``Peer.call_dial``.
FAST_LANE_CONTROL = ("ReleaseContext", "ForkRequest", "ChildAck", "RRefDelete")
#: The request message of each control method that may also ride the call pipe (and the fast
#: lane): its handler answers at once.
CONTROL_REQUESTS: dict[str, Any] = {
    "ReleaseContext": pb.ReleaseContextRequest,
    "ForkRequest": pb.ForkRequest,
    "ChildAck": pb.ChildAck,
    "RRefDelete": pb.RRefDelete,
}
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
#: Call streams kept open per address for rpc_sync (calls beyond that many at once go unary).
STREAMS_PER_PEER = 8
#: Threads waiting for the replies of calls started with ``Transport.stream_call``, started
#: as needed (a reply past them waits for one, at most until its call's deadline cancels its
#: stream; each holds its stream until its reply is read).
STREAM_READERS = 32
#: How long a peer whose connection looks stuck has to answer a health check before the
#: connection is shut down (``Transport.drop_stuck``).
STUCK_PROBE_SECONDS = 0.5
#: How long one gRPC connection attempt waits for the peer's first frame (``channel_options``).
CONNECT_TIMEOUT_SECONDS = 10.0
#: Seconds a peer's fast-lane port has to accept the first connection (else its main port).
PROBE_SECONDS = 3.0
_NO_PIN: AbstractContextManager[Any] = nullcontext()


def channel_options(options: GrpcRpcBackendOptions) -> list[tuple[str, Any]]:
    """gRPC options shared by every channel of a worker."""
    limit = max(options.chunk_bytes, options.single_frame_bytes) + _HEADER_SLACK
    opts: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.keepalive_time_ms", int(options.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_http_proxy", 0),
        # A channel of its own connection: closing it (a lost peer, a stuck connection) ends
        # that connection and every call on it, instead of leaving it to a shared pool.
        ("grpc.use_local_subchannel_pool", 1),
        # After a partition heals, a channel waits out its reconnect backoff (gRPC's default
        # grows to 120 s) and fails calls fast meanwhile; between workers, retry within ~2 s.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        # gRPC reads this one as the *connect timeout*: how long one connection attempt may
        # wait for the peer's first HTTP/2 frame. A slow peer (dozens of workers on a few
        # cores opening their connections at once) is not a dead one: at 200 ms the channel
        # gave up on it and failed every call meanwhile with UNAVAILABLE (issue 38). Calls
        # keep their own deadlines; a dead peer refuses at once, and a lost one gets a new
        # channel, so this bounds only how long a black-holed attempt waits before the next.
        ("grpc.min_reconnect_backoff_ms", int(CONNECT_TIMEOUT_SECONDS * 1000)),
    ]
    if options.tls_server_name:
        opts.append(("grpc.ssl_target_name_override", options.tls_server_name))
    return opts


_failure_observers: list[Callable[[str, grpc.StatusCode], None]] = []


def add_failure_observer(observer: Callable[[str, grpc.StatusCode], None]) -> None:
    """Call ``observer(peer, code)`` for every failed outgoing call (the failure detector)."""
    _failure_observers.append(observer)


def remove_failure_observer(observer: Callable[[str, grpc.StatusCode], None]) -> None:
    """Undo :func:`add_failure_observer`."""
    if observer in _failure_observers:
        _failure_observers.remove(observer)


#: Peers the failure detector declared lost -> why; their unreachability is reported as such.
_lost: dict[str, str] = {}


def set_lost(peer: str, why: str | None) -> None:
    """Record (``why``) or clear (None) that worker ``peer`` was declared lost."""
    if why is None:
        _lost.pop(peer, None)
    else:
        _lost[peer] = why


#: Workers that left their dynamic group with shutdown(); their unreachability says so.
_departed: set[str] = set()


def set_departed(peer: str, departed: bool) -> None:
    """Record (True) or clear (False) that worker ``peer`` left its group on purpose."""
    if departed:
        _departed.add(peer)
    else:
        _departed.discard(peer)


def _left(deadline: float | None) -> float | None:
    """Seconds left until ``deadline``; raises DEADLINE_EXCEEDED (as a stream call would) when
    none are."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise StreamFailed(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            "deadline exceeded before the call was sent (opening a bulk-lane connection)",
        )
    return left


def map_rpc_error(
    exc: grpc.RpcError, peer: str, what: str, started: float, timeout: float | None
) -> GradwireError:
    """Translate a gRPC failure into the gradwire error the user sees (the only place).

    Every failure seen here is also reported to the failure observers (``liveness``).

    Args:
        exc: the gRPC error (a grpc.Call).
        peer: destination worker name (or address before rendezvous).
        what: what was being done, e.g. "rpc_sync(mymod:f)".
        started: ``time.monotonic()`` at the start of the call.
        timeout: the call's timeout (None: none).
    """
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    for observer in list(_failure_observers):
        try:
            observer(peer, code)
        except Exception:  # pragma: no cover - an observer must not change the error
            log.exception("failure observer raised")
    details = (exc.details() if hasattr(exc, "details") else str(exc)) or ""
    elapsed = time.monotonic() - started
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RpcTimeoutError(
            f"{what} to worker {peer!r} timed out after {elapsed:.3f} s (timeout {timeout} s)",
            peer,
            elapsed,
        )
    if peer in _departed and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return WorkerDepartedError(
            f"worker {peer!r} has departed (it left the group with shutdown()); {what} cannot "
            "reach it"
        )
    lost = _lost.get(peer)
    if lost and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return WorkerUnavailableError(f"worker {peer!r} is lost ({lost}); {what} cannot reach it")
    if code == grpc.StatusCode.UNAVAILABLE:
        return WorkerUnavailableError(f"worker {peer!r} is unavailable during {what}: {details}")
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return AuthenticationError(f"worker {peer!r} rejected {what}: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if IN_FLIGHT_MARK in details:
            return TooManyRequestsError(f"worker {peer!r} refused {what}: {details}")
        return MessageTooLargeError(f"worker {peer!r} refused {what}: {details}")
    if code == grpc.StatusCode.CANCELLED:
        return WorkerUnavailableError(f"{what} to worker {peer!r} was cancelled: {details}")
    if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS):
        return RpcInitError(f"worker {peer!r} refused {what}: {details}")
    return RpcError(f"{what} to worker {peer!r} failed with {code.name}: {details}")


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


class _Stubs:
    def __init__(self, channel: grpc.Channel, transport: Transport, address: str) -> None:
        #: The route its bytes count under (``gradwire._traffic``, while metrics are on).
        self.route = _traffic.FAST_LANE if transport.is_fast_lane(address) else _traffic.GRPC
        ser = _traffic.counting_encoder(self.route, encode_frame)
        de = _traffic.counting_decoder(self.route, decode_frame)
        self.channel = channel
        self.address = address
        self.call = channel.unary_unary(f"/{SERVICE}/Call", ser, de)
        self._transport = transport
        self.streams = self.new_streams()
        self.python_call = channel.stream_stream(f"/{SERVICE}/PythonCall", ser, de)
        self.fetch_reply = channel.unary_stream(
            f"/{SERVICE}/FetchReply",
            _traffic.counting_encoder(self.route, pb.FetchReplyRequest.SerializeToString),
            de,
        )
        self.pipe: Pipe | CorePipe | None = None
        self._control: dict[str, Any] = {}
        self._framed: dict[str, Any] = {}

    def new_streams(self) -> Streams:
        """A new set of call streams, opened with the transport's current metadata."""
        transport = self._transport
        return Streams(
            self.channel,
            f"/{SERVICE}/CallStream",
            lambda: transport.metadata,
            STREAMS_PER_PEER,
            transport.watchdog,
            on_stuck=lambda: transport.drop_stuck(self),
            route=self.route,
        )

    def control(self, method: str, response_cls: Any) -> Any:
        stub = self._control.get(method)
        if stub is None:
            stub = self.channel.unary_unary(
                f"/{SERVICE}/{method}",
                _traffic.counting_encoder(self.route, _serialize),
                _traffic.counting_decoder(self.route, response_cls.FromString),
            )
            self._control[method] = stub
        return stub

    def framed_control(self, method: str, response_cls: Any) -> Any:
        stub = self._framed.get(method)
        if stub is None:
            stub = self.channel.stream_unary(
                f"/{SERVICE}/{method}",
                _traffic.counting_encoder(self.route, encode_frame),
                _traffic.counting_decoder(self.route, response_cls.FromString),
            )
            self._framed[method] = stub
        return stub


_BY_CODE = {c.value[0]: c for c in grpc.ChannelConnectivity}


def connectivity(channel: grpc.Channel, connect: bool = False) -> grpc.ChannelConnectivity | None:
    """The channel's connectivity now; an idle channel starts connecting if ``connect`` (None:
    closed, or a gRPC without the core call). About a microsecond: the public API only offers
    ``subscribe()``, which keeps a thread per channel waking five times a second, so the
    failure detector reads every channel from one thread instead (``cluster/liveness.py``)."""
    try:
        code = channel._channel.check_connectivity_state(connect)  # noqa: SLF001
    except Exception:  # noqa: BLE001 - closed, or grpc internals moved
        return None
    return _BY_CODE.get(code)


class Transport:
    """Outbound gRPC for one agent.

    Args:
        options: the backend options (TLS, limits, keepalive).
        caller_id: this worker's id, sent in metadata for the callee's in-flight accounting.
    """

    def __init__(self, options: GrpcRpcBackendOptions, caller_id: int) -> None:
        self._options = options
        self._opts = channel_options(options)
        self._creds = self._credentials(options)
        self._stubs: dict[str, _Stubs] = {}
        self._lock = threading.Lock()
        self._probe_lock = threading.Lock()
        #: ``fallback_of(address)``: for a peer's fast lane over TCP, the peer's main address
        #: (used when the fast lane's port cannot be reached); "" for any other address.
        self.fallback_of: Callable[[str], str] = lambda _address: ""
        #: ``is_fast_lane(address)``: whether ``address`` is a peer's fast lane (the route its
        #: bytes count under while metrics are on); set by the agent.
        self.is_fast_lane: Callable[[str], bool] = lambda _address: False
        self._closed = False
        self.watchdog = Watchdog()
        #: Threads that wait for the replies of ``stream_call`` (started at its first use).
        self._readers: ThreadPoolExecutor | None = None
        self.metadata: tuple[tuple[str, str], ...] = ()
        #: The worker's bulk lane, set by the agent: one-frame calls to a peer's fast lane go
        #: on it (``call``, ``stream_call``).
        self.lane: BulkLane | None = None
        self.set_token(options.token, caller_id)

    def pinned(self, peer: Peer, here: bool = True) -> AbstractContextManager[Any]:
        """A block whose bulk-lane transfers to ``peer`` and the lane call sent after them take
        one connection (``BulkLane.pinned``); nothing without a lane, or when the call is not
        sent from this thread (not ``here``)."""
        lane = self.lane
        if not here or lane is None or not lane.serves(peer, peer.call_dial):
            return _NO_PIN
        return lane.pinned(peer.name)

    def within(self, timeout: float | None) -> AbstractContextManager[ConnectBudget]:
        """A block in which the bulk-lane connections this thread opens and the bytes it writes
        (for the tensors of a call being encoded) give up after ``timeout`` seconds; the
        :class:`ConnectBudget` it gives says how long they took (``BulkLane.within``)."""
        budget = ConnectBudget(None if timeout is None else time.monotonic() + timeout)
        lane = self.lane
        if lane is None or timeout is None:
            return nullcontext(budget)
        return lane.within(budget)

    def set_token(self, token: str | None, caller_id: int) -> None:
        """Attach the cluster token to every later call (call streams opened before carry the
        old metadata: they are closed)."""
        md = [("x-gradwire-caller", str(caller_id))]
        if token:
            md.append(("x-gradwire-token", token))
        self.metadata = tuple(md)
        for stubs in list(self._stubs.values()):
            stubs.streams.close()
            stubs.streams = stubs.new_streams()
            if stubs.pipe is not None:
                stubs.pipe.close()
                stubs.pipe = None

    @staticmethod
    def _credentials(options: GrpcRpcBackendOptions) -> grpc.ChannelCredentials | None:
        if not options.tls_enabled:
            return None
        cert, key = read_pem(options.tls_cert), read_pem(options.tls_key)
        return grpc.ssl_channel_credentials(
            root_certificates=read_pem(options.tls_ca),
            private_key=key if cert and key else None,
            certificate_chain=cert if cert and key else None,
        )

    def _get(self, address: str) -> _Stubs:
        stubs = self._stubs.get(address)
        if stubs is not None:
            return stubs
        fallback = self.fallback_of(address)
        if fallback and fallback != address:
            return self._probed(address, fallback)
        return self._open(address)

    def _probed(self, address: str, fallback: str) -> _Stubs:
        """The stubs of a peer's fast lane over TCP, once its port answered a connection;
        else (a firewall, a proxy in front of the main port) those of its main address, for
        good. The I/O loop never waits for the probe: it uses the main address until a
        thread made it."""
        if in_loop_thread():
            return self._get(fallback)
        with self._probe_lock:
            stubs = self._stubs.get(address)
            if stubs is not None:
                return stubs
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), PROBE_SECONDS).close()
            except (OSError, ValueError) as exc:
                log.warning(
                    "cannot reach the fast lane at %s (%s): calls to that worker go to %s",
                    address,
                    exc,
                    fallback,
                )
                stubs = self._get(fallback)
                with self._lock:
                    self._stubs.setdefault(address, stubs)
                return stubs
            return self._open(address)

    def _open(self, address: str) -> _Stubs:
        with self._lock:
            if self._closed:
                raise RpcShutdownError("the local RPC agent is shut down")
            stubs = self._stubs.get(address)
            if stubs is None:
                if self._creds is not None:
                    channel = grpc.secure_channel(address, self._creds, options=self._opts)
                else:
                    channel = grpc.insecure_channel(address, options=self._opts)
                stubs = self._stubs[address] = _Stubs(channel, self, address)
        return stubs

    def call(
        self,
        address: str,
        frame: Frame,
        timeout: float | None,
        peer: Peer | None = None,
        behind: Parked | None = None,
    ) -> Frame:
        """Blocking single-frame call (raises grpc.RpcError): on ``peer``'s bulk lane when it
        serves the call (``BulkLane.serves``: its fast lane over TCP; right behind the parked
        call ``behind`` on its connection, when this thread claims it), else over one of the
        address's call streams, or a unary call when they are all busy (see
        ``calls.streams``)."""
        lane = self.lane
        if lane is not None and peer is not None and lane.serves(peer, address):
            deadline = None if timeout is None else time.monotonic() + timeout
            reply = lane.exchange(peer, frame, timeout, behind)
            if reply is not None:
                return reply
            timeout = _left(deadline)  # the lane's connect counted against the call
        stubs = self._get(address)
        reply = stubs.streams.exchange(frame, timeout)
        if reply is None:
            reply = stubs.call(frame, timeout=timeout, metadata=self.metadata)
        return reply

    def stream_call(
        self,
        address: str,
        encoded: bytes,
        timeout: float | None,
        done: Callable[[Frame | None, grpc.RpcError | None], None],
        peer: Peer | None = None,
        park: Callable[[Parked], None] | None = None,
        quick: bool = False,
    ) -> bool:
        """Start a single-frame call on ``peer``'s bulk lane when it serves the call (as
        ``call``), else on one of the address's call streams, sent from this thread; a reader
        thread waits for its reply and runs ``done(reply frame, None)``
        or ``done(None, grpc error)``. False when no lane connection or stream is free (send it
        on the pipe). With ``park`` (or for a ``quick`` call, answered at once: an RRef delete),
        a call on the lane may leave its answer parked for a call behind it
        (``BulkLane.start``)."""
        readers = self._readers
        if readers is None:
            with self._lock:
                if self._closed:
                    raise RpcShutdownError("the local RPC agent is shut down")
                if self._readers is None:
                    self._readers = ThreadPoolExecutor(
                        STREAM_READERS, thread_name_prefix="gradwire-stream-replies"
                    )
                readers = self._readers
        lane = self.lane
        if lane is not None and peer is not None and lane.serves(peer, address):
            deadline = None if timeout is None else time.monotonic() + timeout
            if lane.start(peer, encoded, timeout, readers, done, park, quick):
                return True
            timeout = _left(deadline)  # the lane's connect counted against the call
        return self._get(address).streams.start(encoded, timeout, readers, done)

    def lane_pipe_call(
        self,
        peer: Peer,
        message_id: int,
        encoded: bytes,
        timeout: float | None,
        done: LaneDone,
        kind: int,
    ) -> bool:
        """Start a single-frame call on ``peer``'s lane pipe (``transport.lane_pipe``) when it
        has one, or an idle lane connection to open one on; False when not (use
        ``pipe_call``). ``encoded``: its frame (``kind`` PIPE) or a PLAIN record's body (PLAIN,
        to a peer that takes them; else False). ``done`` runs once when it ends."""
        lane = self.lane
        if lane is None or self._closed:
            return False
        return lane.pipe_call(peer, message_id, encoded, timeout, done, self.watchdog, kind)

    def pipe_call(
        self,
        address: str,
        message_id: int,
        encoded: bytes,
        timeout: float | None,
        done: Done,
    ) -> None:
        """Start a single-frame call on the address's call pipe (``calls.pipe``); ``done(reply
        frame, None)`` or ``done(None, grpc error)`` runs once when it ends."""
        stubs = self._get(address)
        failure: grpc.RpcError | None = None
        for _ in range(2):
            pipe = stubs.pipe
            if pipe is None or not pipe.alive:
                with self._lock:
                    if self._closed:
                        raise RpcShutdownError("the local RPC agent is shut down")
                    pipe = stubs.pipe
                    if pipe is None or not pipe.alive:
                        pipe = stubs.pipe = open_pipe(
                            stubs.channel, f"/{SERVICE}/CallPipe", self.metadata, self.watchdog
                        )
            try:
                pipe.submit(message_id, encoded, timeout, done)
                if _traffic.counts is not None:
                    _traffic.sent(stubs.route, len(encoded))
                return
            except PipeClosed as exc:
                # It failed or closed just now, before taking the call: a new pipe takes it.
                failure = exc.failure
        # Two pipes in a row failed before taking the call (the peer is unreachable): the call
        # fails with their status, like a unary call to an unreachable peer.
        done(None, failure or StreamFailed(grpc.StatusCode.UNAVAILABLE, "the call pipe closed"))

    def stream(
        self, address: str, frames: Iterable[Frame], timeout: float | None
    ) -> Iterator[Frame]:
        """Streaming call: send ``frames``, iterate the reply frames (raises grpc.RpcError)."""
        return self._get(address).python_call(iter(frames), timeout=timeout, metadata=self.metadata)

    def fetch_reply(
        self, address: str, request: pb.FetchReplyRequest, timeout: float | None
    ) -> Iterator[Frame]:
        """Stream a parked reply (raises grpc.RpcError)."""
        return self._get(address).fetch_reply(request, timeout=timeout, metadata=self.metadata)

    def control(
        self,
        address: str,
        method: str,
        request: Any,
        response_cls: Any,
        timeout: float | None,
        wait_for_ready: bool = False,
    ) -> Any:
        """A plain protobuf unary call of ``method`` (raises grpc.RpcError)."""
        stub = self._get(address).control(method, response_cls)
        return stub(request, timeout=timeout, metadata=self.metadata, wait_for_ready=wait_for_ready)

    def control_future(
        self,
        address: str,
        method: str,
        request: Any,
        response_cls: Any,
        timeout: float | None,
        done: Callable[[Any], None],
    ) -> None:
        """Start a plain protobuf unary call of ``method``; ``done(grpc_future)`` runs on
        gRPC's thread when it ends."""
        stub = self._get(address).control(method, response_cls)
        fut = stub.future(request, timeout=timeout, metadata=self.metadata)
        fut.add_done_callback(done)

    def framed_control(
        self,
        address: str,
        method: str,
        frames: Iterable[Frame],
        response_cls: Any,
        timeout: float | None,
    ) -> Any:
        """Blocking framed (client-streaming) control call such as RemoteCall (raises
        grpc.RpcError)."""
        stub = self._get(address).framed_control(method, response_cls)
        return stub(iter(frames), timeout=timeout, metadata=self.metadata)

    def framed_control_future(
        self,
        address: str,
        method: str,
        frames: Iterable[Frame],
        response_cls: Any,
        timeout: float | None,
        done: Callable[[Any], None],
    ) -> None:
        """Start a framed (client-streaming) control call such as PropagateGradients;
        ``done(grpc_future)`` runs on gRPC's thread when it ends."""
        stub = self._get(address).framed_control(method, response_cls)
        fut = stub.future(iter(frames), timeout=timeout, metadata=self.metadata)
        fut.add_done_callback(done)

    def channel(self, address: str) -> grpc.Channel:
        """The (cached) channel to ``address``."""
        return self._get(address).channel

    def health(self, address: str, timeout: float) -> bytes:
        """Standard health check of the server at ``address`` (open, no token); the raw
        HealthCheckResponse. Raises grpc.RpcError when it does not answer."""
        stubs = self._get(address)
        check = stubs.channel.unary_unary(_HEALTH_CHECK)
        return check(b"", timeout=timeout)

    def drop(self, address: str) -> None:
        """Close the channel to ``address`` (its calls fail with CANCELLED); the next call
        opens a new one."""
        with self._lock:
            stubs = self._stubs.pop(address, None)
            if stubs is not None:  # and the fast-lane address that fell back to it, or back
                for alias in [a for a, s in self._stubs.items() if s is stubs]:
                    del self._stubs[alias]
        if stubs is not None:
            stubs.streams.close()
            if stubs.pipe is not None:
                stubs.pipe.cancel()
            stubs.channel.close()

    def drop_stuck(self, stubs: _Stubs) -> None:
        """A call on ``stubs``' channel cancelled at its deadline has not ended: its connection
        may be stuck (a cut link holds its writes). On a thread of its own: unless the peer
        answers a health check at once (a loaded machine, not a stuck link), shut that
        connection down (``stuck.py``), so that every call on it ends now, and close the
        channel (the next call opens a new one)."""
        threading.Thread(
            target=self._drop_if_stuck, args=(stubs,), name="gradwire-stuck", daemon=True
        ).start()

    def _drop_if_stuck(self, stubs: _Stubs) -> None:
        try:
            self.health(stubs.address, STUCK_PROBE_SECONDS)
            return  # it answers: the call will end by itself
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return  # it answered something (a lane without health): not stuck
        except Exception:  # noqa: BLE001 - closed meanwhile: nothing to shut down
            return
        shut = shut_connections_to(stubs.address)
        log.warning(
            "the connection to %s is stuck (a call cancelled at its deadline did not end and "
            "the peer does not answer): shut down %d socket(s)",
            stubs.address,
            shut,
        )
        with self._lock:
            current = self._stubs.get(stubs.address) is stubs
        if current:
            self.drop(stubs.address)

    def channel_states(self) -> dict[str, str]:
        """Connectivity of each cached channel, by address."""
        states = {}
        for address, stubs in list(self._stubs.items()):
            state = connectivity(stubs.channel)
            states[address] = "UNKNOWN" if state is None else state.name
        return states

    def close_streams(self) -> None:
        """End this worker's call streams (later blocking calls go unary): a stopping server
        gives open calls a grace period, so peers stopping at the same time would otherwise
        wait it out for each other's idle streams."""
        for stubs in list(self._stubs.values()):
            stubs.streams.close()
            if stubs.pipe is not None:
                stubs.pipe.close()

    def close(self) -> None:
        """Close every channel; calls still running fail with CANCELLED."""
        with self._lock:
            self._closed = True
            stubs, self._stubs = list(self._stubs.values()), {}
        self.watchdog.close()
        for s in stubs:
            s.streams.close()
            if s.pipe is not None:
                s.pipe.cancel()
            s.channel.close()
        if self._readers is not None:  # their streams' calls were cancelled with the channels
            self._readers.shutdown(wait=False)
