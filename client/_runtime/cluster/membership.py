"""Dynamic groups: workers that join a running group and leave it (``init_rpc`` without a
world size, as PyTorch >= 1.12 allows).

Rank 0 hosts the group, as it hosts the rendezvous of a fixed one. It admits one join or
leave at a time (an asyncio lock on its I/O loop), so every member sees the same order:

- join: the host checks that the joiner's name and rank are free (a clash is an RpcInitError
  naming the member that has them; a joiner without a rank, ``init_rpc(rank=None)``, is given
  the lowest rank no member has) and its device maps, tells every other member
  (``Members`` "joined") and waits for their answers, records it itself, and only then
  answers the joiner's Join with the members. So when ``init_rpc`` returns, everyone can
  call the new worker, and the new worker can call everyone;
- leave: a leaving member asks the host (``Members`` "leave"); the host removes it (no later
  joiner hears of it), tells every other member ("left"), then answers. A member that cannot
  reach the host tells every member itself;
- lookup: a worker asked to call a name or rank it does not know asks the host for the
  members before failing (``Members`` "lookup"), so a call never races an announcement.

Members apply the changes to the ``PeerTable`` and publish them on ``ClusterEvents``
(``peer_joined``, ``peer_left``) and as ``PeerJoined`` / ``PeerLeft`` control events
(``gradwire inspect --watch``). A member killed without leaving is still *lost*
(``liveness``); the host forgets it, so a replacement may join under its name or rank.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import grpc

from ..._proto import worker_pb2 as pb
from ...errors import ArgumentError, RpcInitError
from ..transport.loop import run_sync
from ..transport.transport import Transport
from . import device_maps
from .context import WorkerContext
from .device_maps import DeviceMaps
from .events import ClusterEvents, ControlEvents
from .workers import Peer, validate_name, validate_rank

__all__ = ["Membership", "peer_from", "HOST_RANK"]

log = logging.getLogger(__name__)

#: The rank that hosts a group (its rendezvous, and the membership of a dynamic one).
HOST_RANK = 0
#: Seconds the host waits for one member to take an announcement (a dead member is skipped;
#: the failure detector declares it lost).
ANNOUNCE_SECONDS = 10.0


def peer_from(w: pb.WorkerInfo, my_host: str) -> Peer:
    """The Peer record of member ``w`` as seen from a worker on host ``my_host``."""
    local = w.host_id == my_host
    dial = w.local_address if local and w.local_address else w.address
    if local and w.local_call_address:
        call_dial = w.local_call_address
    else:
        call_dial = w.call_address or dial
    return Peer(
        w.name,
        w.id,
        w.address,
        w.host_id,
        w.local_address,
        dial,
        call_dial,
        w.bulk_address,
        w.lane_pipe,
        w.lane_plain,
    )


class Membership:
    """The members of a dynamic group as this worker knows them, and (on rank 0) the host.

    Args:
        ctx: the worker's identity, options and peer table (changed here).
        transport: how announcements, leaves and lookups travel.
        events: where joins and leaves are published.
        control: the WatchControl events (``PeerJoined``, ``PeerLeft``).
    """

    def __init__(
        self,
        ctx: WorkerContext,
        transport: Transport,
        events: ClusterEvents,
        control: ControlEvents,
    ) -> None:
        self._ctx = ctx
        self._transport = transport
        self._events = events
        self._control = control
        self._my_host = ""
        self._lock = threading.Lock()
        #: The members' rendezvous records (device maps are rebuilt from them), by id.
        self.infos: dict[int, pb.WorkerInfo] = {}
        #: rank -> the info of a member declared lost (restored if it answers again)
        self._forgotten: dict[int, pb.WorkerInfo] = {}
        self._host_lock: asyncio.Lock | None = None
        #: The host left: it admits no more joins.
        self._closed = False
        self.handlers = {"Members": self._serve}

    @property
    def hosting(self) -> bool:
        return self._ctx.rank == HOST_RANK

    def start(self, members: list[pb.WorkerInfo], my_host: str) -> None:
        """The rendezvous (or the Join) gave these members."""
        with self._lock:
            self._my_host = my_host
            self.infos = {w.id: w for w in members}

    def members(self) -> list[pb.WorkerInfo]:
        """The records of the current members, ordered by id."""
        with self._lock:
            return [self.infos[i] for i in sorted(self.infos)]

    def _maps(self) -> DeviceMaps:
        ctx = self._ctx
        return DeviceMaps(ctx.name, ctx.options.device_maps, list(self.infos.values()))

    # -- applying changes (every member) ---------------------------------------------------------

    def joined(self, w: pb.WorkerInfo) -> None:
        """``w`` joined: record it, publish it."""
        with self._lock:
            self.infos = {i: o for i, o in self.infos.items() if o.name != w.name}
            self.infos[w.id] = w
            peer = peer_from(w, self._my_host)
            added = self._ctx.peers.add(peer, self._maps())
        if added:
            log.info("%s: worker %r (rank %d) joined", self._ctx.name, w.name, w.id)
            self._events.peer_joined(peer)
            self._emit("PeerJoined", peer.name)

    def left(self, w: pb.WorkerInfo) -> None:
        """``w`` left with shutdown(): it becomes departed here."""
        with self._lock:
            current = self.infos.get(w.id)
            if current is None or current.name != w.name:
                return
            del self.infos[w.id]
            peer = self._ctx.peers.remove(w.id, self._maps())
        if peer is not None:
            log.info("%s: worker %r (rank %d) left", self._ctx.name, w.name, w.id)
            self._events.peer_left(peer)
            self._emit("PeerLeft", peer.name)

    def forget_lost(self, peer: Peer) -> None:
        """On the host: a member was declared lost; its name and rank are free again (the
        other members keep it in their tables, as lost)."""
        if not self.hosting:
            return
        with self._lock:
            current = self.infos.get(peer.id)
            if current is not None and current.name == peer.name:
                del self.infos[peer.id]
                self._forgotten[peer.id] = current

    def remember_back(self, peer: Peer) -> None:
        """On the host: a member declared lost answers again; it keeps its name and rank unless
        another worker took them meanwhile."""
        if not self.hosting:
            return
        with self._lock:
            info = self._forgotten.pop(peer.id, None)
            if info is not None and info.name == peer.name and peer.id not in self.infos:
                if all(other.name != peer.name for other in self.infos.values()):
                    self.infos[peer.id] = info

    def _emit(self, kind: str, peer: str) -> None:
        if self._control.listening:
            self._control.emit(
                pb.ControlEvent(kind=kind, direction="received", peer=peer, time=time.time())
            )

    # -- the host (rank 0, on its I/O loop) ------------------------------------------------------

    def _admission(self) -> asyncio.Lock:
        if self._host_lock is None:  # made on the I/O loop, which uses it
            self._host_lock = asyncio.Lock()
        return self._host_lock

    def _check_free(self, worker: pb.WorkerInfo) -> bool:
        """Raise RpcInitError if the name or rank is taken; True for a repeated Join."""
        if self._closed:
            raise RpcInitError(
                f"the group's host {self._ctx.name!r} is leaving; {worker.name!r} cannot join"
            )
        validate_rank(worker.id, f"worker {worker.name!r}")
        with self._lock:
            by_rank = self.infos.get(worker.id)
            by_name = next((o for o in self.infos.values() if o.name == worker.name), None)
        if by_rank is not None and by_rank == worker:
            return True
        if by_name is not None:
            raise RpcInitError(
                f"Worker name {worker.name!r} is not unique: worker {worker.name!r} (rank "
                f"{by_name.id}) is already a member of the group, so rank {worker.id} cannot "
                "join under that name"
            )
        if by_rank is not None:
            raise RpcInitError(
                f"rank {worker.id} is taken: worker {by_rank.name!r} already joined the group "
                f"with rank {worker.id}, so {worker.name!r} needs another rank"
            )
        return False

    async def serve_join(
        self, worker: pb.WorkerInfo, assign_rank: bool = False
    ) -> tuple[list[pb.WorkerInfo], int]:
        """Admit ``worker``: every member is told before this returns the members and its rank.

        Args:
            worker: the joiner's record.
            assign_rank: it has no rank: give it the lowest one no member has (``worker.id``
                is ignored).

        Raises:
            RpcInitError: its name or rank is taken, its device maps are invalid, no rank
                below 2**15 is free, or the host is leaving.
        """
        async with self._admission():
            if assign_rank:
                worker = self._with_free_rank(worker)
            if self._check_free(worker):
                return self.members(), worker.id
            problems = device_maps.validate([*self.members(), worker], dynamic=True)
            if problems:
                raise RpcInitError("invalid device maps: " + "; ".join(problems) + " (docs/gpu.md)")
            others = [p for p in self._ctx.peers if p.id not in (self._ctx.rank, worker.id)]
            await self._announce("joined", worker, others)
            self.joined(worker)
            return self.members(), worker.id

    def _with_free_rank(self, worker: pb.WorkerInfo) -> pb.WorkerInfo:
        """``worker`` with the lowest rank no member has (the rank it has if this Join is a
        repeat of one admitted already)."""
        with self._lock:
            taken = set(self.infos)
            for member in self.infos.values():
                same = pb.WorkerInfo()
                same.CopyFrom(worker)
                same.id = member.id
                if member == same:  # a repeated Join: the same rank again
                    return same
        rank = next(r for r in range(len(taken) + 1) if r not in taken)
        assigned = pb.WorkerInfo()
        assigned.CopyFrom(worker)
        assigned.id = rank
        return assigned

    async def serve_leave(self, worker: pb.WorkerInfo) -> list[pb.WorkerInfo]:
        """``worker`` leaves: no later joiner hears of it, every member is told."""
        async with self._admission():
            if worker.id == self._ctx.rank:  # the host itself leaves: no more joins
                self._closed = True
            else:
                self.left(worker)
            others = [p for p in self._ctx.peers if p.id not in (self._ctx.rank, worker.id)]
            await self._announce("left", worker, others)
            return self.members()

    async def _announce(self, kind: str, worker: pb.WorkerInfo, to: list[Peer]) -> None:
        loop = asyncio.get_running_loop()
        update = pb.MemberUpdate(kind=kind, worker=worker)
        waiting: list[tuple[Peer, asyncio.Future[Any]]] = []
        for peer in to:
            if self._events.is_lost(peer.id):
                continue  # declared lost: it would only hold the group up
            fut: asyncio.Future[Any] = loop.create_future()

            def done(call: Any, fut: asyncio.Future[Any] = fut) -> None:
                loop.call_soon_threadsafe(_settle, fut, call)

            try:
                self._transport.control_future(
                    peer.dial, "Members", update, pb.MemberList, ANNOUNCE_SECONDS, done
                )
            except Exception as exc:  # noqa: BLE001 - shutting down: skip it
                log.warning("cannot tell %s that %s %s: %s", peer.name, worker.name, kind, exc)
                continue
            waiting.append((peer, fut))
        for peer, fut in waiting:
            error = (await fut).exception()
            if error is not None:
                log.warning(
                    "could not tell %s that %s %s: %s", peer.name, worker.name, kind, _why(error)
                )

    # -- a member's requests ---------------------------------------------------------------------

    def leave(self, timeout: float) -> None:
        """Tell the group that this worker leaves (through the host, or to every member when
        the host cannot be reached); returns once they were told."""
        me = self._ctx.peers.by_id.get(self._ctx.rank)
        with self._lock:
            info = self.infos.get(self._ctx.rank)
        if me is None or info is None:
            return
        if self.hosting:
            run_sync(self.serve_leave(info), timeout)
            return
        host = self._ctx.peers.by_id.get(HOST_RANK)
        if host is not None:
            try:
                self._transport.control(
                    host.dial,
                    "Members",
                    pb.MemberUpdate(kind="leave", worker=info),
                    pb.MemberList,
                    timeout,
                )
                return
            except grpc.RpcError as exc:
                log.warning(
                    "%s: the host is unreachable (%s); telling every member", me.name, _why(exc)
                )
        update = pb.MemberUpdate(kind="left", worker=info)
        for peer in self._ctx.peers:
            if peer.id != self._ctx.rank:
                try:
                    self._transport.control(
                        peer.dial, "Members", update, pb.MemberList, min(timeout, ANNOUNCE_SECONDS)
                    )
                except grpc.RpcError as exc:
                    log.warning("could not tell %s that %s left: %s", peer.name, me.name, _why(exc))

    def lookup(self, timeout: float) -> bool:
        """Ask the host for the members and record those not known here; True if any was."""
        host = self._ctx.peers.by_id.get(HOST_RANK)
        if host is None or self.hosting:
            return False
        try:
            reply = self._transport.control(
                host.dial, "Members", pb.MemberUpdate(kind="lookup"), pb.MemberList, timeout
            )
        except grpc.RpcError as exc:
            log.debug("member lookup at %s failed: %s", host.name, _why(exc))
            return False
        known = self._ctx.peers.by_id
        fresh = [w for w in reply.workers if w.id not in known or known[w.id].name != w.name]
        for w in fresh:
            self.joined(w)
        return bool(fresh)

    def _serve(self, request: pb.MemberUpdate, caller: int) -> pb.MemberList:
        """The ``Members`` handler (on the serving pool).

        Raises:
            ArgumentError: an update this worker does not take from that caller (refused
                whole: nothing changes).
        """
        kind, worker = request.kind, request.worker
        if kind == "lookup":
            return pb.MemberList(workers=self.members())
        allowed = self._ctx.dynamic and (
            (kind == "joined" and caller == HOST_RANK and not self.hosting)
            or (kind == "left" and caller in (HOST_RANK, worker.id) and caller >= 0)
            or (kind == "leave" and self.hosting and caller == worker.id and caller >= 0)
        )
        if not allowed:
            raise ArgumentError(
                f"worker {self._ctx.name!r} refuses membership update {kind!r} about "
                f"{worker.name!r} from {self._ctx.peer_name(caller)!r}"
            )
        validate_name(worker.name)
        if kind == "joined":
            self.joined(worker)
        elif kind == "left":
            self.left(worker)
        else:
            timeout = self._ctx.options.rpc_timeout or 60.0
            return pb.MemberList(workers=run_sync(self.serve_leave(worker), timeout))
        return pb.MemberList()


def _settle(fut: asyncio.Future[Any], call: Any) -> None:
    if not fut.done():
        fut.set_result(call)


def _why(exc: BaseException) -> str:
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {details()}"
    return str(exc)
