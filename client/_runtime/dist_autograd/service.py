"""Distributed autograd on a running agent: call hooks, PropagateGradients, ReleaseContext.

``engine`` is the protocol (contexts, send/recv functions, the FAST-mode engine);
this module connects it to the worker's calls and transport:

- as a call hook, it stamps every call made inside a context with the context id, records a
  send function for the tensors that require grad (with a fresh autograd message id), and on
  the other side records the recv function and makes the context current while the function
  runs, so nested calls join it. Replies get their own pair; a call that carried tensors
  requiring grad always gets a reply pair, even an empty one (see ``dist_autograd``).
- as the engine's transport, it sends gradients with PropagateGradients (never retried: it
  accumulates) and releases contexts with ReleaseContext (idempotent, retried).
- it serves both methods, and forwards a release to the workers the context talked to.
- it tracks each call made in a context until its answer arrives (``inflight``), so a pass
  started meanwhile waits for the reply pair instead of missing the gradients behind it.

Reclaiming contexts whose originator died: when the failure detector declares a peer lost
(the agent calls ``on_peer_lost``) every context that peer created is released here. Contexts of
live originators are released by their ``with context()`` exit.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from ..._proto import worker_pb2 as pb
from ..._tensor import Tensor
from ..._wire import calls
from ..._wire.exceptions import decode_exception, encode_exception
from ..._wire.framing import Message, one_frame, split
from ..._wire.pickler import EncodeContext
from ...errors import (
    RpcShutdownError,
    RpcTimeoutError,
    SerializationError,
    WorkerUnavailableError,
)
from ...futures import Future, blocking_region
from ..calls import hooks
from ..calls.pool import ServingPool
from ..cluster.context import WorkerContext
from ..cluster.events import ControlEvents
from ..transport.resend import RetryingSend, start_control
from ..transport.transport import Transport, map_rpc_error
from .engine import (
    ContextError,
    DistAutogradContainer,
    DistAutogradEngine,
    record_recv,
    record_send,
)
from .inflight import Call

#: How long a clean-up message (ReleaseContext) is retried at most while its peer is not
#: declared lost (then it waits for the peer to answer again: ``on_peer_back``).
CLEANUP_SECONDS = 600.0
#: How long released context ids are remembered when calls have no deadline (rpc_timeout 0).
_NO_DEADLINE_MEMORY = 600.0

__all__ = ["DistAutogradService", "to_gid", "from_gid"]

log = logging.getLogger(__name__)
_SHIFT = 48
_MASK = (1 << _SHIFT) - 1


def to_gid(message_id: int) -> pb.GloballyUniqueId:
    """An autograd message id ((worker << 48) + counter) as the wire's GloballyUniqueId."""
    return pb.GloballyUniqueId(created_on=message_id >> _SHIFT, local_id=message_id & _MASK)


def from_gid(gid: pb.GloballyUniqueId) -> int:
    return (gid.created_on << _SHIFT) + gid.local_id


def _grad_tensors(tensors: Sequence[Any]) -> list[Tensor]:
    return [t for t in tensors if isinstance(t, Tensor) and t.requires_grad]


