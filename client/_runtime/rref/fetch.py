"""to_here() on the wire: FetchRRef, both sides.

The user sends FetchRequest to the owner (with the dist-autograd metadata ``hooks.send_call``
stamped on a CallHeader made for the fetch); the owner answers once the OwnerRRef's value slot
is filled, with the value as a framed payload (tensors as raw frames, RRefs inside it forked to
the user) and the ReplyHeader autograd of ``hooks.send_reply`` in ``FetchHeader.autograd``, or
with the creation error; the user decodes it and calls ``hooks.recv_reply``.
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from ..._proto import worker_pb2 as pb
from ..._tensor import Tensor
from ..._wire import bulk, calls, shm
from ..._wire.exceptions import decode_exception, encode_exception
from ..._wire.framing import Assembler, Frame
from ..._wire.pickler import EncodeContext
from ...errors import MessageTooLargeError, SerializationError
from ...futures import Future, blocking_region
from ..calls import hooks
from ..calls.callee import Reply
from ..transport.lane_calls import Parked
from ..transport.transport import map_rpc_error
from .errors import UnknownRRefError
from .outcome import Failure
from .protocol import RRefHandle
from .service import RRefService
from .value import ValueSlot
from .wire import from_gid, to_gid

__all__ = ["RRefFetch", "OFF_LOOP"]

#: ``serve_now``'s answer on the loop for a value to encode on a thread that may block.
OFF_LOOP = object()

#: Values other than tensors that ``serve_now`` encodes on the I/O loop (no user code runs).
_PLAIN = (bool, int, float)


def fetch_frame(request: pb.FetchRequest) -> Frame:
    """``request`` as the one frame a call stream (or ``Call``) carries: the owner answers it
    with the frame ``Fetch`` would return."""
    return Frame(pb.FrameHeader(fetch_request=request, payload=pb.Payload(), last=True), ())


class RRefFetch:
    """FetchRRef for one agent's RRef service (serves the owner side)."""

    def __init__(self, svc: RRefService) -> None:
        self.svc = svc
        svc.handlers["FetchRRef"] = self._serve_fetch

    # -- to_here(): user -------------------------------------------------------------------

    def fetch(self, handle: RRefHandle, timeout: float | None, behind: Parked | None = None) -> Any:
        """The value of the OwnerRRef behind user ``handle``, from its owner; right behind its
        RemoteCall on the same bulk-lane connection when that call's answer is ``behind``,
        parked (this thread then reads the RemoteAck too).

        Raises:
            The creation error; RpcTimeoutError; WorkerUnavailableError; SerializationError.
        """
        svc, me = self.svc, self.svc.ctx
        peer = me.peers[handle.owner_id]
        header = pb.CallHeader(
            message_id=svc.next_message_id(), caller_id=me.rank, function="to_here"
        )
        hooks.send_call(header, [], peer.id)
        request = pb.FetchRequest(rref_id=to_gid(handle.rref_id), caller_id=me.rank)
        if handle.fork_id is not None:
            request.fork_id.CopyFrom(to_gid(handle.fork_id))
        if header.HasField("autograd"):
            request.autograd.CopyFrom(header.autograd)
        svc.emit("FetchRRef", "sent", handle.rref_id, handle.fork_id, peer.id)
        started = time.monotonic()
        asm = Assembler(me.options.max_message_bytes, peer.name)
        try:
            with blocking_region():
                # One frame on a call stream of the owner's fast lane (the latency path, as
                # rpc_sync's; its asyncio server without one): a set plain value is answered
                # there without a serving slot, however busy the pool is; a large value, or
                # one still to come, is parked and streamed with FetchReply.
                frame = svc.transport.call(
                    peer.call_dial, fetch_frame(request), timeout, peer, behind
                )
                cont = frame.header.fetch.continuation
                if not cont:
                    asm.feed(frame)
                else:
                    left = (
                        None
                        if timeout is None
                        else max(0.001, timeout - (time.monotonic() - started))
                    )
                    parked = pb.FetchReplyRequest(continuation=cont, caller_id=me.rank)
                    for frame in svc.transport.fetch_reply(peer.dial, parked, left):
                        if asm.feed(frame):
                            break
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, peer.name, "to_here()", started, timeout) from exc
        msg = asm.message
        if msg is None or not asm.complete:
            raise SerializationError(f"to_here() reply from {peer.name!r} ended early")
        fetched = msg.header.fetch
        if fetched.HasField("error"):
            raise decode_exception(fetched.error, me.policy, me.name)
        body, dctx = calls.decode_body(
            msg, {"policy": me.policy, "peer": peer.name, "worker": me.name}
        )
        reply = pb.ReplyHeader(message_id=header.message_id)
        if fetched.HasField("autograd"):
            reply.autograd.CopyFrom(fetched.autograd)
        hooks.recv_reply(header, reply, dctx.objects.get("T", []), peer.id)
        return body

    # -- to_here(): owner ------------------------------------------------------------------

    def _serve_fetch(self, request: pb.FetchRequest, caller_id: int) -> Future[Reply]:
        svc = self.svc
        rref_id = from_gid(request.rref_id)
        svc.emit("FetchRRef", "received", rref_id, None, caller_id)
        out: Future[Reply] = Future()
        try:
            slot = svc.protocol.owner_value(rref_id)
        except UnknownRRefError as exc:
            out.set_result(self._fetch_error(request, exc))
            return out
        call = pb.CallHeader(caller_id=caller_id, function="to_here")
        if request.HasField("autograd"):
            call.autograd.CopyFrom(request.autograd)

        if slot.done():  # already on a serving thread: encode here
            out.set_result(self._encode_fetch(request, call, slot, caller_id))
            return out

        def encode() -> None:
            out.set_result(self._encode_fetch(request, call, slot, caller_id))

        def ready(_: ValueSlot) -> None:
            if svc.pool.on_pool_thread():  # filled by the function's own serving thread
                encode()
                return
            try:  # filled elsewhere (an async_execution Future's thread): encoding may run
                svc.pool.run(encode)  # user code (reducers), so it goes to the pool
            except RuntimeError:  # pool closed
                encode()

        slot.add_done_callback(ready)
        return out

    def serve_now(
        self,
        request: pb.FetchRequest,
        caller_id: int,
        may_block: bool = True,
        wait_seconds: float = 0.0,
    ) -> Reply | None | object:
        """The FetchRRef answer made on the calling thread (the I/O loop's), or None when it
        must be made on the serving pool: the value is not set yet, is not a plain CPU tensor
        (or None, bool, int, float) of at most ``single_frame_bytes``, is a tensor for the
        caller's bulk lane, or the fetch carries dist-autograd metadata.

        ``may_block`` False (the I/O loop, which never waits on a socket): a tensor for the
        caller's bulk lane is not encoded here; ``OFF_LOOP`` says to call again from a thread
        that may block (not the serving pool: a busy pool must not delay a ready value). Encoding such a value runs no user code (no reducer,
        no hook) and copies no more than the one-frame reply the loop assembles anyway, so the
        latency path skips a hand-off to the pool and back.

        ``wait_seconds``: how long a value not set yet is waited for here (a fast-lane stream
        thread, which holds no serving slot meanwhile: the RemoteCall that sets it is usually
        running on another one).
        """
        if request.HasField("autograd"):
            return None
        svc = self.svc
        try:
            slot = svc.protocol.owner_value(from_gid(request.rref_id))
        except UnknownRRefError:
            return None  # the pool path answers with the error
        if not slot.done():
            if wait_seconds <= 0:
                return None
            try:
                slot.wait(wait_seconds)  # an error set in it is raised: the pool path answers
            except TimeoutError:
                return None
        value = slot.wait(0)
        if type(value) is Tensor:
            size = value.numel() * value.element_size()
            if value.is_cuda or size > svc.ctx.options.single_frame_bytes:
                return None
            peer = svc.ctx.peer_name(caller_id)
            if not may_block and bulk.takes(peer, size) and not shm.takes(peer, size):
                return OFF_LOOP  # its bytes go over the bulk lane
        elif value is not None and type(value) not in _PLAIN:
            return None
        svc.emit("FetchRRef", "received", from_gid(request.rref_id), None, caller_id)
        call = pb.CallHeader(caller_id=caller_id, function="to_here")
        return self._encode_fetch(request, call, slot, caller_id)

    def _encode_fetch(
        self, request: pb.FetchRequest, call: pb.CallHeader, slot: ValueSlot, caller_id: int
    ) -> Reply:
        me = self.svc.ctx
        value = slot.wait(0)
        if isinstance(value, Failure):
            return self._fetch_error(request, value.fresh())
        peer = me.peer_name(caller_id)
        ctx = EncodeContext(peer=peer, device_map=me.device_maps.reply(peer))  # inverse map
        try:
            first, buffers = calls.encode_body(
                pb.FrameHeader(fetch=pb.FetchHeader(rref_id=request.rref_id)), value, ctx
            )
            size = calls.total_bytes(buffers)
            if size > me.options.max_message_bytes:
                raise MessageTooLargeError(
                    f"the value of RRef {from_gid(request.rref_id)} is {size} bytes, over "
                    f"max_message_bytes={me.options.max_message_bytes} of {me.name!r}"
                )
            reply = pb.ReplyHeader()
            hooks.send_reply(call, reply, ctx.objects.get("T", []), caller_id)
            if reply.HasField("autograd"):
                first.fetch.autograd.CopyFrom(reply.autograd)
            return first, buffers
        except BaseException as exc:  # noqa: BLE001 - sent as the fetch's error
            self.svc.abandon_payload(ctx)
            return self._fetch_error(request, exc)

    def _fetch_error(self, request: pb.FetchRequest, exc: BaseException) -> Reply:
        head = pb.FetchHeader(
            rref_id=request.rref_id, error=encode_exception(exc, self.svc.ctx.name)
        )
        return pb.FrameHeader(fetch=head, payload=pb.Payload()), []
