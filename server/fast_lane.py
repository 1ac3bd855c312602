"""The fast lane: a synchronous gRPC server for the latency-bound methods: Call, CallStream (one
Call per frame on a long-lived stream: what rpc_sync uses), Gradients and the control messages
that are answered at once (ReleaseContext, ForkRequest, ChildAck, RRefDelete).

Every call the asyncio server (``app.py``) serves crosses two thread switches: the I/O loop hands
it to the serving pool and the pool hands the reply back to the loop (~170 us of a ~600 us round
trip on the development machine, measured with a bare echo handler). gRPC's synchronous server
hands a call to an executor thread and answers from that thread; with gradwire's serving pool as
the executor, the handler runs the user's function right there, under the pool's slot accounting
(a handler blocked in a nested call lends its slot back, so call chains never deadlock).

The fast lane listens on a second Unix socket in the worker's private socket directory
(``WorkerInfo.local_call_address``) for peers on the same host, and on a TCP port of the main
server's host (``WorkerInfo.call_address``; not under TLS) for the others; the asyncio server
still serves every method, Call and Gradients included. Each open CallStream holds one of its
threads (waiting for the next frame without a serving slot): a caller keeps at most
``STREAMS_PER_PEER`` of them per address and closes those idle for ``STREAM_IDLE_SECONDS``. The methods are
registered with gRPC (no Python lookup per call) and take their request as raw bytes: the
handler checks the cluster token first and only then decodes (no interceptor, so nothing of
gradwire runs on gRPC's polling thread). A call that arrives before this worker finished its
rendezvous waits for it on its pool thread (at most ``init_timeout``) and only then is checked
and decoded. A reply too large for one frame, or one that comes later (``@async_execution``,
RRef arguments not confirmed yet), is parked: the caller fetches it with FetchReply from the
asyncio server, which waits for it without holding a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from gradwire import _traffic
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime.agent import AgentState
from gradwire._runtime.transport.bulk_lane import LaneStatus
from gradwire._runtime.transport.lane_io import PLAIN
from gradwire._runtime.transport.lane_pipe import read_plain_call
from gradwire._runtime.transport.transport import (
    CONTROL_REQUESTS,
    FAST_LANE_CONTROL,
    SERVICE,
    channel_options,
)
from gradwire._wire import bulk
from gradwire._wire.framing import Frame, assemble_one, decode_frame, encode_frame, one_frame
from gradwire.errors import (
    GradwireError,
    WorkerUnavailableError,
)
from gradwire.futures import Future, blocking_region

from .interceptors import not_ready_message, token_refusal
from .servicer import (
    Undecodable,
    ack_frame,
    caller_from_metadata,
    control_error_frame,
    control_reply_frame,
    control_request,
    failed_reply,
    fetch_answer,
    lenient,
    remote_ack_frame,
    serve_pipe_call,
    serve_plain_pipe_call,
    status_for,
)

__all__ = ["start_fast_lane", "FAST_LANE_METHODS"]

log = logging.getLogger(__name__)
#: The Worker methods the fast lane serves (unary and answered at once, and CallStream, whose
#: every frame is a Call).
FAST_LANE_METHODS = ("Call", "CallStream", "Gradients", *FAST_LANE_CONTROL)
_decode = lenient(decode_frame, "frame")
#: Seconds beyond which a call's time remaining means it has no deadline (a call stream).
_NO_DEADLINE = 10 * 365 * 24 * 3600.0


def _abort(context: grpc.ServicerContext, exc: BaseException) -> None:
    code, details = status_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.error("internal error in the fast lane: %r", exc, exc_info=exc)
    context.abort(code, details)


class _Lane:
    """The handlers; each runs on a serving-pool thread."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent

    def _frame(self, frame: Any, context: grpc.ServicerContext) -> tuple[Frame, int]:
        self._check(frame, context)
        return frame, self._caller(context)

    def _check(self, frame: Any, context: grpc.ServicerContext) -> None:
        agent = self._agent
        if isinstance(frame, Undecodable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, frame.error)
        try:
            _check_running(agent)
        except WorkerUnavailableError as exc:
            _abort(context, exc)

    def _caller(self, context: grpc.ServicerContext) -> int:
        return caller_from_metadata(context.invocation_metadata(), self._agent.is_member)

    def _assemble(self, frame: Frame, caller: int) -> Any:
        return assemble_one(
            frame, self._agent.options.max_message_bytes, self._agent.peer_name(caller)
        )

    def call(self, request: Any, context: grpc.ServicerContext) -> Frame:
        frame, caller = self._frame(request, context)
        return self._call(frame, caller, context)

    def call_stream(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        """CallStream: one ``call`` per request frame, each reply sent before the next request
        is read. Waiting for the next request lends the pool slot back, so an open, idle
        stream holds a thread but no serving slot."""
        caller = self._caller(context)
        while True:
            with blocking_region():
                # Neither waiting for the next frame nor answering a fetch of a set plain
                # value (no user code runs) holds a serving slot: to_here() of a ready value
                # is answered however busy the pool is.
                while True:
                    raw = next(requests, None)
                    if raw is None:  # the caller closed the stream
                        return
                    if _traffic.counts is not None:
                        _traffic.received(_traffic.FAST_LANE, len(raw))
                    frame = _decode(raw)
                    self._check(frame, context)
                    ready = self._ready_fetch(frame, caller)
                    if ready is None:
                        break
                    yield ready
            yield self._call(frame, caller, context)

    def _ready_fetch(self, frame: Frame, caller: int) -> Frame | None:
        """The answer of a fetch frame whose value is plain and set, or set within
        ``FETCH_WAIT_SECONDS`` (the RemoteCall making it is usually running on another stream
        of this lane); None for any other frame (``_call`` serves it on a slot)."""
        agent = self._agent
        if not frame.header.HasField("fetch_request"):  # (_check saw the worker running)
            return None
        request = frame.header.fetch_request
        try:
            reply = agent.rref.fetch.serve_now(request, caller, wait_seconds=FETCH_WAIT_SECONDS)
        except Exception:  # noqa: BLE001 - the pool path answers, and reports it
            return None
        if reply is None:
            return None
        return fetch_answer(agent, request, reply, caller)

    def _call(self, frame: Frame, caller: int, context: grpc.ServicerContext) -> Frame:
        if frame.header.HasField("fetch_request"):  # to_here() on a call stream
            return self._fetch(frame.header.fetch_request, caller, context)
        if frame.header.HasField("gradients"):  # PropagateGradients on a call stream
            return ack_frame(self._gradients(frame, caller, context))
        if frame.header.HasField("control"):  # an RRef control message on a call stream
            return self._control_frame(frame.header.control, caller, context)
        if frame.header.call.kind == pb.CALL_KIND_REMOTE:  # remote() on a call stream
            return self._remote(frame, caller, context)
        callee = self._agent.callee
        try:
            callee.admit(caller, fast_lane=True)
        except GradwireError as exc:
            _abort(context, exc)
        reply: Any = None
        try:
            reply = callee.handle(frame, caller)
            if isinstance(reply, Frame):  # the plain path's reply frame
                return reply
            return callee.reply_frame(reply, frame.header.call, caller)
        finally:
            if isinstance(reply, Future):  # in flight until its value is there
                reply.add_done_callback(lambda f: callee.leave(caller, failed_reply(f.value())))
            else:
                callee.leave(caller, reply is None or failed_reply(reply))

    def _control_frame(
        self, control: pb.ControlRequest, caller: int, context: grpc.ServicerContext
    ) -> Frame:
        """A control message on a call stream: served as its unary method is here (its handler
        answers at once), the response in the reply frame, an error in the reply's error."""
        agent = self._agent
        try:
            _check_running(agent)
            handler, request = control_request(agent, control)
            response = handler(request, caller)
            if isinstance(response, Future):
                response = response.wait(_wait_seconds(agent, context))  # lends the slot back
        except Exception as exc:  # noqa: BLE001 - the caller gets it as the message's error
            return control_error_frame(agent, control, exc)
        return control_reply_frame(control, response)

    def _remote(self, frame: Frame, caller: int, context: grpc.ServicerContext) -> Frame:
        """A remote() on a call stream: served as the pipe serves it (the RemoteCall handler,
        a control message: no admission), its RemoteAck in the reply frame once the function
        ran (here, on this thread, unless its RRef arguments wait for their owners: the caller
        sends such calls on the pipe, which holds no thread meanwhile); what would be the
        RemoteCall's status is the reply's error instead."""
        agent = self._agent
        call = frame.header.call
        try:
            _check_running(agent)
            ack = agent.control_handlers["RemoteCall"](self._assemble(frame, caller), caller)
            if isinstance(ack, Future):
                # Done already: the function ran in the handler, on this thread. Not when this
                # is a duplicate of a call still running elsewhere (gradwire's callers send
                # only a first attempt here, retries go on the pipe): its end is awaited (a
                # timeout would fail a creation that succeeds). Waiting lends the slot back.
                ack = ack.wait(None)
        except Exception as exc:  # noqa: BLE001 - the caller gets it as the call's error
            return one_frame(*agent.callee.encode_error(call, exc))
        return remote_ack_frame(call, ack)

    def _fetch(self, request: pb.FetchRequest, caller: int, context: grpc.ServicerContext) -> Frame:
        """A Fetch's answer, as the asyncio server gives it: made here when the value is set
        and plain (``RRefFetch.serve_now``), else by the FetchRRef handler; a value not set yet
        (or too large for one frame) is parked, so no thread waits for it here."""
        agent = self._agent
        try:
            _check_running(agent)
            try:
                reply = agent.rref.fetch.serve_now(request, caller)
            except Exception:  # noqa: BLE001 - the handler answers, and reports it
                reply = None
            if reply is None:
                reply = agent.control_handlers["FetchRRef"](request, caller)
            return fetch_answer(agent, request, reply, caller)
        except Exception as exc:  # noqa: BLE001 - becomes the call's status
            _abort(context, exc)
            raise  # pragma: no cover - abort raises

    def gradients(self, request: Any, context: grpc.ServicerContext) -> pb.GradientsAck:
        frame, caller = self._frame(request, context)
        return self._gradients(frame, caller, context)

    def _gradients(self, frame: Frame, caller: int, context: Any) -> pb.GradientsAck:
        try:
            message = self._assemble(frame, caller)
        except GradwireError as exc:
            _abort(context, exc)
        return self._control("PropagateGradients", message, caller, context)

    def control(self, method: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        """The handler of the unary control ``method`` (ReleaseContext, ForkRequest, ...)."""

        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
            caller = caller_from_metadata(context.invocation_metadata(), self._agent.is_member)
            return self._control(method, request, caller, context)

        return handle

    def _control(self, method: str, request: Any, caller: int, context: Any) -> Any:
        agent = self._agent
        handler = agent.control_handlers.get(method)
        try:
            _check_running(agent)
            if handler is None:
                raise NotImplementedError(f"worker {agent.name!r} has no handler for {method}")
            answer = handler(request, caller)
            if isinstance(answer, Future):
                answer = answer.wait(_wait_seconds(agent, context))  # lends the slot back
            return answer
        except Exception as exc:  # noqa: BLE001 - becomes the call's status
            _abort(context, exc)
            raise  # pragma: no cover - abort raises


#: How long a fetch on a call stream waits for a value not set yet (holding its stream's
#: thread, no serving slot) before it is parked for the caller to stream with FetchReply.
FETCH_WAIT_SECONDS = 0.25


def _check_running(agent: Any) -> None:
    """Raise WorkerUnavailableError when the worker is not running (not yet, or no more)."""
    if agent.state in (AgentState.SHUTDOWN, AgentState.UNINITIALIZED):
        raise WorkerUnavailableError(f"worker {agent.name!r} is not running")


def _wait_seconds(agent: Any, context: grpc.ServicerContext) -> float | None:
    """How long a handler may wait for its answer: the call's deadline; on a call stream (no
    deadline of its own: gRPC reports it as about 2**63 ns away, past what a lock's timeout
    takes) this worker's ``rpc_timeout``, or no bound when that is 0."""
    left = context.time_remaining()
    if left is None or left > _NO_DEADLINE:
        return agent.options.rpc_timeout or None
    return max(0.0, left)


def _admit(agent: Any, path: str, context: grpc.ServicerContext) -> None:
    """Abort the call unless its token matches (after waiting for the rendezvous when the call
    came before it ended, since the token may not be known until then)."""
    if not agent.is_ready():
        with blocking_region():
            ready = agent.wait_ready_blocking(agent.options.init_timeout)
        if not ready:
            context.abort(grpc.StatusCode.UNAVAILABLE, not_ready_message(agent))
    refusal = token_refusal(agent, path, context.invocation_metadata())
    if refusal is not None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)


def _guarded(
    agent: Any, method: str, behavior: Callable[[Any, grpc.ServicerContext], Any], decode: Any
) -> Callable[[bytes, grpc.ServicerContext], Any]:
    """``behavior`` behind the token check: the request arrives as raw bytes and is decoded only
    once the token matched."""
    path = f"/{SERVICE}/{method}"

    def serve(raw: bytes, context: grpc.ServicerContext) -> Any:
        _admit(agent, path, context)
        return behavior(decode(raw), context)

    return serve


def _guarded_stream(agent: Any, lane: _Lane) -> Callable[[Iterator[bytes], Any], Any]:
    """CallStream behind the token check, made once when the stream opens (its metadata is the
    stream's); its frames arrive as raw bytes and are decoded one by one afterwards."""
    path = f"/{SERVICE}/CallStream"

    def serve(requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        _admit(agent, path, context)
        return lane.call_stream(requests, context)

    return serve


def _handlers(agent: Any, lane: _Lane) -> dict[str, grpc.RpcMethodHandler]:
    # Their bytes count as the fast-lane route while metrics are on (gradwire._traffic).
    def serialize(m: Any) -> bytes:
        return m.SerializeToString()

    ser = _traffic.counting_encoder(_traffic.FAST_LANE, serialize)
    frames_in = _traffic.counting_decoder(_traffic.FAST_LANE, _decode)
    frames_out = _traffic.counting_encoder(_traffic.FAST_LANE, encode_frame)
    methods: dict[str, tuple[Any, Any, Any]] = {
        "Call": (lane.call, frames_in, frames_out),
        "Gradients": (lane.gradients, frames_in, ser),
    }
    for method in FAST_LANE_CONTROL:
        cls = CONTROL_REQUESTS[method]
        decode = _traffic.counting_decoder(
            _traffic.FAST_LANE, lenient(cls.FromString, cls.DESCRIPTOR.name)
        )
        methods[method] = (lane.control(method), decode, ser)
    # No request deserializer: gRPC would run it before the handler, so before the token check.
    handlers = {
        method: grpc.unary_unary_rpc_method_handler(
            _guarded(agent, method, behavior, decode), response_serializer=serialize
        )
        for method, (behavior, decode, serialize) in methods.items()
    }
    handlers["CallStream"] = grpc.stream_stream_rpc_method_handler(
        _guarded_stream(agent, lane), response_serializer=frames_out
    )
    return handlers


class _LaneContext:
    """What ``_Lane``'s handlers ask of their gRPC context, for a call that came on the bulk
    lane: an abort becomes the call's status record (LaneStatus), there is no deadline of
    the call's own (as on a call stream) and no metadata (the lane's handshake named the
    caller and proved its token)."""

    __slots__ = ()

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise LaneStatus(code, details)

    def time_remaining(self) -> float | None:
        return None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


def _lane_server(agent: Any, lane: _Lane) -> Callable[[str, bytes], bytes]:
    """``BulkLane.serve_call`` of ``agent``: a call that came on its bulk lane, served on the
    lane's thread as a CallStream frame is on a fast-lane thread (a fetch of a set plain
    value without a serving slot, anything else with one), its reply frame encoded."""
    pool = agent.pool
    context: Any = _LaneContext()

    def serve(peer: str, raw: bytes) -> bytes:
        pool.adopt()
        if not agent.is_ready() and not agent.wait_ready_blocking(agent.options.init_timeout):
            raise LaneStatus(grpc.StatusCode.UNAVAILABLE, not_ready_message(agent))
        known = agent.by_name.get(peer)
        caller = known.id if known is not None and agent.is_member(known.id) else -1
        frame = _decode(raw)
        lane._check(frame, context)
        reply = lane._ready_fetch(frame, caller)
        if reply is None:
            with pool.slot():
                reply = lane._call(frame, caller, context)
        return encode_frame(reply)

    return serve


def _lane_pipe_server(agent: Any) -> Callable[[str, int, bytes, Any], None]:
    """``BulkLane.serve_pipe`` of ``agent``: a call that came on a lane pipe, admitted and
    served as a ``CallPipe`` call is (``serve_pipe_call``): inline on the pipe's reader when the
    pipe allows it and a serving slot is free, else on the pool; its reply posted to the pipe.
    A PLAIN record's call (``lane_io.PLAIN``) goes to ``serve_plain_pipe_call``. Only Python
    calls come this way (anything else breaks the pipe: raises)."""
    pool = agent.pool

    def serve(peer: str, kind: int, raw: bytes, pipe: Any) -> None:
        pool.adopt()  # the reader serves under the pool's slots
        if not agent.is_ready():  # a call before the rendezvous ended waits for it (admit
            agent.wait_ready_blocking(agent.options.init_timeout)  # refuses it if in vain)
        known = agent.by_name.get(peer)
        caller = known.id if known is not None and agent.is_member(known.id) else -1
        if kind == PLAIN:
            message_id, timeout, function, data = read_plain_call(raw)
            bulk.count("pipe_calls_served")
            serve_plain_pipe_call(
                agent, message_id, timeout, function, data, caller, pipe, pipe.inline()
            )
            return
        frame = decode_frame(raw)
        header = frame.header
        if not header.HasField("call") or header.call.kind != pb.CALL_KIND_PYTHON:
            raise ValueError("a lane pipe carries Python calls only")
        bulk.count("pipe_calls_served")  # before it is answered: a caller that has its
        serve_pipe_call(agent, frame, caller, pipe, pipe.inline())  # reply sees it counted

    return serve


def start_fast_lane(agent: Any) -> grpc.Server | None:
    """Start the fast lane of ``agent`` (before the rendezvous, which advertises it): on
    ``agent.local_call_address`` for same-host peers, and on a TCP port of the main server's
    host (``agent.call_port``) for the others. None when it has neither (TLS on, or nothing
    can be bound): peers then send everything to the main server. A Unix socket that cannot
    be bound clears ``local_call_address``."""
    lane = _Lane(agent)
    if agent.bulk_lane is not None:  # calls to the fast lane over TCP may come on it instead
        agent.bulk_lane.serve_call = _lane_server(agent, lane)
        agent.bulk_lane.serve_pipe = _lane_pipe_server(agent)
    address = agent.local_call_address
    tcp = agent.options.fast_lane_tcp and not agent.options.tls_enabled
    if not address and not tcp:
        return None
    server = grpc.server(
        agent.pool,  # the serving pool is the executor: see the module docstring
        options=[
            *channel_options(agent.options),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_ping_strikes", 0),
        ],
    )
    # Registered methods: gRPC core matches the path, no Python lookup per call.
    server.add_registered_method_handlers(SERVICE, _handlers(agent, lane))
    bound = 0
    if address:
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if not bound:
            log.warning("%s: no fast lane, cannot listen on %s", agent.name, address)
            agent.local_call_address = ""
    if tcp:
        host = agent.plan.listen.rpartition(":")[0]
        try:
            agent.call_port = server.add_insecure_port(f"{host}:{agent.options.fast_lane_port}")
        except RuntimeError:
            agent.call_port = 0
        if not agent.call_port:
            log.warning("%s: no fast lane over TCP, cannot listen on %s", agent.name, host)
    if not bound and not agent.call_port:
        return None
    server.start()
    return server
