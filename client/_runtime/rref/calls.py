"""remote() on the wire: RemoteCall, both sides (to_here() is in ``fetch``).

Caller: mint the RRef's ids (``create_remote``), encode the call (forking RRef arguments),
return at once, and send the RemoteCall as gRPC futures (``send``: no thread held
while the owner runs the function), retried on transient failure (the RRefId makes it
idempotent: the owner runs the function at most once). The RemoteAck confirms the caller's
fork; it carries the creation error, if any, which the caller raises at the next use of the
RRef (``outcome.Creation``).

Owner: ``accept_remote_call``; on the first delivery decode the call and run the function once
its RRef arguments are confirmed, filling the OwnerRRef's value slot; answer every delivery
with the RemoteAck once the slot is filled.

Distributed-autograd hooks (``calls.hooks``), at the same points as for a call: ``send_call`` on the RemoteCall's
CallHeader, ``recv_call`` and ``scope`` around the function on the owner, ``send_reply`` for
the RemoteAck (its ``autograd`` travels in RemoteAck.autograd), ``recv_reply`` on its receipt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..._proto import worker_pb2 as pb
from ..._wire import calls
from ..._wire.exceptions import decode_exception, encode_exception
from ..._wire.framing import Message, encode_frame, one_frame, split
from ..._wire.pickler import EncodeContext
from ...errors import MessageTooLargeError, RpcShutdownError, RpcTimeoutError, SerializationError
from ...futures import Future
from ..calls import hooks
from ..calls.callee import ASYNC_EXECUTION_ATTR, not_a_future
from ..cluster.workers import Peer
from ..transport.resend import PipeAnswer, RetryingSend
from .errors import RRefProtocolError
from .messages import RemoteAck
from .outcome import Creation, Failure
from .protocol import RRefHandle
from .service import RRefService
from .value import ValueSlot
from .wire import from_gid, to_gid

__all__ = ["RRefCalls"]

log = logging.getLogger(__name__)


def _fill(slot: ValueSlot, fut: Future[Any]) -> None:
    try:
        exc = fut.exception()
        slot.set_value(Failure(exc) if exc is not None else fut.value())
    except RRefProtocolError:
        log.error("the value of an OwnerRRef was set twice; kept the first")


class RRefCalls:
    """RemoteCall and FetchRRef for one agent's RRef service."""

    def __init__(self, svc: RRefService) -> None:
        self.svc = svc
        svc.handlers["RemoteCall"] = self._serve_remote

    # -- remote(): caller ------------------------------------------------------------------

    def remote(
        self,
        peer: Peer,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
    ) -> tuple[RRefHandle, Creation]:
        """Start ``fn(*args, **kwargs)`` on ``peer``, its result kept there in a new OwnerRRef.

        Returns:
            The caller's user handle and its Creation.

        Raises:
            SerializationError, MessageTooLargeError: the call cannot be sent (nothing left).
            RpcShutdownError: the agent is stopping.
        """
        svc, me = self.svc, self.svc.ctx
        name, bound_self = calls.function_name(fn)
        handle = svc.protocol.create_remote(peer.id)
        svc.note_remote(handle)
        assert handle.fork_id is not None
        header = pb.CallHeader(
            message_id=svc.next_message_id(),
            caller_id=me.rank,
            kind=pb.CALL_KIND_REMOTE,
            function=name,
            rref_id=to_gid(handle.rref_id),
            fork_id=to_gid(handle.fork_id),
            timeout_seconds=timeout or 0.0,
        )
        ctx = EncodeContext(peer=peer.name, device_map=me.device_maps.request(peer.name))
        try:
            # a lane connection or write for its tensors waits no longer than the timeout
            with svc.transport.within(timeout or None) as budget:
                first, buffers = calls.encode_body(
                    pb.FrameHeader(call=header), (bound_self, tuple(args), dict(kwargs)), ctx
                )
            size = calls.total_bytes(buffers)
            if calls.payload_bytes(first, size) > me.options.max_message_bytes:
                raise MessageTooLargeError(
                    f"remote() of {name} to worker {peer.name!r} carries "
                    f"{calls.payload_bytes(first, size)} bytes, over "
                    f"max_message_bytes={me.options.max_message_bytes}"
                )
            hooks.send_call(first.call, ctx.objects.get("T", []), peer.id)
            if size <= me.options.single_frame_bytes:  # one frame: the latency path
                frames = [one_frame(first, buffers)]
                encoded = encode_frame(frames[0])
                single = True
            else:
                frames = list(split(first, buffers, me.options.chunk_bytes))
                single = False
        except BaseException as exc:
            svc.abandon_payload(ctx)
            svc.protocol.abandon_remote(handle, exc)
            raise
        if timeout and budget.spent:  # what encoding waited on the network counts too
            timeout = max(0.001, timeout - budget.spent)
        creation = Creation(f"remote({name}) on worker {peer.name!r}", timeout)
        call = first.call
        if hooks.needed(call):  # a dist autograd context, or metrics: they track the ack
            hooks.call_started(call, peer.id, creation.answered(), creation.deadline, "remote")

        def done(ack: pb.RemoteAck | None, error: BaseException | None) -> None:
            try:
                self._acked(peer, call, handle, creation, ack, error)
            finally:
                svc.track(-1)

        # Delivery keeps trying past the user's timeout (which Creation enforces), so that a
        # slow function still confirms the caller's fork and its RRef is deleted, not leaked.
        deadline = time.monotonic() + (timeout or 0.0) + svc.control_budget
        svc.track(1)

        # A one-frame call whose function runs when it arrives (not @async_execution, no RRef
        # argument to wait for) goes on a call stream of the owner's fast lane: sent from this
        # thread and served on the callee's stream thread, it skips the pipe's thread
        # hand-offs on both sides, which a to_here() right after it waits for.
        # Only the first attempt: a retry (the first one timed out: a slow function, or a lost
        # answer) goes on the pipe, whose wait for a call still running holds no thread; on a
        # stream each attempt would hold one of the owner's threads until the function ends.
        streamed = [
            single
            and peer.call_dial != peer.dial
            and not ctx.objects.get("R")
            and not getattr(fn, ASYNC_EXECUTION_ATTR, False)
        ]

        def start(seconds: float, settled: Callable[[Any], None]) -> None:
            if single:  # on the call pipe, with rpc_async's calls: no gRPC call of its own
                answer = PipeAnswer(me, settled, _remote_ack, "a remote() reply")
                first, streamed[0] = streamed[0], False
                # The first attempt may leave its answer parked on the lane for to_here().
                if first and svc.transport.stream_call(
                    peer.call_dial, encoded, seconds, answer.done, peer, creation.park
                ):
                    return  # else every stream is busy: the pipe
                svc.transport.pipe_call(peer.dial, call.message_id, encoded, seconds, answer.done)
            else:
                svc.transport.framed_control_future(
                    peer.dial, "RemoteCall", frames, pb.RemoteAck, seconds, settled
                )

        RetryingSend(
            svc.pool,
            svc.is_lost,
            peer,
            "RemoteCall",
            start,
            deadline,
            done,
            lambda: svc.emit("RemoteCall", "sent", handle.rref_id, handle.fork_id, peer.id),
        ).start()
        return handle, creation

    def _acked(
        self,
        peer: Peer,
        call: pb.CallHeader,
        handle: RRefHandle,
        creation: Creation,
        ack: pb.RemoteAck | None,
        error: BaseException | None,
    ) -> None:
        svc, me = self.svc, self.svc.ctx
        assert handle.fork_id is not None
        creation.take_parked()  # answered: nothing is left to go behind
        if ack is None:
            assert error is not None
            svc.fail_fork(handle.fork_id, error)
            if isinstance(error, RpcTimeoutError):
                error = creation.timed_out()
            creation.future.set_result(Failure(error))
            return
        svc.emit("RemoteAck", "received", handle.rref_id, handle.fork_id, peer.id)
        svc.send(svc.protocol.handle(RemoteAck(me.rank, handle.rref_id, handle.fork_id)))
        reply = pb.ReplyHeader(message_id=call.message_id)
        if ack.HasField("autograd"):
            reply.autograd.CopyFrom(ack.autograd)
        if ack.HasField("profile"):
            reply.profile.CopyFrom(ack.profile)
        hooks.recv_reply(call, reply, [], peer.id)
        if ack.HasField("error"):
            creation.future.set_result(Failure(decode_exception(ack.error, me.policy, me.name)))
        elif creation.past_deadline():
            creation.settle_late()  # the fork is confirmed (and deleted later) all the same
        else:
            creation.future.set_result(None)

    def remote_to_self(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RRefHandle:
        """remote() to this worker: a local OwnerRRef filled by ``fn`` on the serving pool.

        Arguments are passed as they are (no copy); the caller's dist-autograd context is
        current while ``fn`` runs.
        """
        svc = self.svc
        handle = svc.protocol.create_owner()
        header = pb.CallHeader(
            message_id=svc.next_message_id(),
            caller_id=svc.ctx.rank,
            kind=pb.CALL_KIND_REMOTE,
            function=getattr(fn, "__qualname__", repr(fn)),
        )
        hooks.send_call(header, [], svc.ctx.rank)
        is_async = bool(getattr(fn, ASYNC_EXECUTION_ATTR, False))

        def thunk() -> Any:
            with hooks.scope(header, svc.ctx.rank):
                return _checked(fn(*args, **kwargs), is_async, header.function)

        assert handle.value is not None
        slot = handle.value

        def run() -> None:
            svc.run_when_confirmed([], thunk, is_async).add_done_callback(lambda f: _fill(slot, f))

        try:
            svc.pool.run(run)
        except RuntimeError as exc:
            svc.enqueue_release(handle)
            raise RpcShutdownError(f"the RPC agent of {svc.ctx.name!r} is stopping") from exc
        return handle

    # -- remote(): owner -------------------------------------------------------------------

    def _serve_remote(self, message: Message, caller_id: int) -> Future[pb.RemoteAck]:
        svc = self.svc
        svc._inject("RemoteCall", "before")  # noqa: SLF001 - the tests' fault hook
        call = message.header.call
        if not message.header.HasField("call") or call.kind != pb.CALL_KIND_REMOTE:
            raise SerializationError("RemoteCall without a CALL_KIND_REMOTE CallHeader")
        rref_id, fork_id = from_gid(call.rref_id), from_gid(call.fork_id)
        svc.emit("RemoteCall", "received", rref_id, fork_id, caller_id)
        accepted = svc.protocol.accept_remote_call(rref_id, fork_id, caller_id)
        slot = accepted.handle.value if accepted.handle is not None else None
        if slot is not None and accepted.run:
            self._start(call, message, caller_id, slot)
        svc._inject("RemoteCall", "after")  # noqa: SLF001
        out: Future[pb.RemoteAck] = Future()

        def answer(_: Any = None) -> None:
            ack = pb.RemoteAck(rref_id=call.rref_id, fork_id=call.fork_id)
            try:
                reply = pb.ReplyHeader(message_id=call.message_id)
                hooks.send_reply(call, reply, [], caller_id)
                if reply.HasField("autograd"):
                    ack.autograd.CopyFrom(reply.autograd)
                if reply.HasField("profile"):
                    ack.profile.CopyFrom(reply.profile)
                value = slot.wait(0) if slot is not None else None
                if isinstance(value, Failure):
                    ack.error.CopyFrom(encode_exception(value.fresh(), svc.ctx.name))
            finally:
                svc.emit("RemoteAck", "sent", rref_id, fork_id, caller_id)
                out.set_result(ack)

        if slot is None:
            answer()
        else:
            slot.add_done_callback(answer)
        return out

    def _start(
        self, call: pb.CallHeader, message: Message, caller_id: int, slot: ValueSlot
    ) -> None:
        svc, me = self.svc, self.svc.ctx
        try:
            fn = calls.resolve_function(me.policy, call.function, me.name)
            body, dctx = calls.decode_body(
                message,
                {"policy": me.policy, "peer": me.peer_name(caller_id), "worker": me.name},
            )
            if not (isinstance(body, tuple) and len(body) == 3):
                raise SerializationError("malformed remote() body: expected (self, args, kwargs)")
            bound_self, args, kwargs = body
            hooks.recv_call(call, dctx.objects.get("T", []), caller_id)
        except BaseException as exc:  # noqa: BLE001 - the creation error
            slot.set_value(Failure(exc))
            return
        is_async = bool(getattr(fn, ASYNC_EXECUTION_ATTR, False))

        def thunk() -> Any:
            with hooks.scope(call, caller_id):
                if bound_self is not calls.NO_SELF:
                    result = fn(bound_self, *args, **kwargs)
                else:
                    result = fn(*args, **kwargs)
            return _checked(result, is_async, call.function)

        pending = svc.unconfirmed(dctx.objects.get("R", []))
        fut = svc.run_when_confirmed(pending, thunk, is_async)
        fut.add_done_callback(lambda f: _fill(slot, f))


def _checked(result: Any, is_async: bool, function: str) -> Any:
    if is_async and not isinstance(result, Future):
        raise not_a_future(function, result)
    return result


def _remote_ack(reply: pb.ReplyHeader) -> pb.RemoteAck | None:
    return reply.remote_ack if reply.HasField("remote_ack") else None
