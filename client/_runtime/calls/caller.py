"""The outgoing half of a worker: encode a call, send it, turn the reply into a Future.

``rpc_sync`` and ``rpc_async`` share this one path; ``routes.choose_route`` picks how the call
travels (``rpc_sync`` waits on the caller's thread over a long-lived call stream, ``rpc_async``
sends its frame down the peer's call pipe, whose reader thread completes it, a call too large
for one frame goes as a framed stream) and which of the callee's servers it reaches. User calls are never retried;
control messages are retried with backoff (``send_control``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from ..._proto import worker_pb2 as pb
from ..._wire import calls, pickler, shm
from ..._wire.exceptions import decode_exception
from ..._wire.framing import (
    Assembler,
    Frame,
    Message,
    assemble_one,
    encode_frame,
    one_frame,
    split,
)
from ..._wire.pickler import EncodeContext
from ...errors import (
    GradwireError,
    InvalidFutureStateError,
    MessageTooLargeError,
    RpcError,
    RpcShutdownError,
    SerializationError,
    WorkerUnavailableError,
)
from ...futures import Future, blocking_region
from ..cluster.context import WorkerContext
from ..cluster.events import ClusterEvents
from ..cluster.workers import Peer
from ..transport.lane_io import PIPE as LANE_FRAME
from ..transport.lane_io import PLAIN as PLAIN_RECORD
from ..transport.lane_pipe import plain_call
from ..transport.loop import in_loop_thread
from ..transport.retry import retry_with_backoff
from ..transport.transport import FAST_LANE_CONTROL, Transport, map_rpc_error
from . import hooks
from .callee import ASYNC_EXECUTION_ATTR
from .pipe import PlainReply, deferred_callbacks
from .pool import ServingPool
from .routes import CALL_STREAM, PIPE, choose_route

__all__ = ["Caller"]

log = logging.getLogger(__name__)


def _left_of(timeout: float | None, started: float) -> float | None:
    """What is left of ``timeout`` seconds since ``started`` (at least a millisecond: the call
    then fails as timed out)."""
    return None if timeout is None else max(0.001, timeout - (time.monotonic() - started))


#: rpc_async calls that can go on the peer's lane pipe do (``transport.lane_pipe``); tests turn
#: it off to keep them on the gRPC pipe.
ASYNC_ON_LANE = True


class Caller:
    """Sends calls for one worker and tracks the pending ones.

    Args:
        ctx: the worker's identity, options, policy and peers.
        transport: the outbound gRPC calls.
        pool: the serving pool (completions that may run user callbacks go there).
        events: the peers declared lost (control messages to them stop retrying).
        abandon: gives back the RRef forks made while encoding a payload that never left.
    """

    def __init__(
        self,
        ctx: WorkerContext,
        transport: Transport,
        pool: ServingPool,
        events: ClusterEvents,
        abandon: Callable[[EncodeContext], None],
    ) -> None:
        self._ctx = ctx
        self._transport = transport
        self._pool = pool
        self._events = events
        self._abandon = abandon
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.pending: dict[int, Future[Any]] = {}
        #: message id -> destination worker id, for failing one peer's calls (liveness).
        self._dest: dict[int, int] = {}
        #: Shared-memory tensors of pending calls, given back to their pool when the call ends.
        self._shm_sent: dict[int, list[pb.TensorMeta]] = {}

    def call(
        self,
        peer: Peer,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
        blocking: bool,
        kind: int = pb.CALL_KIND_PYTHON,
    ) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` on ``peer``.

        Args:
            peer: destination.
            fn: the callable (sent by qualified name).
            args, kwargs: its arguments (tensors travel as raw frames).
            timeout: seconds, or None for no deadline.
            blocking: wait on this thread (rpc_sync) instead of returning at once.

        Returns:
            A Future of the result (already done when ``blocking``).

        Raises:
            SerializationError: ``fn`` or the arguments cannot be sent (raised at once).
            MessageTooLargeError: the payload exceeds ``max_message_bytes``.
        """
        if blocking and in_loop_thread():
            raise RpcError(
                "rpc_sync() on gradwire's I/O loop thread would deadlock; use rpc_async()"
            )
        # rpc_sync: the arguments' bulk-lane bytes and the call itself on one lane connection;
        # waiting on the lane for them (a connection, a write) counts against the call's timeout.
        with (
            self._transport.pinned(peer, here=blocking),
            self._transport.within(timeout) as budget,
        ):
            me = self._ctx
            name, bound_self = calls.function_name(fn)
            header = pb.CallHeader(
                message_id=next(self._ids),
                caller_id=me.rank,
                kind=kind,  # type: ignore[arg-type]
                function=name,
                timeout_seconds=timeout or 0.0,
            )
            first, buffers, ctx = self._encode(peer, name, header, (bound_self, args, kwargs))
            call = first.call
            hooks.send_call(call, ctx.objects.get("T", []) if ctx else (), peer.id)
            fut: Future[Any] = Future()
            shared = [m for m in first.payload.tensors if m.HasField("shm")] if ctx else []
            with self._lock:
                self.pending[call.message_id] = fut
                self._dest[call.message_id] = peer.id
                if shared:
                    self._shm_sent[call.message_id] = shared
            # The call's clock starts once it is encoded (pickling does not count, as in
            # PyTorch), less what encoding waited on the network.
            started = time.monotonic() - budget.spent
            hooked = hooks.needed(call)
            if hooked:  # a dist autograd context, or metrics: they track the answer
                hooks.call_started(
                    call,
                    peer.id,
                    fut,
                    started + timeout if timeout else None,
                    "rpc_sync" if blocking else "rpc_async",
                )
            if ctx is None:  # plain arguments: already one whole frame
                single, frame = True, Frame(first, buffers)
            else:
                single = calls.total_bytes(buffers) <= me.options.single_frame_bytes
                if single:
                    frame = one_frame(first, buffers)
            what = f"rpc to {name}"
            budget.deadline = None  # the call's own timeout rules from here
            reply_later = bool(
                getattr(fn, ASYNC_EXECUTION_ATTR, False) or (ctx and ctx.objects.get("R"))
            )
            choice = choose_route(
                peer, one_frame=single, blocking=blocking, reply_later=reply_later
            )
            if choice.route is PIPE:
                self._start_async(
                    peer,
                    choice.address,
                    frame,
                    call,
                    fut,
                    what,
                    started,
                    timeout,
                    not reply_later,
                    ctx is None and not hooked,  # plain: no side table, nothing for a hook
                )
                return fut

            def run() -> None:
                try:
                    with blocking_region():
                        if choice.route is CALL_STREAM:
                            left = _left_of(timeout, started)
                            reply = self._transport.call(choice.address, frame, left, peer)
                            msg = self._assemble_one(peer, reply)
                        else:  # FRAMED_STREAM
                            frames = split(first, buffers, me.options.chunk_bytes)
                            replies = self._transport.stream(
                                choice.address, frames, _left_of(timeout, started)
                            )
                            msg = self._assemble(peer, replies)
                    self._finish(peer, call, msg, fut, what, started, timeout)
                except grpc.RpcError as exc:
                    self._fail(fut, map_rpc_error(exc, peer.name, what, started, timeout))
                except BaseException as exc:  # noqa: BLE001 - delivered to the future
                    self._fail(fut, exc)
                finally:
                    self._forget(call.message_id)

            if blocking:
                run()
            else:
                self._pool.run(run)
            return fut

    def _encode(
        self, peer: Peer, name: str, header: pb.CallHeader, body: Any
    ) -> tuple[pb.FrameHeader, list[Any], EncodeContext | None]:
        """A call's first header, its buffers and the EncodeContext that collected its side
        tables; None instead of a context for plain arguments that fit in one frame (pickled by
        the C pickler, nothing to collect, the header already says it is the last frame)."""
        me = self._ctx
        limit = me.options.max_message_bytes
        plain = pickler.dumps_plain(body)
        if plain is not None and len(plain) <= min(limit, me.options.single_frame_bytes):
            first = pb.FrameHeader(call=header, last=True)  # the whole message in one frame
            first.payload.pickle_nbytes = len(plain)
            return first, [plain], None
        ctx = EncodeContext(peer=peer.name, device_map=me.device_maps.request(peer.name))
        try:
            first, buffers = calls.encode_body(pb.FrameHeader(call=header), body, ctx)
            size = calls.payload_bytes(first, calls.total_bytes(buffers))
            if size > limit:
                raise MessageTooLargeError(
                    f"call of {name} to worker {peer.name!r} carries {size} bytes, over "
                    f"max_message_bytes={limit}"
                )
        except BaseException:
            # Nothing left: give back the RRef forks made while encoding the arguments.
            self._abandon(ctx)
            calls.give_back(ctx)  # and the shared-memory segments and bulk-lane transfers
            raise
        return first, buffers, ctx

    def _start_async(
        self,
        peer: Peer,
        dial: str,
        frame: Frame,
        call: pb.CallHeader,
        fut: Future[Any],
        what: str,
        started: float,
        timeout: float | None,
        lane_ok: bool = False,
        plain: bool = False,
    ) -> None:

        def on_done(reply: Frame | PlainReply | None, error: grpc.RpcError | None) -> None:
            # Runs on the pipe's reader thread (or the watchdog's), which must not block: a
            # plain reply is decoded and its future completed right here (one thread switch
            # less). One with callbacks is completed here too on a lane pipe's reader, after
            # the round of replies it read (it hands its reading over if a callback blocks:
            # lane_pipe.PipeReader); anything else is handed to the serving pool.
            decoded: tuple[bool, Any] | None = None
            msg: Message | None = None
            if isinstance(reply, PlainReply):
                decoded = self._plain_reply(peer, call, reply)
            elif reply is not None:
                try:
                    msg = self._assemble_one(peer, reply)
                    if not msg.header.reply.continuation:
                        decoded = self._decode_reply(peer, call, msg)
                except BaseException as exc:  # noqa: BLE001 - delivered to the future
                    decoded = (False, exc)
            if decoded is not None:
                if fut._complete_unless_callbacks(*decoded):
                    self._forget(call.message_id)
                    return
                later = deferred_callbacks()
                if later is not None:  # completed (callbacks and all) after this round's reads
                    later.append((fut, *decoded))
                    self._forget(call.message_id)
                    return

            def complete() -> None:
                try:
                    if decoded is not None:
                        self._deliver(fut, *decoded)
                    elif msg is not None:
                        self._finish(peer, call, msg, fut, what, started, timeout)
                    else:
                        assert error is not None
                        self._fail(fut, map_rpc_error(error, peer.name, what, started, timeout))
                except BaseException as exc:  # noqa: BLE001 - delivered to the future
                    self._fail(fut, exc)
                finally:
                    self._forget(call.message_id)

            try:
                self._pool.run(complete)
            except RuntimeError:  # pool closed during shutdown
                complete()

        # What encoding waited on the network (a bulk-lane connection) already counts.
        left = _left_of(timeout, started)
        encoded = None
        if lane_ok and ASYNC_ON_LANE:
            # On the peer's lane pipe when it has one: written from this thread with whatever
            # queued meanwhile, the replies of every peer read by one thread (docs/wire.md). A
            # plain call goes as a PLAIN record, without its protobuf header, when the peer
            # takes those (``lane_pipe.plain_call``).
            if plain and peer.lane_plain:
                body = plain_call(
                    call.message_id, call.timeout_seconds, call.function, frame.raw[0]
                )
                kind = PLAIN_RECORD
            else:
                body = encoded = encode_frame(frame)
                kind = LANE_FRAME
            try:
                if self._transport.lane_pipe_call(peer, call.message_id, body, left, on_done, kind):
                    return
            except GradwireError:  # shut down before anything was sent: the pipe says how
                pass
        if encoded is None:
            encoded = encode_frame(frame)
        try:
            self._transport.pipe_call(dial, call.message_id, encoded, left, on_done)
        except GradwireError as exc:
            self._fail(fut, exc)
            self._forget(call.message_id)

    def _assemble_one(self, peer: Peer, frame: Frame) -> Message:
        return assemble_one(frame, self._ctx.options.max_message_bytes, peer.name)

    def _assemble(self, peer: Peer, frames: Iterable[Frame]) -> Message:
        asm = Assembler(self._ctx.options.max_message_bytes, peer.name)
        for frame in frames:
            if asm.feed(frame):
                break
        if asm.message is None or not asm.complete:
            raise SerializationError(f"reply from worker {peer.name!r} ended before its last frame")
        return asm.message

    def _finish(
        self,
        peer: Peer,
        call: pb.CallHeader,
        msg: Message,
        fut: Future[Any],
        what: str,
        started: float,
        timeout: float | None,
    ) -> None:
        me = self._ctx
        reply = msg.header.reply
        if reply.continuation:
            left = None if timeout is None else max(0.001, timeout - (time.monotonic() - started))
            request = pb.FetchReplyRequest(continuation=reply.continuation, caller_id=me.rank)
            try:
                with blocking_region():
                    msg = self._assemble(
                        peer, self._transport.fetch_reply(peer.dial, request, left)
                    )
            except grpc.RpcError as exc:
                self._fail(fut, map_rpc_error(exc, peer.name, what, started, timeout))
                return
            reply = msg.header.reply
        self._deliver(fut, *self._decode_reply(peer, call, msg))

    def _plain_reply(self, peer: Peer, call: pb.CallHeader, reply: PlainReply) -> tuple[bool, Any]:
        """(True, value) of a lane pipe's PLAIN reply (or (False, exception): it is not a
        pickle of plain data)."""
        self._ctx.peers.heard[peer.id] = time.monotonic()
        ok, value = pickler.loads_plain(reply.data)
        if not ok:
            return False, SerializationError(
                f"worker {peer.name!r} answered {call.function} with a PLAIN reply that is not "
                "a pickle of plain data"
            )
        if hooks.needed(call):  # a hook came meanwhile: it sees the answer as it would a frame's
            hooks.recv_reply(call, pb.ReplyHeader(message_id=call.message_id), (), peer.id)
        return True, value

    def _decode_reply(self, peer: Peer, call: pb.CallHeader, msg: Message) -> tuple[bool, Any]:
        """(True, value) or (False, exception) for a complete reply message."""
        me = self._ctx
        me.peers.heard[peer.id] = time.monotonic()
        reply = msg.header.reply
        if reply.HasField("error"):
            return False, decode_exception(reply.error, me.policy, me.name)
        payload = msg.header.payload
        if not (payload.tensors or payload.rrefs):
            ok, body = pickler.loads_plain(msg.pickle)
            if ok:  # plain data: no side-table objects for the hooks
                if hooks.needed(call):
                    hooks.recv_reply(call, reply, (), peer.id)
                return True, body
        body, dctx = calls.decode_body(
            msg, {"policy": me.policy, "peer": peer.name, "worker": me.name}
        )
        hooks.recv_reply(call, reply, dctx.objects.get("T", []), peer.id)
        return True, body

    @staticmethod
    def _deliver(fut: Future[Any], ok: bool, value: Any) -> None:
        # A non-graceful shutdown may have failed the future already (fail_all).
        try:
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        except InvalidFutureStateError:
            pass

    @classmethod
    def _fail(cls, fut: Future[Any], exc: BaseException) -> None:
        cls._deliver(fut, False, exc)

    def _forget(self, message_id: int) -> None:
        with self._lock:
            self.pending.pop(message_id, None)
            self._dest.pop(message_id, None)
            shared = self._shm_sent.pop(message_id, None)
        if shared:
            # Frees the segments of a call the callee never took (refused, peer dead); a no-op
            # for those it took, whose tickets it already cleared (see gradwire._wire.shm).
            shm.cancel(shared)

    def fail_peer(
        self,
        worker_id: int,
        reason: str,
        error: type[WorkerUnavailableError] = WorkerUnavailableError,
    ) -> int:
        """Fail every pending call to ``worker_id`` with ``error(reason)`` (it is lost, or it
        departed); how many. Each future gets its own exception object."""
        with self._lock:
            doomed = [(m, f) for m, f in self.pending.items() if self._dest.get(m) == worker_id]
        for message_id, fut in doomed:
            self._fail(fut, error(reason))
            # Not pending any more, whether or not its transport ever reports back (a call a
            # cut link holds may never be answered): a graceful shutdown must not wait for it.
            self._forget(message_id)
        return len(doomed)

    def fail_all(self, reason: str) -> None:
        """Fail every pending call with RpcShutdownError (non-graceful shutdown)."""
        with self._lock:
            pending = list(self.pending.values())
        for fut in pending:
            self._fail(fut, RpcShutdownError(reason))

    def wait_pending(self, deadline: float) -> bool:
        """Wait until no call is pending or ``deadline`` (monotonic) passes; True if drained."""
        while True:
            with self._lock:
                pending = list(self.pending.values())
            if not pending:
                return True
            for fut in pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:
                    fut.wait(left)
                except TimeoutError:
                    return False
                except BaseException:  # noqa: BLE001 - the caller of that future sees it
                    pass

    def send_control(
        self,
        peer: Peer,
        method: str,
        request: Any,
        response_cls: Any,
        timeout: float,
        on_attempt: Callable[[int], None] | None = None,
    ) -> Any:
        """Send an idempotent control message, retrying on UNAVAILABLE / DEADLINE_EXCEEDED.

        Args:
            peer: destination.
            method: Worker RPC name ("ForkRequest", "ChildAck", "RRefDelete", ...).
            request: the protobuf request.
            response_cls: the protobuf response type.
            timeout: total seconds over all attempts.

        Returns:
            The response.

        Raises:
            RpcTimeoutError / WorkerUnavailableError after the last attempt; other errors at once.
        """
        started = time.monotonic()

        def attempt(left: float) -> Any:
            try:
                with blocking_region():
                    return self._transport.control(
                        peer.call_dial if method in FAST_LANE_CONTROL else peer.dial,
                        method,
                        request,
                        response_cls,
                        left,
                    )
            except grpc.RpcError as exc:
                error = map_rpc_error(exc, peer.name, method, started, timeout)
                if self._events.is_lost(peer.id):
                    # Declared lost (or departed): retrying until the deadline would only stall the sender
                    # (e.g. a survivor's shutdown sending RRefDeletes to a dead owner).
                    raise _PeerLost(error) from exc
                raise error from exc

        try:
            return retry_with_backoff(attempt, started + timeout, what=f"{method} to {peer.name}")
        except _PeerLost as gone:
            raise gone.error from None


class _PeerLost(Exception):
    """Stops the retries of a control message to a peer the failure detector declared lost."""

    def __init__(self, error: GradwireError) -> None:
        super().__init__(error)
        self.error = error