class DistAutogradService(hooks.CallHook):
    """Distributed autograd of one worker (created with its agent, dropped at its shutdown).

    Args:
        me: the worker's identity, options and peers.
        transport: sends the gradients.
        pool: where gradients are sent from and releases run.
        control: the WatchControl events (ReleaseContext sent and received).
        is_lost: whether the failure detector declared a worker (by id) lost.
    """

    #: Its receive, scope and reply hooks return at once for a call with no autograd context.
    context_only = True

    def __init__(
        self,
        me: WorkerContext,
        transport: Transport,
        pool: ServingPool,
        control: ControlEvents,
        is_lost: Callable[[int], bool],
    ) -> None:
        self.me = me
        self.transport = transport
        self.pool = pool
        self._control = control
        self._is_lost = is_lost
        self._lock = threading.Lock()
        #: worker id -> contexts whose release did not reach it (sent again if it answers)
        self._undelivered: dict[int, set[int]] = {}
        self._ids = itertools.count(3 << 40)  # control message ids (the RRef service: 1 << 40)
        opts = me.options
        # Released context ids are remembered at least as long as a call can be in flight.
        in_flight = 2 * opts.rpc_timeout if opts.rpc_timeout > 0 else _NO_DEADLINE_MEMORY
        self.container = DistAutogradContainer(
            me.rank, released_ttl=max(opts.rref_tombstone_ttl, in_flight)
        )
        self.engine = DistAutogradEngine(self.container, self, me.name)
        #: Worker method -> handler, registered by the agent (``Agent.register_control_handler``).
        self.handlers: dict[str, Callable[..., Any]] = {
            "PropagateGradients": self._on_gradients,
            "ReleaseContext": self._on_release,
        }
        hooks.register(self)

    def close(self) -> None:
        """Stop hooking calls (the agent is shutting down)."""
        hooks.unregister(self)

    # -- call hooks ------------------------------------------------------------------------------
    def on_send_call(self, header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
        ctx_id = self.container.current_id()
        if ctx_id is None:
            return
        header.autograd.context_id = ctx_id
        ctx = self.container.get(ctx_id)
        with ctx.lock:
            # The callee joins the context whatever the call carries (it makes it current while
            # the function runs), so it is released there too when the context ends.
            ctx.known_workers.add(peer)
        sent = _grad_tensors(tensors)
        if sent:
            mid = self.container.next_message_id()
            header.autograd.message_id.CopyFrom(to_gid(mid))
            record_send(ctx, sent, peer, mid)

    def on_call_started(
        self,
        call: pb.CallHeader,
        peer: int,
        done: Future[Any],
        deadline: float | None,
        verb: str,
    ) -> None:
        # Only a call that sent tensors requiring grad has a send function here that its
        # answer's pair releases. Others are not waited for: a pass must not wait for a call
        # that waits for the pass (RRef.backward's call to the owner).
        if not call.HasField("autograd") or not call.autograd.HasField("message_id"):
            return
        try:
            ctx = self.container.get(call.autograd.context_id)
        except ContextError:  # released meanwhile: no pass of it will run here
            return
        name = self.me.peer_name(peer)
        if call.kind == pb.CALL_KIND_REMOTE:
            what = f"remote({call.function}) on worker {name!r}"
        else:
            what = f"rpc to {call.function} on worker {name!r}"
        timeout = call.timeout_seconds or None
        ctx.calls.add(Call(what, done, timeout, deadline))

    def on_recv_call(self, header: pb.CallHeader, tensors: Sequence[Any], peer: int) -> None:
        if not header.HasField("autograd") or not header.autograd.context_id:
            return
        ctx = self.container.get_or_create(header.autograd.context_id)
        with ctx.lock:
            ctx.known_workers.add(peer)
        if header.autograd.HasField("message_id"):
            got = _grad_tensors(tensors)
            record_recv(ctx, got, peer, from_gid(header.autograd.message_id))

    def scope(self, call: pb.CallHeader, peer: int) -> contextlib.AbstractContextManager[Any]:
        if not call.HasField("autograd") or not call.autograd.context_id:
            return contextlib.nullcontext()
        return self._current(call.autograd.context_id)

    @contextlib.contextmanager
    def _current(self, ctx_id: int) -> Iterator[None]:
        prev = self.container.set_current(ctx_id)
        try:
            yield
        finally:
            self.container.set_current(prev)

    def on_send_reply(
        self, call: pb.CallHeader, header: pb.ReplyHeader, tensors: Sequence[Any], peer: int
    ) -> None:
        if not call.HasField("autograd") or not call.autograd.context_id:
            return
        sent = _grad_tensors(tensors)
        if not sent and not call.autograd.HasField("message_id"):
            return
        try:
            ctx = self.container.get_or_create(call.autograd.context_id)
        except ContextError:  # released before the answer (a remote() that timed out): no
            return  # pass of it can run any more, so the answer needs no send/recv pair
        mid = self.container.next_message_id()
        header.autograd.context_id = ctx.context_id
        header.autograd.message_id.CopyFrom(to_gid(mid))
        record_send(ctx, sent, peer, mid)

    def on_recv_reply(
        self, call: pb.CallHeader, header: pb.ReplyHeader, tensors: Sequence[Any], peer: int
    ) -> None:
        if not header.HasField("autograd") or not header.autograd.HasField("message_id"):
            return
        try:
            ctx = self.container.get_or_create(header.autograd.context_id)
        except ContextError:  # released while the call was in flight: the pair is not needed
            return
        fn = record_recv(ctx, _grad_tensors(tensors), peer, from_gid(header.autograd.message_id))
        fn.forward_was_reply = True  # its gradients go back by our own map (docs/gpu.md)

    # -- the engine's transport ---------------------------------------------------------------------
    def send_gradients(
        self,
        dst: int,
        context_id: int,
        message_id: int,
        pass_id: int,
        retain_graph: bool,
        grads: list[Any],
        here: bool = False,
    ) -> Future[Any]:
        me = self.me
        peer = me.peers[dst]
        # Sent from this thread: its bulk-lane bytes and the message on one lane connection.
        with self.transport.pinned(peer, here=here):
            out: Future[Any] = Future()
            head = pb.GradientsHeader(
                context_id=context_id,
                message_id=to_gid(message_id),
                sender_id=me.rank,
                retain_graph=retain_graph,
                pass_id=pass_id,
            )
            try:
                ectx = EncodeContext(
                    peer=peer.name, device_map=self._gradient_map(peer.name, context_id, message_id)
                )
                first, buffers = calls.encode_body(
                    pb.FrameHeader(gradients=head), list(grads), ectx
                )
                size = calls.total_bytes(buffers)
                if size <= me.options.single_frame_bytes:
                    frames = [one_frame(first, buffers)]
                else:
                    frames = list(split(first, buffers, me.options.chunk_bytes))
            except BaseException as exc:  # noqa: BLE001 - delivered to the future
                out.set_exception(exc)
                return out
            started = time.monotonic()
            timeout = me.options.rpc_timeout or None
            what = "PropagateGradients"

            def run() -> None:
                # A blocking call (a serving thread lends its slot back while it waits): a gRPC
                # future on an idle channel would start a channel-polling thread per send.
                try:
                    with blocking_region():
                        if len(frames) == 1:  # the latency path: one frame on a call stream
                            reply = self.transport.call(peer.call_dial, frames[0], timeout, peer)
                            head = reply.header.reply
                            ack = pb.GradientsAck(
                                error=head.error if head.HasField("error") else None
                            )
                        else:
                            ack = self.transport.framed_control(
                                peer.dial, "PropagateGradients", frames, pb.GradientsAck, timeout
                            )
                except grpc.RpcError as exc:
                    out.set_exception(map_rpc_error(exc, peer.name, what, started, timeout))
                    return
                except BaseException as exc:  # noqa: BLE001 - delivered to the future
                    out.set_exception(exc)
                    return
                if ack.HasField("error"):
                    out.set_exception(decode_exception(ack.error, me.policy, me.name))
                else:
                    out.set_result(None)

            if here:  # the engine's thread waits for this answer next: it makes the call itself
                run()
                return out
            try:
                self.pool.run(run)
            except RuntimeError as exc:  # the serving pool is closed: the agent is shutting down
                out.set_exception(
                    RpcShutdownError(f"cannot send gradients to {peer.name!r}: {exc}")
                )
            return out

    def _gradient_map(self, peer: str, context_id: int, message_id: int) -> Any:
        """Gradients go back by the inverse of the map their forward message travelled by."""
        try:
            recv = self.container.get(context_id).recv_function(message_id)
        except Exception:  # noqa: BLE001 - a released context: no tensors will be sent anyway
            recv = None
        was_reply = bool(getattr(recv, "forward_was_reply", False))
        return self.me.device_maps.gradients(peer, was_reply)

    def release_context(self, dst: int, context_id: int) -> Future[Any]:
        """Tell worker ``dst`` to drop the context: a control frame sent from this thread
        (on its bulk lane, where the answer may wait parked for the next call to ``dst``, e.g.
        the next step's forward call), retried until the rpc_timeout."""
        me = self.me
        out: Future[Any] = Future()
        peer = me.peers[dst]
        body = pb.ReleaseContextRequest(
            context_id=context_id, sender_id=me.rank
        ).SerializeToString()

        def start(seconds: float, settled: Callable[[Any], None]) -> None:
            start_control(
                self.transport,
                me,
                peer,
                next(self._ids),
                "ReleaseContext",
                body,
                pb.Ack,
                seconds,
                settled,
                quick=True,  # answered at once (``_on_release``)
            )

        def done(_: Any, error: BaseException | None) -> None:
            if error is None:
                out.set_result(None)
                return
            if isinstance(error, (WorkerUnavailableError, RpcTimeoutError)):
                # Not delivered (the peer lost, or cut off): sent again if it answers again,
                # so no context is left behind after a healed partition.
                with self._lock:
                    self._undelivered.setdefault(dst, set()).add(context_id)
            out.set_exception(error)

        self._control.emit(
            pb.ControlEvent(
                kind="ReleaseContext",
                direction="sent",
                peer=peer.name,
                time=time.time(),
                context_id=context_id,
            )
        )
        # Retried until delivered or the peer is declared lost (its failures make it a suspect),
        # however short the rpc_timeout: a release given up on would leave the context there.
        deadline = time.monotonic() + max(me.options.rpc_timeout or 60.0, CLEANUP_SECONDS)
        RetryingSend(
            self.pool, self._is_lost, peer, "ReleaseContext", start, deadline, done
        ).start()
        return out

    # -- served methods ------------------------------------------------------------------------
    def _on_gradients(self, message: Message, caller_id: int) -> Future[pb.GradientsAck]:
        me = self.me
        head = message.header.gradients
        grads = calls.decode_body(
            message,
            {"policy": me.policy, "peer": me.peer_name(caller_id), "worker": me.name},
        )[0]
        # The gradients are the only holders of their arrays from here on, so the context's
        # store may keep a received gradient without a copy, as PyTorch does.
        message.arrays.clear()
        if not isinstance(grads, list):  # a malformed message (found by the fuzzer): refused
            raise SerializationError(
                f"PropagateGradients from worker {me.peer_name(caller_id)!r} carries a "
                f"{type(grads).__name__}, not a list of gradients"
            )
        fut = self.engine.on_gradients(
            head.context_id, from_gid(head.message_id), head.pass_id, head.retain_graph, grads
        )

        def ack(f: Future[Any]) -> pb.GradientsAck:
            exc = f.exception()
            if exc is None:
                return pb.GradientsAck()
            return pb.GradientsAck(error=encode_exception(exc, me.name))

        return fut.then(ack)

    def _on_release(self, request: pb.ReleaseContextRequest, caller_id: int) -> pb.Ack:
        self._control.emit(
            pb.ControlEvent(
                kind="ReleaseContext",
                direction="received",
                peer=self.me.peer_name(caller_id),
                time=time.time(),
                context_id=request.context_id,
            )
        )
        self.release_everywhere(request.context_id, exclude=caller_id)
        return pb.Ack()

    # -- releasing ---------------------------------------------------------------------------
    def release_everywhere(self, context_id: int, exclude: int | None = None) -> list[Future[Any]]:
        """Drop the context here and tell every worker it talked to (they forward it on)."""
        ctx = self.container.release(context_id)
        if ctx is None:
            return []
        with ctx.lock:
            # Only cluster members: an anonymous caller (-1, a raw gRPC client) has no address.
            peers = sorted(
                w for w in ctx.known_workers - {self.me.rank, exclude} if w in self.me.peers
            )
        futures = []
        for dst in peers:
            fut = self.release_context(dst, context_id)
            fut.add_done_callback(_log_failure(context_id, dst))
            futures.append(fut)
        return futures

    def on_peer_back(self, worker_id: int) -> None:
        """``worker_id``, declared lost or unreachable, answers again: tell it to drop the
        contexts whose release it missed."""
        with self._lock:
            missed = sorted(self._undelivered.pop(worker_id, ()))
        for context_id in missed:
            log.info("ReleaseContext %d sent again to worker %d", context_id, worker_id)
            self.release_context(worker_id, context_id).add_done_callback(
                _log_failure(context_id, worker_id)
            )

    def on_peer_lost(self, worker_id: int) -> None:
        """Reclaim the contexts a dead worker created."""
        for ctx_id in self.container.contexts_of(worker_id):
            log.info(
                "releasing dist autograd context %d: its originator %d is gone", ctx_id, worker_id
            )
            self.release_everywhere(ctx_id, exclude=worker_id)

    def debug_info(self) -> dict[str, Any]:
        return {"num_autograd_contexts": len(self.container)}


def _log_failure(context_id: int, dst: int) -> Any:
    def cb(f: Future[Any]) -> None:
        exc = f.exception()
        if exc is not None:
            log.warning("ReleaseContext %d to worker %d failed: %s", context_id, dst, exc)

    return cb
