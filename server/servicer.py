"""The Worker servicer: thin async methods that decode frames, call the agent, encode replies.

Registered as a generic handler with gradwire's frame (de)serializers. Errors that are not the
user's (in-flight limit, a stopped worker, missing extension handlers, rendezvous conflicts) are
mapped to gRPC status codes here, in :func:`status_for`; user exceptions and policy refusals
travel inside the reply frame and are rebuilt on the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from gradwire import _traffic
from gradwire._proto import worker_pb2 as pb
from gradwire._runtime.agent import AgentState
from gradwire._runtime.calls.callee import Reply, plain_header, until_done
from gradwire._runtime.cluster import profile_session
from gradwire._runtime.rref.errors import RRefProtocolError
from gradwire._runtime.rref.fetch import OFF_LOOP
from gradwire._runtime.transport.transport import CONTROL_REQUESTS, SERVICE
from gradwire._wire.framing import (
    Assembler,
    Frame,
    Message,
    decode_frame,
    encode_frame,
    one_frame,
    split,
    split_batches,
    unpack_batch,
)
from gradwire.errors import (
    AuthenticationError,
    GradwireError,
    MessageTooLargeError,
    RpcInitError,
    SerializationError,
    TooManyRequestsError,
    WorkerUnavailableError,
)
from gradwire.futures import Future

from .interceptors import CALLER_KEY, has_token

__all__ = [
    "WorkerServicer",
    "status_for",
    "caller_from_metadata",
    "serve_pipe_call",
    "serve_plain_pipe_call",
]

log = logging.getLogger(__name__)
#: The longest window of the Profile method (gradwire profile --seconds).
MAX_PROFILE_SECONDS = 3600.0


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status for an error that ends a call outside the reply frame (the only place)."""
    if isinstance(exc, TooManyRequestsError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, MessageTooLargeError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, WorkerUnavailableError):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, AuthenticationError):
        return grpc.StatusCode.UNAUTHENTICATED, str(exc)
    if isinstance(exc, RpcInitError):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, RRefProtocolError):  # a request about an RRef this worker cannot honour
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED, str(exc)
    if isinstance(exc, (SerializationError, ValueError)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"


def _caller_id(context: grpc.aio.ServicerContext, is_member: Callable[[int], bool]) -> int:
    return caller_from_metadata(context.invocation_metadata(), is_member)


def caller_from_metadata(metadata: Any, is_member: Callable[[int], bool]) -> int:
    """The caller's worker id from metadata; -1 (anonymous) unless it names a cluster member
    (``is_member``, the agent's), so a forged id can never index the worker table (dist
    autograd remembers callers)."""
    for key, value in metadata or ():
        if key == CALLER_KEY:
            try:
                caller = int(value)
            except ValueError:
                break
            return caller if is_member(caller) else -1
    return -1


def failed_reply(reply: Any) -> bool:
    """Whether a reply (a Frame, or a header and its buffers) carries an error."""
    header = reply.header if isinstance(reply, Frame) else reply[0]
    return bool(header.reply.HasField("error"))


def _value_or_error(fut: Future[Any], callee: Any, call: pb.CallHeader) -> Any:
    """A settled Future's reply, or the error reply of its exception."""
    try:
        return fut.value()
    except BaseException as exc:  # noqa: BLE001 - the caller gets it as its error
        return callee.encode_error(call, exc)


def serve_pipe_call(
    agent: Any,
    frame: Frame,
    caller: int,
    replies: Any,
    inline: contextlib.AbstractContextManager[Any] | None = None,
) -> None:
    """Admit a pipe's Python call and serve it, posting its encoded reply to ``replies.post``
    (a reply that comes later is posted when it does, holding no thread meanwhile). From the
    I/O loop (a gRPC ``CallPipe``: on the pool) or a bulk lane's reader (a lane pipe: with
    ``inline``, right here inside it when a serving slot is free, else on the pool)."""
    callee = agent.callee
    call = frame.header.call

    def error_frame(exc: BaseException) -> Frame:
        return one_frame(*callee.encode_error(call, exc))

    try:
        callee.admit(caller)
    except GradwireError as exc:
        replies.post(encode_frame(error_frame(exc)))
        return

    def finish(reply: Any) -> None:  # any thread: the reply is there
        encoded = None
        try:
            if not isinstance(reply, Frame):
                reply = callee.reply_frame(reply, call, caller)
            encoded = encode_frame(reply)
        except BaseException as exc:  # noqa: BLE001 - the caller gets it as its error
            reply = error_frame(exc)
            encoded = encode_frame(reply)
        finally:
            callee.leave(caller, reply is None or failed_reply(reply))
            replies.post(encoded)

    def run() -> None:  # on the pool
        try:
            reply = callee.handle(frame, caller)
        except BaseException as exc:  # noqa: BLE001 - the caller gets it as its error
            reply = callee.encode_error(call, exc)
        if isinstance(reply, Future):  # @async_execution, or RRef arguments to confirm
            reply.add_done_callback(lambda f: finish(_value_or_error(f, callee, call)))
        else:
            finish(reply)

    pool = agent.pool
    if inline is not None and pool.try_slot():
        try:
            with inline:
                run()
        finally:
            pool.release_slot()
        return
    try:
        pool.run(run)
    except RuntimeError as exc:  # the pool closed: the worker is stopping
        callee.leave(caller, True)
        replies.post(encode_frame(error_frame(exc)))


def serve_plain_pipe_call(
    agent: Any,
    message_id: int,
    timeout: float,
    function: str,
    data: memoryview,
    caller: int,
    pipe: Any,
    inline: contextlib.AbstractContextManager[Any] | None,
) -> None:
    """A lane pipe's PLAIN call (``lane_io.PLAIN``; ``timeout`` 0.0: none): when it may be
    served inline (``inline``, a free serving slot) and is plain here too
    (``Callee.plain_call``), run right here by ``Callee.run_plain``, its plain value posted as
    a PLAIN reply (``pipe.post_plain``) or else its reply frame; otherwise served as the frame
    it stands for, exactly as a PIPE record's (``serve_pipe_call``)."""
    callee = agent.callee
    if inline is not None:
        plain = callee.plain_call(function, data)
        if plain is not None:
            pool = agent.pool
            if pool.try_slot():
                try:
                    with inline:
                        reply = callee.run_plain(message_id, timeout, function, plain, caller)
                finally:
                    pool.release_slot()
                if isinstance(reply, Frame):
                    pipe.post(encode_frame(reply))
                else:
                    pipe.post_plain(message_id, reply)
                return
            inline = None  # no free slot: the pool serves it
    header = pb.FrameHeader(call=plain_header(message_id, timeout, function), last=True)
    header.call.caller_id = caller
    header.payload.pickle_nbytes = data.nbytes
    serve_pipe_call(agent, Frame(header, (data,)), caller, pipe, inline)


class _PipeReplies:
    """A CallPipe's replies on their way back: encoded on any thread (``post``), taken in
    batches by the I/O loop (``take``), which is woken once per burst rather than per reply.

    Args:
        loop: the I/O loop the pipe's generator runs on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[bytes] = []
        self._running = 0  # calls started and not posted yet
        self._wake_due = False  # a wake is scheduled on the loop and has not run yet
        self._event = asyncio.Event()

    def started(self) -> None:
        """On the loop: a call of the pipe is being served."""
        with self._lock:
            self._running += 1

    def post(self, encoded: bytes | None) -> None:
        """Any thread: a call's encoded reply (None: nothing to send, the call is done)."""
        with self._lock:
            if encoded is not None:
                self._ready.append(encoded)
            self._running -= 1
            if self._wake_due:
                return
            self._wake_due = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop closed: the worker stopped, nobody takes replies
            pass

    def wake(self) -> None:
        """On the loop: let ``take`` look again (the requests ended)."""
        self._event.set()

    def _wake(self) -> None:
        with self._lock:
            self._wake_due = False
        self._event.set()

    async def take(self) -> list[bytes]:
        """The replies posted since the last take (waits for one, or for a wake)."""
        while True:
            with self._lock:
                out, self._ready = self._ready, []
            if out:
                return out
            await self._event.wait()
            self._event.clear()
            with self._lock:
                out, self._ready = self._ready, []
            return out

    def idle(self) -> bool:
        """No call is being served and no reply waits."""
        with self._lock:
            return not self._running and not self._ready


async def _await_value(value: Any) -> Any:
    if isinstance(value, Future):
        await until_done(value)
        return value.value()
    return value


class WorkerServicer:
    """Implements gradwire.v1.Worker for one agent."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent

    # -- helpers -------------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._agent.state in (AgentState.SHUTDOWN, AgentState.UNINITIALIZED):
            raise WorkerUnavailableError(f"worker {self._agent.name!r} is not running")

    async def _on_pool(self, core: Any, *args: Any) -> Any:
        """Run the synchronous ``core(*args)`` on the serving pool; a Future it returns (a
        reply that comes later) is awaited without holding any thread."""
        out = await asyncio.wrap_future(self._agent.pool.submit(core, *args))
        return await _await_value(out)

    async def _fail(self, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        code, details = status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.error("internal error in %s: %r", self._agent.name, exc, exc_info=exc)
        await context.abort(code, details)

    def _assembler(self, caller: int) -> Assembler:
        return Assembler(self._agent.options.max_message_bytes, self._agent.peer_name(caller))

    async def _serve(self, msg: Message, caller: int) -> tuple[pb.FrameHeader, list[Any]]:
        if not msg.header.HasField("call"):
            raise SerializationError("the first frame of a call carries no CallHeader")
        reply: tuple[pb.FrameHeader, list[Any]] = await self._on_pool(
            self._agent.callee.serve_blocking, msg, caller
        )
        return reply

    # -- user calls ----------------------------------------------------------------------------

    async def Call(self, frame: Frame, context: grpc.aio.ServicerContext) -> Frame:  # noqa: N802
        if frame.header.HasField("fetch_request"):  # to_here() on a call stream
            return await self.fetch_one(frame.header.fetch_request, context)
        if frame.header.HasField("gradients"):  # PropagateGradients on a call stream
            ack = await self.framed_control_one("PropagateGradients", frame, context)
            return ack_frame(ack)
        caller = _caller_id(context, self._agent.is_member)
        if frame.header.HasField("control"):  # an RRef control message on a call stream
            return await self._pipe_control(frame.header.control, caller)
        if frame.header.call.kind == pb.CALL_KIND_REMOTE:  # remote() on a call stream
            return await self._pipe_remote(frame, caller)
        callee = self._agent.callee
        try:
            callee.admit(caller)
        except GradwireError as exc:
            await self._fail(context, exc)
        reply: Any = None
        try:
            reply = await self._on_pool(callee.handle, frame, caller)
            if isinstance(reply, Frame):  # the plain path's reply frame
                return reply
            return callee.reply_frame(reply, frame.header.call, caller)
        finally:
            callee.leave(caller, reply is None or failed_reply(reply))

    async def CallStream(  # noqa: N802
        self, frames: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Frame]:
        """``Call`` once per request frame, each reply sent before the next frame is read
        (rpc_sync's transport; same-host callers use the fast lane's)."""
        async for frame in frames:
            await _refuse(frame, context)
            yield await self.Call(frame, context)

    async def CallPipe(  # noqa: N802
        self, batches: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """rpc_async's transport (worker.proto, ``calls.pipe``): every call frame of every
        request batch is served at once, as ``Call`` would serve it, and the replies go back
        in batches as they are ready. When the caller ends its requests, the pipe ends after
        the last reply.

        A Python call is served on the pool from start to encoded reply and posted back
        (``_PipeReplies``): the I/O loop wakes once per burst of replies, not once per call;
        control messages and remote() frames take the loop's coroutines."""
        caller = _caller_id(context, self._agent.is_member)
        replies = _PipeReplies(asyncio.get_running_loop())
        tasks: set[asyncio.Future[None]] = set()

        async def serve(frame: Frame) -> None:
            encoded = None
            try:
                encoded = encode_frame(await self._pipe_reply(frame, caller))
            finally:
                replies.post(encoded)

        async def read() -> None:
            try:
                async for batch in batches:
                    # A malformed batch or frame (no call to answer) ends the pipe.
                    for frame in _pipe_frames(batch):
                        replies.started()
                        header = frame.header
                        if header.HasField("control") or header.call.kind == pb.CALL_KIND_REMOTE:
                            task = asyncio.ensure_future(serve(frame))
                            tasks.add(task)
                            task.add_done_callback(tasks.discard)
                        else:
                            serve_pipe_call(self._agent, frame, caller, replies)
            finally:
                replies.wake()

        reader = asyncio.ensure_future(read())
        try:
            while True:
                out = await replies.take()
                for batch in split_batches(out):  # each within gRPC's message limit
                    if _traffic.counts is not None:
                        _traffic.sent(_traffic.GRPC, len(batch))
                    yield batch
                if reader.done() and replies.idle():
                    break
            error = reader.exception()
            if error is not None:
                await self._fail(context, error)
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _pipe_reply(self, frame: Frame, caller: int) -> Frame:
        """The reply frame of a pipe's control message or remote() (an error reply for a
        refusal); its Python calls are ``serve_pipe_call``'s."""
        if frame.header.HasField("control"):
            return await self._pipe_control(frame.header.control, caller)
        return await self._pipe_remote(frame, caller)

    async def _pipe_control(self, control: pb.ControlRequest, caller: int) -> Frame:
        """A control message on the pipe: served as its unary method is (its handler on the
        pool, no admission), the response in the reply frame; what the method would end with
        as its status is the reply's error instead."""
        try:
            self._check_alive()
            handler, request = control_request(self._agent, control)
            response = await self._on_pool(handler, request, caller)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the caller gets it as the message's error
            return control_error_frame(self._agent, control, exc)
        return control_reply_frame(control, response)

    async def _pipe_remote(self, frame: Frame, caller: int) -> Frame:
        """A remote() on the pipe: served as ``Remote`` serves it (the RemoteCall handler, a
        control message: no admission), its RemoteAck sent in the reply frame; what ``Remote``
        would end with as its status is the reply's error instead."""
        call = frame.header.call
        try:
            self._check_alive()
            asm = self._assembler(caller)
            if not asm.feed(frame):
                raise SerializationError("single-frame RemoteCall without its last frame")
            handler = self._agent.control_handlers["RemoteCall"]
            ack = await self._on_pool(handler, asm.message, caller)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the caller gets it as the call's error
            return one_frame(*self._agent.callee.encode_error(call, exc))
        return remote_ack_frame(call, ack)

    async def PythonCall(  # noqa: N802
        self, frames: AsyncIterator[Frame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Frame]:
        caller = _caller_id(context, self._agent.is_member)
        try:
            self._agent.callee.admit(caller)
        except GradwireError as exc:
            await self._fail(context, exc)
        failed = True
        try:
            asm = self._assembler(caller)
            call = pb.CallHeader()
            try:
                async for frame in frames:
                    if asm.message is None and frame.header.HasField("call"):
                        call = frame.header.call
                    if asm.feed(frame):
                        break
                if asm.message is None or not asm.complete:
                    raise SerializationError("call stream ended before its last frame")
                first, buffers = await self._serve(asm.message, caller)
            except GradwireError as exc:
                first, buffers = self._agent.callee.encode_error(call, exc)
            failed = first.reply.HasField("error")
            for out in split(first, buffers, self._agent.options.chunk_bytes):
                yield out
        finally:
            self._agent.callee.leave(caller, failed)

    async def FetchReply(  # noqa: N802
        self, request: pb.FetchReplyRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Frame]:
        reply = await self._agent.callee.take_parked_reply(
            request.continuation, _caller_id(context, self._agent.is_member)
        )
        if reply is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"worker {self._agent.name!r} has no parked reply {request.continuation}",
            )
        first, buffers = reply
        for out in split(first, buffers, self._agent.options.chunk_bytes):
            yield out

    # -- rendezvous, barrier, inspection -------------------------------------------------------

    async def Join(
        self, request: pb.JoinRequest, context: grpc.aio.ServicerContext
    ) -> pb.JoinReply:  # noqa: N802
        try:
            authenticated = has_token(self._agent, context.invocation_metadata())
            return await self._agent.serve_join(request, authenticated)
        except GradwireError as exc:
            await self._fail(context, exc)
            raise  # pragma: no cover - abort raises

    async def Barrier(  # noqa: N802
        self, request: pb.BarrierRequest, context: grpc.aio.ServicerContext
    ) -> pb.BarrierReply:
        barriers = self._agent.barriers
        if barriers is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "barriers are hosted by rank 0"
            )
        timeout = context.time_remaining() or self._agent.options.rpc_timeout
        return await barriers.arrive(
            request.name, request.generation, request.worker_id, max(0.0, timeout - 1)
        )

    async def GetDebugInfo(  # noqa: N802
        self, request: pb.DebugInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.DebugInfo:
        return debug_info_message(self._agent.debug_info())

    async def WatchControl(  # noqa: N802
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ControlEvent]:
        queue: asyncio.Queue[pb.ControlEvent] = asyncio.Queue()
        kinds = {k for k in request.kinds if k}
        self._agent.add_watcher(queue)
        try:
            while True:
                event = await queue.get()
                if not kinds or event.kind in kinds:
                    yield event
        finally:
            self._agent.remove_watcher(queue)

    async def Profile(  # noqa: N802
        self, request: pb.ProfileWindow, context: grpc.aio.ServicerContext
    ) -> pb.ProfileDump:
        """Record everything this worker does for ``request.seconds``, then return it
        (``gradwire profile``); a cancelled call stops the recording."""
        seconds = request.seconds
        if not 0 < seconds <= MAX_PROFILE_SECONDS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Profile: seconds must be in (0, {MAX_PROFILE_SECONDS:g}], got {seconds!r}",
            )
        session = secrets.token_hex(8)
        try:
            profile_session.start(session, request.record_shapes)
        except RuntimeError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        try:
            await asyncio.sleep(seconds)
        finally:
            dump = profile_session.stop(session, self._agent.rank, self._agent.name)
        return dump

    # -- extension methods (RRef protocol, dist autograd) ------------------------------------

    async def control(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Serve a unary control method through the handler registered for it."""
        handler = self._agent.control_handlers.get(method)
        if handler is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"worker {self._agent.name!r} has no handler for {method}",
            )
        try:
            self._check_alive()
            value = await asyncio.wrap_future(
                self._agent.pool.submit(
                    handler, request, _caller_id(context, self._agent.is_member)
                )
            )
            return await _await_value(value)
        except Exception as exc:
            await self._fail(context, exc)

    async def framed_control(
        self, method: str, frames: AsyncIterator[Frame], context: grpc.aio.ServicerContext
    ) -> Any:
        """Serve a stream-in control method (RemoteCall, PropagateGradients)."""
        caller = _caller_id(context, self._agent.is_member)
        asm = self._assembler(caller)
        try:
            async for frame in frames:
                if asm.feed(frame):
                    break
            if asm.message is None or not asm.complete:
                raise SerializationError(f"{method} stream ended before its last frame")
        except GradwireError as exc:
            await self._fail(context, exc)
        return await self.control(method, asm.message, context)

    async def framed_control_one(
        self, method: str, frame: Frame, context: grpc.aio.ServicerContext
    ) -> Any:
        """Serve a control method whose message fits in one frame (Remote -> RemoteCall,
        Gradients -> PropagateGradients)."""
        asm = self._assembler(_caller_id(context, self._agent.is_member))
        try:
            if not isinstance(frame, Frame):  # a request that did not parse
                raise SerializationError(str(getattr(frame, "error", "malformed frame")))
            if not asm.feed(frame):
                raise SerializationError(f"single-frame {method} without its last frame")
        except GradwireError as exc:
            await self._fail(context, exc)
        return await self.control(method, asm.message, context)

    async def _fetch(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """FetchRRef's Reply: made right here on the loop when the value is set and plain
        (``RRefFetch.serve_now``: no user code runs, no hand-off to the pool and back; a
        tensor for the caller's bulk lane on one of the loop's executor threads, since the
        loop never waits on a socket and a busy pool must not delay it), else by the
        FetchRRef handler on the serving pool (which also answers every error)."""
        fetch = getattr(self._agent.rref, "fetch", None)
        if fetch is not None and isinstance(request, pb.FetchRequest):
            caller = _caller_id(context, self._agent.is_member)
            try:
                self._check_alive()
                reply = fetch.serve_now(request, caller, may_block=False)
                if reply is OFF_LOOP:  # a tensor for the caller's bulk lane: a thread sends it
                    reply = await asyncio.get_running_loop().run_in_executor(
                        None, fetch.serve_now, request, caller
                    )
            except Exception:  # noqa: BLE001 - the pool path answers, and reports it
                reply = None
            if reply is not None:
                return reply
        return await self.control("FetchRRef", request, context)

    async def fetch_one(self, request: Any, context: grpc.aio.ServicerContext) -> Frame:
        """Serve Fetch: the FetchRRef answer in one frame, or parked behind a continuation."""
        reply = await self._fetch(request, context)
        return fetch_answer(self._agent, request, reply, _caller_id(context, self._agent.is_member))

    async def fetch_rref(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Frame]:
        """Serve FetchRRef: the handler's Reply, streamed in frames."""
        first, buffers = await self._fetch(request, context)
        for out in split(first, buffers, self._agent.options.chunk_bytes):
            yield out


#: Counters of Agent.debug_info() that have their own DebugInfo field (filled by the RRef and
#: dist-autograd integrations; absent keys stay 0).
DEBUG_COUNTERS = (
    "num_owner_rrefs",
    "num_pending_users",
    "num_pending_children",
    "num_forks",
    "num_autograd_contexts",
)


def control_request(agent: Any, control: pb.ControlRequest) -> tuple[Any, Any]:
    """The handler and the decoded request of a control frame (on the pipe or a call stream).

    Raises:
        SerializationError: the method is not one a control frame may name
            (``CONTROL_REQUESTS``), or its request does not decode.
    """
    cls = CONTROL_REQUESTS.get(control.method)
    handler = agent.control_handlers.get(control.method)
    if cls is None or handler is None:
        raise SerializationError(f"{control.method!r} is not a control method a call frame serves")
    try:
        return handler, cls.FromString(control.request)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError
        raise SerializationError(f"malformed {control.method} request: {exc}") from exc


def control_reply_frame(control: pb.ControlRequest, response: Any) -> Frame:
    """The reply frame of a control frame: its method's response."""
    reply = pb.ReplyHeader(
        message_id=control.message_id, control_response=response.SerializeToString()
    )
    return Frame(pb.FrameHeader(reply=reply, payload=pb.Payload(), last=True), ())


def control_error_frame(agent: Any, control: pb.ControlRequest, exc: BaseException) -> Frame:
    """The reply frame of a control frame that failed: what its unary method would end with
    as its status is the reply's error."""
    call = pb.CallHeader(message_id=control.message_id, function=control.method)
    return one_frame(*agent.callee.encode_error(call, exc))


def remote_ack_frame(call: pb.CallHeader, ack: pb.RemoteAck) -> Frame:
    """A RemoteAck as the reply frame of a one-frame RemoteCall (on the pipe or a call
    stream)."""
    reply = pb.ReplyHeader(message_id=call.message_id, remote_ack=ack)
    return Frame(pb.FrameHeader(reply=reply, payload=pb.Payload(), last=True), ())


def ack_frame(ack: pb.GradientsAck) -> Frame:
    """A GradientsAck as the reply frame of a ``gradients`` frame on ``Call``/``CallStream``."""
    reply = pb.ReplyHeader(error=ack.error) if ack.HasField("error") else pb.ReplyHeader()
    return Frame(pb.FrameHeader(reply=reply, payload=pb.Payload(), last=True), ())


def fetch_answer(
    agent: Any, request: pb.FetchRequest, reply: Reply | Future[Reply], caller: int
) -> Frame:
    """The one frame that answers a Fetch (on either server, and for a ``fetch_request`` frame
    on ``Call``/``CallStream``): the value itself, or a continuation the caller streams with
    FetchReply when the value is larger than one frame or still to come (a Future, awaited there
    without a thread)."""
    if isinstance(reply, Future) and reply.done():
        reply = reply.value()
    if not isinstance(reply, Future):
        first, buffers = reply
        if sum(memoryview(b).nbytes for b in buffers) <= agent.options.single_frame_bytes:
            return one_frame(first, buffers)
    parked = agent.callee.park(reply, caller, None, message_id=0)
    head = pb.FetchHeader(rref_id=request.rref_id, continuation=parked.reply.continuation)
    return Frame(pb.FrameHeader(fetch=head, payload=pb.Payload(), last=True), ())


def _extra_value(value: Any) -> str:
    # Structured values (the inspect contract: "autograd_graph", "rref_forks") travel as JSON.
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def debug_info_message(info: dict[str, Any]) -> pb.DebugInfo:
    """The DebugInfo protobuf of ``Agent.debug_info()``.

    Known keys fill their fields (including the ``DEBUG_COUNTERS``); every other key goes to
    ``extra`` as a string, dicts and lists as JSON (see docs/inspect.md for the JSON that
    ``gradwire inspect --dot`` reads).
    """
    known = {
        "worker",
        "worker_id",
        "state",
        "calls_served",
        "calls_in_flight",
        "calls_failed",
        "peers",
        *DEBUG_COUNTERS,
    }
    return pb.DebugInfo(
        worker=info["worker"],
        worker_id=info["worker_id"],
        state=info["state"],
        calls_served=info["calls_served"],
        calls_in_flight=info["calls_in_flight"],
        calls_failed=info["calls_failed"],
        peers=[pb.PeerState(**p) for p in info["peers"]],
        extra={k: _extra_value(v) for k, v in info.items() if k not in known},
        **{k: int(info[k]) for k in DEBUG_COUNTERS if k in info},
    )


class Undecodable:
    """A request message that did not parse; its handler answers INVALID_ARGUMENT.

    gRPC turns an exception in a request deserializer into UNKNOWN "Unexpected DecodeError";
    deserializing leniently and refusing in the handler gives the caller a clear status.
    """

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def lenient(parse: Any, what: str) -> Any:
    """``parse`` that returns an :class:`Undecodable` instead of raising."""

    def de(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the sender's
            return Undecodable(f"malformed {what}: {exc}")

    return de


def _pipe_frames(batch: bytes) -> list[Frame]:
    """The call frames of a CallPipe batch.

    Raises:
        SerializationError: the batch or one of its frames does not parse.
    """
    if _traffic.counts is not None:
        _traffic.received(_traffic.GRPC, len(batch))
    try:
        return [decode_frame(raw) for raw in unpack_batch(batch)]  # type: ignore[arg-type]
    except SerializationError:
        raise
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and the like
        raise SerializationError(f"malformed frame in a call pipe batch: {exc}") from exc


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)


async def _checked(frames: AsyncIterator[Any]) -> AsyncIterator[Frame]:
    async for frame in frames:
        if isinstance(frame, Undecodable):
            raise SerializationError(frame.error)
        yield frame


def method_handlers(servicer: WorkerServicer) -> grpc.GenericRpcHandler:
    """The generic handler of gradwire.v1.Worker with frame (de)serializers."""
    # Their bytes count as the gRPC route while metrics are on (gradwire._traffic).
    f_in = _traffic.counting_decoder(_traffic.GRPC, lenient(decode_frame, "frame"))
    f_out = _traffic.counting_encoder(_traffic.GRPC, encode_frame)

    def serialize(m: Any) -> bytes:
        return m.SerializeToString()

    ser = _traffic.counting_encoder(_traffic.GRPC, serialize)

    def unary(fn: Any) -> Any:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await _refuse(request, context)
            return await fn(request, context)

        return handle

    def unary_stream(fn: Any) -> Any:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await _refuse(request, context)
            async for out in fn(request, context):
                yield out

        return handle

    def de(cls: Any) -> Any:
        return _traffic.counting_decoder(
            _traffic.GRPC, lenient(cls.FromString, cls.DESCRIPTOR.name)
        )

    def unary_control(method: str, req: Any) -> grpc.RpcMethodHandler:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await servicer.control(method, request, context)

        return grpc.unary_unary_rpc_method_handler(unary(handle), de(req), ser)

    def framed(method: str) -> grpc.RpcMethodHandler:
        async def handle(frames: Any, context: grpc.aio.ServicerContext) -> Any:
            return await servicer.framed_control(method, _checked(frames), context)

        return grpc.stream_unary_rpc_method_handler(handle, f_in, ser)

    async def python_call(frames: Any, context: grpc.aio.ServicerContext) -> Any:
        async for out in servicer.PythonCall(_checked(frames), context):
            yield out

    async def remote_one(frame: Frame, context: grpc.aio.ServicerContext) -> Any:
        return await servicer.framed_control_one("RemoteCall", frame, context)

    async def gradients_one(frame: Frame, context: grpc.aio.ServicerContext) -> Any:
        return await servicer.framed_control_one("PropagateGradients", frame, context)

    handlers = {
        "Call": grpc.unary_unary_rpc_method_handler(unary(servicer.Call), f_in, f_out),
        "PythonCall": grpc.stream_stream_rpc_method_handler(python_call, f_in, f_out),
        "CallStream": grpc.stream_stream_rpc_method_handler(servicer.CallStream, f_in, f_out),
        "CallPipe": grpc.stream_stream_rpc_method_handler(servicer.CallPipe),
        "FetchReply": grpc.unary_stream_rpc_method_handler(
            unary_stream(servicer.FetchReply), de(pb.FetchReplyRequest), f_out
        ),
        "Join": grpc.unary_unary_rpc_method_handler(unary(servicer.Join), de(pb.JoinRequest), ser),
        "Barrier": grpc.unary_unary_rpc_method_handler(
            unary(servicer.Barrier), de(pb.BarrierRequest), ser
        ),
        "GetDebugInfo": grpc.unary_unary_rpc_method_handler(
            unary(servicer.GetDebugInfo), de(pb.DebugInfoRequest), ser
        ),
        "WatchControl": grpc.unary_stream_rpc_method_handler(
            unary_stream(servicer.WatchControl), de(pb.WatchRequest), ser
        ),
        "Profile": grpc.unary_unary_rpc_method_handler(
            unary(servicer.Profile), de(pb.ProfileWindow), ser
        ),
        "ForkRequest": unary_control("ForkRequest", pb.ForkRequest),
        "ChildAck": unary_control("ChildAck", pb.ChildAck),
        "RRefDelete": unary_control("RRefDelete", pb.RRefDelete),
        "ReleaseContext": unary_control("ReleaseContext", pb.ReleaseContextRequest),
        "Members": unary_control("Members", pb.MemberUpdate),
        "RemoteCall": framed("RemoteCall"),
        "PropagateGradients": framed("PropagateGradients"),
        "Remote": grpc.unary_unary_rpc_method_handler(remote_one, f_in, ser),
        "Gradients": grpc.unary_unary_rpc_method_handler(gradients_one, f_in, ser),
        "Fetch": grpc.unary_unary_rpc_method_handler(
            unary(servicer.fetch_one), de(pb.FetchRequest), f_out
        ),
        "FetchRRef": grpc.unary_stream_rpc_method_handler(
            unary_stream(servicer.fetch_rref), de(pb.FetchRequest), f_out
        ),
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


__all__ += ["method_handlers", "debug_info_message", "DEBUG_COUNTERS", "Undecodable", "lenient"]
