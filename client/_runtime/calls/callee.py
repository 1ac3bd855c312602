"""The incoming half of a worker: admit a call, run it on the serving pool, encode the reply.

Both servers (``gradwire.server``: the asyncio server and the fast lane) wrap the same
synchronous core, run on a serving-pool thread: ``admit`` (the state and in-flight check),
``handle`` for a one-frame call (the plain path, ``serve_plain``, else the general one) and
``serve_blocking`` for an assembled message. Decoding the body, resolving the function through
the policy, running it and pickling the result all happen there; a reply that comes later
(``@async_execution``, RRef arguments not confirmed yet) is a Future no thread waits for.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

from ..._proto import worker_pb2 as pb
from ..._wire import calls, pickler
from ..._wire.exceptions import encode_exception
from ..._wire.framing import Frame, Message, assemble_one, one_frame
from ..._wire.pickler import EncodeContext
from ...errors import (
    GradwireError,
    MessageTooLargeError,
    RpcError,
    SerializationError,
    TooManyRequestsError,
    WorkerUnavailableError,
)
from ...futures import Future
from ..cluster.context import WorkerContext
from ..transport.loop import io_loop
from ..transport.transport import IN_FLIGHT_MARK
from . import hooks, profiling
from .pool import ServingPool

__all__ = [
    "Callee",
    "ASYNC_EXECUTION_ATTR",
    "Reply",
    "until_done",
    "not_a_future",
    "plain_header",
]

log = logging.getLogger(__name__)
#: Attribute set by ``rpc.functions.async_execution`` on the functions it marks.
ASYNC_EXECUTION_ATTR = "_gradwire_async_execution"
#: How long an unfetched parked reply is kept when the call had no timeout.
_PARK_SECONDS = 300.0

Reply = tuple[pb.FrameHeader, list[Any]]


def not_a_future(function: str, result: Any) -> TypeError:
    """The error of an ``@async_execution`` function that returned ``result``, not a Future
    (PyTorch's wording first; the caller gets it as a RemoteError, a RuntimeError)."""
    kind = type(result).__name__
    return TypeError(
        "Functions decorated with @rpc.async_function must return a torch.futures.Future "
        f"object, but got {kind}: {function} is marked @async_execution but returned {kind}, "
        "not a gradwire.futures.Future"
    )


async def until_done(fut: Future[Any]) -> None:
    """On the I/O loop: wait for a gradwire Future without holding any thread."""
    if fut.done():
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def wake_in_loop() -> None:
        if not done.done():
            done.set_result(None)

    fut.add_done_callback(lambda _: loop.call_soon_threadsafe(wake_in_loop))
    await done


def _is_call_body(body: Any) -> bool:
    """Whether a decoded call body has the shape ``(self, args tuple, kwargs dict)``."""
    return (
        isinstance(body, tuple)
        and len(body) == 3
        and isinstance(body[1], tuple)
        and isinstance(body[2], dict)
    )


def plain_header(message_id: int, timeout: float, function: str) -> pb.CallHeader:
    """The CallHeader a lane pipe's PLAIN call stands for (a Python call)."""
    return pb.CallHeader(
        message_id=message_id,
        kind=pb.CALL_KIND_PYTHON,
        function=function,
        timeout_seconds=timeout,
    )


class _Later:
    """A call whose value arrives through a Future (async_execution)."""

    __slots__ = ("future",)

    def __init__(self, future: Future[Any]) -> None:
        self.future = future


class RRefGate(Protocol):
    """What the callee asks of the RRef service (``rref.service.RRefService``)."""

    def unconfirmed(self, handles: Any) -> list[Any]:
        """The RRefs among ``handles`` whose owners have not confirmed them yet."""
        ...

    def run_when_confirmed(self, handles: list[Any], thunk: Any, is_async: bool) -> Future[Any]:
        """Run ``thunk()`` once every RRef in ``handles`` is confirmed; a Future of its value."""
        ...

    def abandon_payload(self, ctx: EncodeContext) -> None:
        """Give back the forks made while encoding a payload that never leaves."""
        ...


class Callee:
    """Serves calls for one worker and keeps its serving counters.

    Args:
        ctx: the worker's identity, options, policy and peers.
        pool: the serving pool the calls run on.
        rrefs: the RRef service (RRef arguments to confirm, forks of a reply never sent).
        running: whether the worker serves calls now (joining or joined, not stopped).
    """

    def __init__(
        self,
        ctx: WorkerContext,
        pool: ServingPool,
        rrefs: RRefGate,
        running: Callable[[], bool],
    ) -> None:
        self._ctx = ctx
        self._pool = pool
        self._rrefs = rrefs
        self._running = running
        self._lock = threading.Lock()  # taken twice per call: a bare lock, not a Condition
        self._idle = threading.Condition(self._lock)  # notified when in_flight drops to 0
        self._idle_waiters = 0
        self.served = 0
        self.failed = 0
        self.in_flight = 0
        #: Calls that came through the fast lane (gradwire.server.fast_lane).
        self.served_fast_lane = 0
        self._per_peer: dict[int, int] = defaultdict(int)
        self._parked: dict[int, tuple[int, Reply | Future[Reply]]] = {}
        self._park_ids = itertools.count(1)

    def admit(self, caller_id: int, fast_lane: bool = False) -> None:
        """The admission check of every call, on either server: count a call from
        ``caller_id`` in (served by the fast lane when ``fast_lane``), or refuse it.

        Raises:
            WorkerUnavailableError: this worker is not running (not joined yet, or stopped).
            TooManyRequestsError: ``max_in_flight_per_peer`` calls from ``caller_id`` are in
                flight already.
        """
        if not self._running():
            raise WorkerUnavailableError(f"worker {self._ctx.name!r} is not running")
        if not self.enter(caller_id, fast_lane):
            raise TooManyRequestsError(
                f"worker {self._ctx.name!r} already has "
                f"{self._ctx.options.max_in_flight_per_peer} {IN_FLIGHT_MARK} from worker "
                f"{self._ctx.peer_name(caller_id)!r} (max_in_flight_per_peer)"
            )

    def enter(self, caller_id: int, fast_lane: bool = False) -> bool:
        """Count a call from ``caller_id`` (served by the fast lane when ``fast_lane``); False
        if its in-flight limit is reached."""
        with self._lock:
            if self._per_peer[caller_id] >= self._ctx.options.max_in_flight_per_peer:
                return False
            self._per_peer[caller_id] += 1
            self.in_flight += 1
            self.served_fast_lane += fast_lane
        self._ctx.peers.heard[caller_id] = time.monotonic()
        return True

    def leave(self, caller_id: int, failed: bool) -> None:
        """Uncount a finished call."""
        with self._lock:
            self._per_peer[caller_id] -= 1
            self.in_flight -= 1
            self.served += 1
            self.failed += int(failed)
            if not self.in_flight and self._idle_waiters:
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no call is being served (True) or ``timeout`` seconds pass (False)."""
        with self._idle:
            self._idle_waiters += 1
            try:
                return self._idle.wait_for(lambda: not self.in_flight, max(0.0, timeout))
            finally:
                self._idle_waiters -= 1

    def handle(self, frame: Frame, caller_id: int) -> Frame | Reply | Future[Reply]:
        """The core both servers wrap, on a serving-pool thread: serve the one-frame call in
        ``frame``. Its reply frame when the call is plain (``serve_plain``); else the general
        path's reply (``serve_blocking``), or an error reply for a frame that is not a call."""
        reply = self.serve_plain(frame, caller_id)
        if reply is not None:
            return reply
        call = frame.header.call
        try:
            msg = assemble_one(
                frame, self._ctx.options.max_message_bytes, self._ctx.peer_name(caller_id)
            )
            if not msg.header.HasField("call"):
                raise SerializationError("the first frame of a call carries no CallHeader")
            return self.serve_blocking(msg, caller_id)
        except GradwireError as exc:
            return self.encode_error(call, exc)

    def serve_blocking(self, msg: Message, caller_id: int) -> Reply | Future[Reply]:
        """On a serving-pool thread (the fast lane): run the call in ``msg``; its encoded
        reply, or a Future of it when the value comes later (``@async_execution``, RRef
        arguments not confirmed yet), which no thread waits for."""
        outcome = self._run(msg, caller_id)
        if not isinstance(outcome, _Later):
            return outcome
        call = msg.header.call
        reply: Future[Reply] = Future()

        def encode(fut: Future[Any]) -> None:
            reply.set_result(self._encode_future(call, fut, caller_id))

        def on_value(fut: Future[Any]) -> None:  # encode on the pool, not the completer
            try:
                self._pool.run(encode, fut)
            except RuntimeError:  # the pool closed: the worker is stopping
                encode(fut)

        outcome.future.add_done_callback(on_value)
        return reply

    def _run(self, msg: Message, caller_id: int) -> Reply | _Later:
        me = self._ctx
        call = msg.header.call
        try:
            if call.kind != pb.CALL_KIND_PYTHON:
                raise SerializationError(
                    f"worker {me.name!r} got call kind {pb.CallKind.Name(call.kind)} on the "
                    "Python call path"
                )
            fn = calls.resolve_function(me.policy, call.function, me.name)
            (bound_self, args, kwargs), dctx = self._decode(msg, caller_id)
            hooks.recv_call(call, dctx.objects.get("T", []), caller_id)
            is_async = getattr(fn, ASYNC_EXECUTION_ATTR, False)
            received = dctx.objects.get("R")
            if received:
                pending = self._rrefs.unconfirmed(received)
                if pending:
                    # RRef arguments not confirmed by their owners yet: run once they are,
                    # holding no thread meanwhile (RRef protocol, "What the agent must do").
                    return _Later(
                        self._rrefs.run_when_confirmed(
                            pending,
                            lambda: self._invoke(call, fn, bound_self, args, kwargs, caller_id),
                            bool(is_async),
                        )
                    )
            with hooks.scope(call, caller_id):
                if bound_self is not calls.NO_SELF:
                    result = fn(bound_self, *args, **kwargs)
                else:
                    result = fn(*args, **kwargs)
            if is_async:
                if not isinstance(result, Future):
                    raise not_a_future(call.function, result)
                return _Later(result)
            return self.encode_value(call, result, caller_id)
        except BaseException as exc:  # noqa: BLE001 - becomes the caller's exception
            return self.encode_error(call, exc)

    def serve_plain(self, frame: Frame, caller_id: int) -> Frame | None:
        """The reply frame of a *plain* call in ``frame``, or None when it is not one (the
        general path, ``serve_blocking``, then serves it and reports what is wrong with it).

        A plain call is the common small one: a whole message in one frame, no tensor and no
        RRef in its payload, a pickle of plain data only (``pickler.loads_plain``) and a
        function not marked ``@async_execution``. It is served exactly as the general path
        would (same policy check, hooks, errors and limits) but without an assembled
        message, side-table contexts or the pickler's Python hooks; a plain result is pickled
        by the C pickler into a one-frame reply.
        """
        me = self._ctx
        header = frame.header
        call = header.call
        payload = header.payload
        if (
            len(frame.raw) != 1
            or not header.HasField("call")
            or not header.last
            or header.offset
            or payload.tensors
            or payload.rrefs
            or call.kind != pb.CALL_KIND_PYTHON
            or memoryview(frame.raw[0]).nbytes != payload.pickle_nbytes
        ):
            return None
        try:
            fn = calls.resolve_function(me.policy, call.function, me.name)
        except Exception:  # noqa: BLE001 - the general path raises it again and replies with it
            return None
        if getattr(fn, ASYNC_EXECUTION_ATTR, False):
            return None
        ok, body = pickler.loads_plain(frame.raw[0])
        if not ok or not _is_call_body(body):
            return None
        bound_self, args, kwargs = body
        hooked = hooks.needed(call)  # no autograd context: the hooks would return at once
        try:
            if hooked:
                hooks.recv_call(call, (), caller_id)
                value = self._invoke(call, fn, bound_self, args, kwargs, caller_id)
            elif bound_self is calls.NO_SELF:
                value = fn(*args, **kwargs)
            else:
                value = fn(bound_self, *args, **kwargs)
            data = self._one_frame_pickle(value)
            if data is None:
                # Tensors, other objects, or too big for one frame: the general encoding.
                return self.reply_frame(self.encode_value(call, value, caller_id), call, caller_id)
            reply = pb.FrameHeader(reply=pb.ReplyHeader(message_id=call.message_id), last=True)
            reply.payload.pickle_nbytes = len(data)
            if hooked:
                hooks.send_reply(call, reply.reply, (), caller_id)
        except BaseException as exc:  # noqa: BLE001 - becomes the caller's exception
            return self.reply_frame(self.encode_error(call, exc), call, caller_id)
        return Frame(reply, (data,))

    def _one_frame_pickle(self, value: Any) -> bytes | None:
        """``value`` pickled when it is plain and fits in one reply frame, else None (the
        general encoding answers)."""
        data = pickler.dumps_plain(value)
        options = self._ctx.options
        if data is None or len(data) > min(options.single_frame_bytes, options.max_message_bytes):
            return None
        return data

    def plain_call(self, function: str, data: Any) -> tuple[Any, tuple[Any, Any, Any]] | None:
        """``(fn, (self, args, kwargs))`` of a lane pipe's PLAIN call (``function``, its pickle
        ``data``) when it is plain here too, for ``run_plain``: ``function`` resolves through
        the policy and is not ``@async_execution``, ``data`` is a pickle of plain data of the
        call's shape, and no hook watches every call. None otherwise: the general path then
        serves it as the frame it stands for (and says what is wrong with it). Nothing runs,
        nothing is counted here."""
        if hooks.watching():
            return None
        me = self._ctx
        try:
            fn = calls.resolve_function(me.policy, function, me.name)
        except Exception:  # noqa: BLE001 - the general path raises it again and replies with it
            return None
        if getattr(fn, ASYNC_EXECUTION_ATTR, False):
            return None
        ok, body = pickler.loads_plain(data)
        if not ok or not _is_call_body(body):
            return None
        return fn, body

    def run_plain(
        self,
        message_id: int,
        timeout: float,
        function: str,
        plain: tuple[Any, tuple[Any, Any, Any]],
        caller_id: int,
    ) -> bytes | Frame:
        """Admit and run a PLAIN call that ``plain_call`` found plain, as ``serve_plain`` runs
        a plain frame (same admission, limits and errors): its value pickled (the PLAIN
        reply) when that is plain and fits in one frame, else its reply frame (the value's
        general encoding, or the error)."""
        fn, (bound_self, args, kwargs) = plain
        try:
            self.admit(caller_id)
        except GradwireError as exc:
            return one_frame(*self.encode_error(plain_header(message_id, timeout, function), exc))
        failed = True
        try:
            if bound_self is calls.NO_SELF:
                value = fn(*args, **kwargs)
            else:
                value = fn(bound_self, *args, **kwargs)
            data = self._one_frame_pickle(value)
            if data is not None:
                failed = False
                return data
            call = plain_header(message_id, timeout, function)
            reply = self.reply_frame(self.encode_value(call, value, caller_id), call, caller_id)
            failed = reply.header.reply.HasField("error")
            return reply
        except BaseException as exc:  # noqa: BLE001 - becomes the caller's exception
            call = plain_header(message_id, timeout, function)
            return self.reply_frame(self.encode_error(call, exc), call, caller_id)
        finally:
            self.leave(caller_id, failed)

    def _invoke(
        self,
        call: pb.CallHeader,
        fn: Any,
        bound_self: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        caller_id: int,
    ) -> Any:
        """Run the function of a deferred call (the result, or its Future if async)."""
        with hooks.scope(call, caller_id):
            if bound_self is not calls.NO_SELF:
                result = fn(bound_self, *args, **kwargs)
            else:
                result = fn(*args, **kwargs)
        if getattr(fn, ASYNC_EXECUTION_ATTR, False) and not isinstance(result, Future):
            raise not_a_future(call.function, result)
        return result

    def _decode(self, msg: Message, caller_id: int) -> tuple[Any, Any]:
        me = self._ctx
        body, dctx = calls.decode_body(
            msg, {"policy": me.policy, "peer": me.peer_name(caller_id), "worker": me.name}
        )
        if not _is_call_body(body):
            raise SerializationError("malformed call body: expected (self, args, kwargs)")
        return body, dctx

    def _encode_future(self, call: pb.CallHeader, fut: Future[Any], caller_id: int) -> Reply:
        exc = fut.exception()
        if exc is not None:
            return self.encode_error(call, exc)
        return self.encode_value(call, fut.value(), caller_id)

    def encode_value(self, call: pb.CallHeader, value: Any, caller_id: int) -> Reply:
        """Encode a successful reply (an error reply if the value cannot be sent)."""
        me = self._ctx
        peer = me.peer_name(caller_id)
        try:
            # The reply travels by the inverse of the caller's map (PyTorch's rule).
            ctx = EncodeContext(peer=peer, device_map=me.device_maps.reply(peer))
            first, buffers = calls.encode_body(
                pb.FrameHeader(reply=pb.ReplyHeader(message_id=call.message_id)), value, ctx
            )
            size = calls.payload_bytes(first, calls.total_bytes(buffers))
            if size > me.options.max_message_bytes:
                raise MessageTooLargeError(
                    f"result of {call.function} is {size} bytes, over max_message_bytes="
                    f"{me.options.max_message_bytes} of worker {me.name!r}"
                )
            hooks.send_reply(call, first.reply, ctx.objects.get("T", []), caller_id)
            return first, buffers
        except BaseException as exc:  # noqa: BLE001 - becomes the caller's exception
            # The value never leaves: give back the RRef forks made while encoding it, and the
            # shared-memory segments already filled.
            self._rrefs.abandon_payload(ctx)
            calls.give_back(ctx)
            if isinstance(exc, SerializationError) and "result of" not in str(exc):
                exc = SerializationError(f"result of {call.function} cannot be sent: {exc}")
            elif isinstance(exc, OSError):  # the transport (out of descriptors, say), not f
                exc = RpcError(
                    f"worker {me.name!r} ran {call.function}, but its transport could not send "
                    f"the result: {type(exc).__name__}: {exc}"
                )
            return self.encode_error(call, exc)

    def encode_error(self, call: pb.CallHeader, exc: BaseException) -> Reply:
        """Encode an error reply for ``exc``. An error of the user's function is logged as a
        warning with its traceback on the callee too (as PyTorch prints it there)."""
        if isinstance(exc, GradwireError) or not isinstance(exc, Exception):
            log.debug("call %s failed on %s: %r", call.function, self._ctx.name, exc)
        else:
            log.warning(
                "On worker %r: %s raised %r",
                self._ctx.name,
                call.function,
                exc,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        if profiling.serving:
            profiling.discard(call)
        reply = pb.ReplyHeader(
            message_id=call.message_id, error=encode_exception(exc, self._ctx.name)
        )
        return pb.FrameHeader(reply=reply, payload=pb.Payload()), []

    def reply_frame(
        self, reply: Reply | Future[Reply], call: pb.CallHeader, caller_id: int
    ) -> Frame:
        """The one frame that answers a unary ``Call``: the reply itself when it fits in
        ``single_frame_bytes``, else a continuation the caller fetches with FetchReply (also
        for a reply that is still a Future)."""
        if not isinstance(reply, Future):
            first, buffers = reply
            size = calls.total_bytes(buffers)
            if size <= self._ctx.options.single_frame_bytes:
                return one_frame(first, buffers)
        parked = self.park(reply, caller_id, call.timeout_seconds or None, call.message_id)
        return Frame(parked, ())

    def park(
        self,
        reply: Reply | Future[Reply],
        caller_id: int,
        ttl: float | None,
        message_id: int | None = None,
    ) -> pb.FrameHeader:
        """Keep a reply too large for one frame (or one still to come); return the
        continuation frame header. Any thread."""
        cont = next(self._park_ids)
        with self._lock:
            self._parked[cont] = (caller_id, reply)
        loop = io_loop()
        expire = (ttl or _PARK_SECONDS) + 5.0

        def forget_later() -> None:
            loop.call_later(expire, self._parked.pop, cont, None)

        loop.call_soon_threadsafe(forget_later)
        if message_id is None:
            assert not isinstance(reply, Future)
            message_id = reply[0].reply.message_id
        header = pb.ReplyHeader(message_id=message_id, continuation=cont)
        return pb.FrameHeader(reply=header, payload=pb.Payload(), last=True)

    async def take_parked_reply(self, cont: int, caller_id: int) -> Reply | None:
        """On the I/O loop: remove a parked reply (waiting, without a thread, for one still
        to come); None if there is none for ``caller_id``."""
        entry = self.take_parked(cont, caller_id)
        if isinstance(entry, Future):
            await until_done(entry)
            return entry.value()
        return entry

    def take_parked(self, cont: int, caller_id: int) -> Reply | Future[Reply] | None:
        """Remove and return a parked reply, if it exists and belongs to ``caller_id``."""
        with self._lock:
            entry = self._parked.get(cont)
            if entry is None or entry[0] != caller_id:
                return None
            del self._parked[cont]
            return entry[1]
