"""The RRef protocol on a running agent: sends its control messages, serves them, reports.

``protocol.RRefProtocol`` is the state machine (no network); this module drives it as its
docstring's section "What the agent must do" asks:

- every message it returns is sent as a control frame from the sending thread
  (``transport.resend.start_control``: the bulk lane, a call stream or the call pipe),
  retried with backoff on UNAVAILABLE / DEADLINE_EXCEEDED (``RetryingSend``); a
  ForkRequest's answer (ForkAccepted) is fed back into the protocol, and what that yields is
  sent in turn;
- ForkRequest, ChildAck and RRefDelete are served here (``register_control_handler``);
  RemoteCall and FetchRRef in ``calls`` and ``fetch``;
- user objects are released through a queue drained by one thread, because a weakref
  finalizer may run inside garbage collection while this thread holds a lock (the protocol's
  own, or the pool's): the finalizer only enqueues;
- functions that received RRefs run once their owners confirmed them (``run_when_confirmed``),
  without holding a serving thread while waiting;
- every control message sent or received is published on WatchControl.

Graceful shutdown (``drain`` then, after the barrier, ``check_leaks``) waits for pending
confirmations and deletes, sends the deletes of the UserRRefs still alive, and lists the
OwnerRRefs still referenced.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..._proto import worker_pb2 as pb
from ..._wire.pickler import EncodeContext
from ...errors import (
    InvalidFutureStateError,
    RpcTimeoutError,
    RRefLeakError,
    WorkerUnavailableError,
)
from ...futures import Future
from ..calls.pool import ServingPool
from ..cluster.context import WorkerContext
from ..cluster.events import ClusterEvents, ControlEvents
from ..transport.resend import RetryingSend, start_control
from ..transport.transport import Transport
from .errors import RRefProtocolError
from .ids import GloballyUniqueId
from .messages import ChildAck, ControlMessage, ForkAccepted, ForkRequest, RRefDelete, RRefForkData
from .protocol import RRefHandle, RRefProtocol
from .shutdown import check_leaks, drain, fork_tree
from .wire import REQUESTS, from_gid, request_of, to_gid

#: Failures of a message that may yet be delivered: the peer did not answer in time, or could
#: not be reached (lost, cut off); not a refusal.
_UNREACHED = (WorkerUnavailableError, RpcTimeoutError)
#: How long a clean-up message (RRefDelete, ChildAck) is retried at most while its peer is not
#: declared lost (then it waits for the peer to answer again: ``on_peer_back``).
CLEANUP_SECONDS = 600.0

__all__ = ["RRefService", "FaultHook"]

log = logging.getLogger(__name__)

#: ``fault(method, phase)`` called by the handlers before ("before") and after ("after")
#: processing a control message; tests raise WorkerUnavailableError from it to make the
#: sender retry (before: the message is lost; after: the answer is lost, so it is duplicated).
FaultHook = Callable[[str, str], None]
#: Control messages in flight to one destination at once (the others wait in its outbox).
IN_FLIGHT_PER_PEER = 64
#: While RRefs keep being released, the release thread looks for more this often (seconds)...
RELEASE_TICK = 0.002
#: ...until none came for this long; then a release wakes it.
RELEASE_LINGER = 0.05


class RRefService:
    """The RRef protocol of one worker.

    Args:
        ctx: the worker's identity, options and peers.
        transport: sends the control messages.
        pool: runs the functions that waited for confirmations, and the outcomes of sends.
        events: the peers declared lost (their messages stop retrying).
        control: the WatchControl events (every control message sent or received).
    """

    def __init__(
        self,
        ctx: WorkerContext,
        transport: Transport,
        pool: ServingPool,
        events: ClusterEvents,
        control: ControlEvents,
    ) -> None:
        self.ctx = ctx
        self.transport = transport
        self.pool = pool
        self.is_lost = events.is_lost
        self._control = control
        #: Worker method -> handler, registered by the agent (``Agent.register_control_handler``).
        self.handlers: dict[str, Callable[..., Any]] = {
            "ForkRequest": self._on_fork_request,
            "ChildAck": self._on_child_ack,
            "RRefDelete": self._on_delete,
        }
        #: RemoteCall and FetchRRef (``rref.calls.RRefCalls``, ``rref.fetch.RRefFetch``): built
        #: on this service and attached by the agent (they import this module, not the reverse).
        self.calls: Any = None
        self.fetch: Any = None
        self.protocol = RRefProtocol(
            ctx.rank,
            tombstone_ttl=ctx.options.rref_tombstone_ttl,
            on_owner_deleted=self._on_owner_deleted,
        )
        self.closed = False
        #: Tests only: see FaultHook.
        self.fault: FaultHook | None = None
        self.owners_deleted = 0
        self._ids = itertools.count(1 << 40)
        self._lock = threading.Condition()
        self._in_flight = 0
        # Control messages waiting for a sender, and the senders running, per destination.
        self._outbox: dict[int, collections.deque[ControlMessage]] = {}
        #: dest -> clean-up messages it did not get (unreachable), sent again if it answers
        self._redeliver: dict[int, list[ControlMessage]] = {}
        self._sending: dict[int, int] = {}
        # Forks whose confirmation can never come (ForkRequest or RemoteCall given up on).
        self._failed: dict[GloballyUniqueId, BaseException] = {}
        self._waiters: dict[GloballyUniqueId, list[Future[None]]] = {}
        # fork -> parent worker, for the inspect JSON only (popped with the fork's delete).
        self._parents: dict[GloballyUniqueId, int] = {}
        self._releases: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._releaser = threading.Thread(
            target=self._release_loop, name=f"gradwire-{ctx.name}-rref-release", daemon=True
        )
        self._releaser.start()

    # -- ids and budgets -------------------------------------------------------------------------

    def next_message_id(self) -> int:
        """A message id for RemoteCall and FetchRRef headers (apart from the Caller's ids)."""
        return next(self._ids)

    @property
    def control_budget(self) -> float:
        """Total seconds over all attempts of one control message."""
        return float(self.ctx.options.rpc_timeout or 60.0)

    # -- sending -----------------------------------------------------------------------------

    def send(self, messages: Iterable[ControlMessage]) -> None:
        """Queue each message for its destination and send it, retried until answered (never
        blocks). Sends are gRPC futures (no thread held), at most ``IN_FLIGHT_PER_PEER`` per
        destination: a burst (10,000 deletes at shutdown) queues instead of flooding the
        peer, and a dead peer does not hold up the messages to the others."""
        for msg in messages:
            if type(msg) not in REQUESTS:
                log.error("RRef protocol produced %r, which is not a request; dropped", msg)
                continue
            self.emit(msg.kind.value, "sent", msg.rref_id, msg.fork_id, msg.dest)
            with self._lock:
                if isinstance(msg, RRefDelete):
                    self._parents.pop(msg.fork_id, None)
                self._in_flight += 1
                self._outbox.setdefault(msg.dest, collections.deque()).append(msg)
            self._pump(msg.dest)

    def _pump(self, dest: int) -> None:
        while True:
            with self._lock:
                waiting = self._outbox.get(dest)
                if not waiting or self._sending.get(dest, 0) >= IN_FLIGHT_PER_PEER:
                    return
                msg = waiting.popleft()
                self._sending[dest] = self._sending.get(dest, 0) + 1
            self._start(msg)

    def _start(self, msg: ControlMessage) -> None:
        method, response_cls = REQUESTS[type(msg)]
        peers = self.ctx.peers
        request = request_of(msg)

        body = request.SerializeToString()
        # A delete is answered at once: on the lane, its answer may wait for the next call to
        # the destination, which goes right behind it and reads it (no reader thread).
        quick = isinstance(msg, RRefDelete)

        def start(seconds: float, settled: Callable[[Any], None]) -> None:
            start_control(
                self.transport,
                self.ctx,
                peers[msg.dest],
                self.next_message_id(),
                method,
                body,
                response_cls,
                seconds,
                settled,
                quick,
            )

        def done(reply: Any, error: BaseException | None) -> None:
            try:
                self._answered(msg, reply, error)
            finally:
                with self._lock:
                    self._sending[msg.dest] -= 1
                self.track(-1)
                self._pump(msg.dest)

        budget = self.control_budget
        if isinstance(msg, (RRefDelete, ChildAck)):  # clean-up: until delivered or lost
            budget = max(budget, CLEANUP_SECONDS)
        deadline = time.monotonic() + budget
        if msg.dest not in peers and msg.dest not in peers.departed:
            done(None, RRefProtocolError(f"no worker {msg.dest} in this cluster"))
            return
        RetryingSend(
            self.pool, self.is_lost, peers[msg.dest], method, start, deadline, done
        ).start()

    def _answered(self, msg: ControlMessage, reply: Any, error: BaseException | None) -> None:
        method = REQUESTS[type(msg)][0]
        if error is not None:
            if isinstance(msg, (RRefDelete, ChildAck)) and isinstance(error, _UNREACHED):
                # Idempotent clean-up: sent again if the peer answers again (a healed
                # partition), so its owner or parent does not keep the fork for ever.
                with self._lock:
                    self._redeliver.setdefault(msg.dest, []).append(msg)
                log.info(
                    "%s for RRef %s fork %s to worker %s not delivered (%s); sent again if it "
                    "answers again",
                    method,
                    msg.rref_id,
                    msg.fork_id,
                    self.ctx.peer_name(msg.dest),
                    error,
                )
                return
            log.warning(
                "%s for RRef %s fork %s to worker %s failed for good: %s (the RRef may leak)",
                method,
                msg.rref_id,
                msg.fork_id,
                self.ctx.peer_name(msg.dest),
                error,
            )
            if isinstance(msg, ForkRequest):
                self.fail_fork(msg.fork_id, error)
            return
        if isinstance(msg, ForkRequest):
            accepted = ForkAccepted(
                self.ctx.rank, msg.rref_id, msg.fork_id, known=bool(reply.known)
            )
            self.emit("ForkAccepted", "received", msg.rref_id, msg.fork_id, msg.dest)
            self.send(self.protocol.handle(accepted))

    def on_peer_lost(self, worker_id: int) -> None:
        """The failure detector declared ``worker_id`` lost: drop the messages queued for it,
        and fail what waits for a confirmation only it could give (its RRefs leak here)."""
        with self._lock:
            dropped = list(self._outbox.pop(worker_id, ()))
        for _ in dropped:
            self.track(-1)
        error = WorkerUnavailableError(
            f"worker {self.ctx.peer_name(worker_id)!r} was lost; its RRefs cannot be confirmed"
        )
        for _rref_id, fork_id in self.protocol.pending().pending_users:
            rec = self.protocol._users.users.get(fork_id)  # noqa: SLF001 - owner of the fork
            if rec is not None and rec.owner_id == worker_id:
                self.fail_fork(fork_id, error)
        if dropped:
            log.warning(
                "dropped %d RRef message(s) to lost worker %s",
                len(dropped),
                self.ctx.peer_name(worker_id),
            )

    def on_peer_back(self, worker_id: int) -> None:
        """``worker_id``, declared lost or unreachable, answers again: send it the clean-up
        messages (deletes, child acks) it missed."""
        with self._lock:
            missed = self._redeliver.pop(worker_id, [])
        if missed:
            log.info(
                "sending %d RRef clean-up message(s) again to worker %s",
                len(missed),
                self.ctx.peer_name(worker_id),
            )
            self.send(missed)

    def track(self, delta: int) -> None:
        """Count a send (or a RemoteCall) in flight, for the shutdown drain."""
        with self._lock:
            self._in_flight += delta
            if not self._in_flight:
                self._lock.notify_all()

    def emit(self, kind: str, direction: str, rref_id: Any, fork_id: Any, peer: int | str) -> None:
        """Publish one control message on WatchControl."""
        if not self._control.listening:  # nobody listens: skip building it
            return
        self._control.emit(
            pb.ControlEvent(
                kind=kind,
                direction=direction,
                rref_id=to_gid(rref_id) if rref_id is not None else None,
                fork_id=to_gid(fork_id) if fork_id is not None else None,
                peer=self.ctx.peer_name(peer) if isinstance(peer, int) else peer,
                time=time.time(),
            )
        )

    # -- handlers ------------------------------------------------------------------------------

    def _inject(self, method: str, phase: str) -> None:
        if self.fault is not None:
            self.fault(method, phase)

    def _on_fork_request(self, req: pb.ForkRequest, caller_id: int) -> pb.ForkAccepted:
        self._inject("ForkRequest", "before")
        msg = ForkRequest(
            self.ctx.rank,
            from_gid(req.rref_id),
            from_gid(req.fork_id),
            int(req.child_id),
            int(req.parent_id),
        )
        self.emit("ForkRequest", "received", msg.rref_id, msg.fork_id, caller_id)
        out = self.protocol.handle(msg)
        answers = [m for m in out if isinstance(m, ForkAccepted)]
        self.send(m for m in out if not isinstance(m, ForkAccepted))
        known = answers[0].known if answers else False
        self.emit("ForkAccepted", "sent", msg.rref_id, msg.fork_id, caller_id)
        self._inject("ForkRequest", "after")
        return pb.ForkAccepted(rref_id=req.rref_id, fork_id=req.fork_id, known=known)

    def _on_child_ack(self, req: pb.ChildAck, caller_id: int) -> pb.Ack:
        self._inject("ChildAck", "before")
        msg = ChildAck(
            self.ctx.rank, from_gid(req.rref_id), from_gid(req.fork_id), int(req.child_id)
        )
        self.emit("ChildAck", "received", msg.rref_id, msg.fork_id, caller_id)
        self.send(self.protocol.handle(msg))
        self._inject("ChildAck", "after")
        return pb.Ack()

    def _on_delete(self, req: pb.RRefDelete, caller_id: int) -> pb.Ack:
        self._inject("RRefDelete", "before")
        msg = RRefDelete(
            self.ctx.rank, from_gid(req.rref_id), from_gid(req.fork_id), int(req.user_id)
        )
        self.emit("RRefDelete", "received", msg.rref_id, msg.fork_id, caller_id)
        self.send(self.protocol.handle(msg))
        self._inject("RRefDelete", "after")
        return pb.Ack()

    def _on_owner_deleted(self, rref_id: GloballyUniqueId) -> None:
        # The record and its value slot are gone from the protocol; nothing else holds the
        # value (an OwnerRRef object would hold a local reference and prevent the delete).
        self.owners_deleted += 1
        log.debug("worker %s deleted OwnerRRef %s", self.ctx.name, rref_id)

    # -- forks in payloads ---------------------------------------------------------------------

    def fork(self, handle: RRefHandle, dest: int) -> RRefForkData:
        """Fork ``handle`` for a payload to worker ``dest`` (before the payload leaves)."""
        return self.protocol.fork(handle, dest)

    def receive(self, data: RRefForkData) -> RRefHandle:
        """Become the fork a received payload carries; send what the protocol asks."""
        handle, messages = self.protocol.receive_fork(data)
        if not handle.is_owner:
            with self._lock:
                self._parents[data.fork_id] = data.parent_id
        self.send(messages)
        return handle

    def note_remote(self, handle: RRefHandle) -> None:
        """A remote() caller's own fork (for the inspect JSON: its parent is the owner)."""
        if handle.fork_id is not None:
            with self._lock:
                self._parents[handle.fork_id] = handle.owner_id

    def parent_of(self, fork_id: GloballyUniqueId) -> int | None:
        """The worker that sent us fork ``fork_id`` (the owner for a remote() result)."""
        return self._parents.get(fork_id)

    def forget_parents_except(self, live: set[GloballyUniqueId]) -> None:
        """Drop the parents of forks no longer held (inspection bookkeeping)."""
        with self._lock:
            for stale in set(self._parents) - live:
                del self._parents[stale]

    def abandon_payload(self, ctx: EncodeContext) -> None:
        """The payload encoded with ``ctx`` certainly never left: give its forks back."""
        for data in ctx.objects.pop("R", ()):
            try:
                self.send(self.protocol.abandon_fork(data))
            except RRefProtocolError:
                log.exception("abandoning fork %s failed", data)

    # -- confirmation --------------------------------------------------------------------------

    def unconfirmed(self, handles: Iterable[RRefHandle]) -> list[RRefHandle]:
        """The user handles among ``handles`` that their owner has not confirmed yet."""
        return [h for h in handles if not h.is_owner and not self.protocol.is_confirmed(h)]

    def wait_confirmed(self, handles: list[RRefHandle]) -> Future[None]:
        """A Future completed once every handle is confirmed (or with the error that ends the
        wait: the owner disowned one, or its ForkRequest was given up on)."""
        out: Future[None] = Future()
        forks = [h.fork_id for h in handles if h.fork_id is not None]
        with self._lock:
            failed = next((self._failed[f] for f in forks if f in self._failed), None)
            if failed is None:
                for f in forks:
                    self._waiters.setdefault(f, []).append(out)
        if failed is not None:
            _settle(out, failed)
            return out

        def confirmed(error: BaseException | None) -> None:
            with self._lock:
                for f in forks:
                    waiting = self._waiters.get(f)
                    if waiting is not None and out in waiting:
                        waiting.remove(out)
                        if not waiting:
                            del self._waiters[f]
            _settle(out, error)

        self.protocol.when_confirmed(handles, confirmed)
        return out

    def fail_fork(self, fork_id: GloballyUniqueId, error: BaseException) -> None:
        """No confirmation will come for ``fork_id``: fail whatever waits for it."""
        with self._lock:
            self._failed[fork_id] = error
            waiting = self._waiters.pop(fork_id, [])
        for fut in waiting:
            _settle(fut, error)

    def run_when_confirmed(
        self, handles: list[RRefHandle], thunk: Callable[[], Any], is_async: bool
    ) -> Future[Any]:
        """Run ``thunk`` on the serving pool once ``handles`` are confirmed (at once, in this
        thread, when ``handles`` is empty).

        Returns:
            A Future of what ``thunk`` returned (of the value of the Future it returned when
            ``is_async``), or of the error that ended the wait.
        """
        out: Future[Any] = Future()
        inline = not handles  # nothing to wait for: run in this (serving) thread

        def run() -> None:
            try:
                result = thunk()
            except BaseException as exc:  # noqa: BLE001 - delivered to the future
                _settle(out, exc)
                return
            if is_async and isinstance(result, Future):
                result.add_done_callback(lambda f: _settle(out, f.exception(), f, True))
            else:
                _settle(out, None, result, False)

        def go(done: Future[None]) -> None:
            if done.exception() is not None:
                _settle(out, done.exception())
                return
            if inline:
                run()
                return
            try:
                self.pool.run(run)
            except RuntimeError as exc:
                _settle(out, WorkerUnavailableError(f"worker {self.ctx.name!r} stopped: {exc}"))

        self.wait_confirmed(handles).add_done_callback(go)
        return out

    # -- release -------------------------------------------------------------------------------

    def enqueue_release(self, handle: RRefHandle) -> None:
        """Called by a finalizer (maybe inside GC): release ``handle`` on the release thread."""
        if not self.closed:
            self._releases.put(handle)

    def flush_releases(self, timeout: float) -> bool:
        """Wait until every release enqueued so far was processed (True) or ``timeout``."""
        if not self._releaser.is_alive():
            return True
        done = threading.Event()
        self._releases.put(done)
        return done.wait(timeout)

    def _release_loop(self) -> None:
        # The first release of a burst wakes this thread; while releases keep coming it looks
        # for them every RELEASE_TICK instead (a finalizer's put then wakes no thread: in a
        # remote()/to_here() loop that was a wake-up and a GIL hand-off per RRef), and after
        # RELEASE_LINGER without one it waits to be woken again.
        while True:
            if not self._release(self._releases.get()):
                return
            quiet = 0.0
            while quiet < RELEASE_LINGER:
                time.sleep(RELEASE_TICK)
                quiet += RELEASE_TICK
                while True:
                    try:
                        item = self._releases.get_nowait()
                    except queue.Empty:
                        break
                    quiet = 0.0
                    if not self._release(item):
                        return

    def _release(self, item: Any) -> bool:
        """Process one item of the release queue; False: the thread ends."""
        if item is None:
            return False
        if isinstance(item, threading.Event):
            item.set()
        elif not self.closed:
            try:
                self.send(self.protocol.release(item))
            except Exception:
                log.exception("releasing RRef %s failed", item)
        return True

    # -- shutdown ------------------------------------------------------------------------------

    def drain(self, deadline: float) -> bool:
        """Graceful shutdown, between the barriers: see ``shutdown.drain``."""
        return drain(self, deadline)

    def check_leaks(self, mode: str | None = None) -> RRefLeakError | None:
        """After the last barrier: see ``shutdown.check_leaks``."""
        return check_leaks(self, mode)

    def pending_quiet(self, users_too: bool) -> bool:
        """Nothing in flight, no pending child, and no unconfirmed user (``users_too``) or no
        deferred delete (otherwise); forks given up on do not count."""
        report = self.protocol.pending()
        with self._lock:
            if self._in_flight or report.pending_children:
                return False
            if users_too:
                return all(u[1] in self._failed for u in report.pending_users)
            return not report.deferred_deletes

    def wait_changed(self, seconds: float) -> None:
        """Sleep until a send finishes or ``seconds`` pass."""
        with self._lock:
            self._lock.wait(seconds)

    def close(self) -> None:
        """The agent stopped: RRefs of this agent can no longer be used."""
        self.closed = True
        self._releases.put(None)
        with self._lock:
            waiting = [f for fs in self._waiters.values() for f in fs]
            self._waiters.clear()
        for fut in waiting:
            _settle(fut, WorkerUnavailableError(f"the RPC agent of {self.ctx.name!r} stopped"))

    # -- inspection ----------------------------------------------------------------------------

    def debug_info(self) -> dict[str, Any]:
        """The RRef counters of get_debug_info(), and the ``rref_forks`` inspect JSON."""
        info = self.protocol.debug_info()
        return {
            "num_owner_rrefs": info.num_owner_rrefs,
            "num_shared_owner_rrefs": info.num_shared_owner_rrefs,
            "num_pending_users": info.num_pending_users,
            "num_pending_children": info.num_pending_children,
            "num_forks": info.num_forks,
            "num_users": info.num_users,
            "num_rref_tombstones": info.num_tombstones,
            "rref_forks": fork_tree(self),
        }


def _settle(
    fut: Future[Any], error: BaseException | None, value: Any = None, unwrap: bool = False
) -> None:
    with contextlib.suppress(InvalidFutureStateError):
        if error is not None:
            fut.set_exception(error)
        elif unwrap:
            fut.set_result(value.value())
        else:
            fut.set_result(value)
