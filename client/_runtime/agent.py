"""The agent: one per worker process while RPC is up. It builds the worker's services, wires
them together, and owns identity, state, the rendezvous, the barriers and shutdown.

Nothing below it imports it: each service gets the frozen ``WorkerContext`` (name, rank,
peers, options, policy) and the few other things it uses (the transport, the serving pool,
the events, a callback). "Peer lost" and the state changes are events
(``cluster.events.ClusterEvents``) that the agent subscribes the services to; the control
handlers the services serve are registered here (``register_control_handler``).

Outgoing calls live in ``calls.caller``, incoming ones in ``calls.callee``; the gRPC servers
(layer L4, ``gradwire.server``) call the agent's handlers. ``gradwire.distributed.rpc.init_rpc``
builds an Agent, starts a server for it and calls :meth:`Agent.join`. The RRef protocol runs in
``rref.service`` (``self.rref``, with ``rref.calls`` and ``rref.fetch``) and dist autograd in
``dist_autograd.service`` (``self.autograd``), which also hooks calls (``calls.hooks``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import secrets
import shutil
import socket
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc

from .._proto import worker_pb2 as pb
from .._wire import guard
from .._wire.policy import unreviewed_numpy
from ..autograd import _profiling
from ..errors import (
    AuthenticationError,
    RpcInitError,
    RpcNotInitializedError,
    RpcTimeoutError,
    UnknownWorkerError,
    WorkerDepartedError,
    WorkerUnavailableError,
)
from .calls.callee import Callee
from .calls.caller import Caller
from .calls.pool import ServingPool
from .cluster.context import PeerTable, WorkerContext
from .cluster.device_maps import DeviceMaps
from .cluster.device_maps import publish as publish_devices
from .cluster.device_maps import validate as validate_device_maps
from .cluster.events import AgentState, ClusterEvents, ControlEvents
from .cluster.liveness import Liveness
from .cluster.membership import HOST_RANK, Membership, peer_from
from .cluster.options import GrpcRpcBackendOptions
from .cluster.rendezvous import (
    BarrierHost,
    RendezvousHost,
    is_loopback,
    plan,
    publish_address,
    publish_local_token,
    read_address,
    read_local_token,
    route_to,
    withdraw_address,
)
from .cluster.workers import Peer, WorkerInfo, host_id, validate_rank
from .dist_autograd.service import DistAutogradService
from .rref.calls import RRefCalls
from .rref.fetch import RRefFetch
from .rref.service import RRefService
from .transport.bulk_lane import BulkLane
from .transport.loop import io_loop, run_sync
from .transport.shm_route import ShmRoutes
from .transport.transport import Transport, map_rpc_error, set_departed

__all__ = [
    "Agent",
    "AgentState",
    "current",
    "current_or_none",
    "set_current",
    "sweep_socket_dirs",
]

log = logging.getLogger(__name__)

_numpy_noted = threading.Lock()


def _note_unreviewed_numpy() -> None:
    """Say once per process when NumPy is of a series the policy's lists were not reviewed
    against (pyproject.toml admits only reviewed ones; another may be installed by hand)."""
    note = unreviewed_numpy()
    if note and _numpy_noted.acquire(blocking=False):
        log.warning(note)


_current: Agent | None = None
_current_lock = threading.Lock()


def current(verb: str = "this function") -> Agent:
    """The running agent.

    Raises:
        RpcNotInitializedError: no agent (before init_rpc or after shutdown); names the fix.
    """
    agent = _current
    if agent is None or agent.state not in (AgentState.RUNNING, AgentState.SHUTTING_DOWN):
        if agent is not None and agent.state in (AgentState.UNINITIALIZED, AgentState.JOINING):
            why = "init_rpc() has not finished its rendezvous yet; call it after init_rpc returns"
        elif agent is not None or _was_shut_down:
            why = "RPC was shut down in this process; call init_rpc() again first"
        else:
            why = "call gradwire.distributed.rpc.init_rpc(name, rank, world_size) first"
        raise RpcNotInitializedError(f"{verb} needs RPC: {why}")
    return agent


def current_or_none() -> Agent | None:
    """The agent if there is one, whatever its state."""
    return _current


_was_shut_down = False


def _node_id() -> int:
    """The rank profiler events are stamped with: this worker's, -1 without RPC (PyTorch's)."""
    agent = _current
    if agent is None or agent.state not in (AgentState.RUNNING, AgentState.SHUTTING_DOWN):
        return -1
    return agent.rank


_profiling.set_node_id(_node_id)


def set_current(agent: Agent | None, *, after_shutdown: bool = True) -> None:
    """Install (or clear) the process's agent.

    Args:
        agent: the agent to install, or None to clear.
        after_shutdown: clearing ends a session that ran (later errors say "RPC was shut
            down"); False when clearing an agent whose init_rpc failed.
    """
    global _current, _was_shut_down
    with _current_lock:
        if agent is None and _current is not None and after_shutdown:
            _was_shut_down = True
        _current = agent


_SOCKET_DIR_PREFIX = "gw-"
#: Seconds rank 0 keeps answering Join after the rendezvous failed (ranks still to come).
_JOIN_FAILURE_GRACE = 10.0


def sweep_socket_dirs(root: str | None = None) -> int:
    """Remove the Unix-socket directories of workers that died without shutting down.

    A directory ``gw-<pid>-*`` is removed when process ``<pid>`` no longer exists, it belongs
    to this user and holds nothing but sockets. A SIGKILLed worker cannot clean up after itself;
    the next worker started by the same user on the host does it.

    Returns:
        The number of directories removed.
    """
    root = root or tempfile.gettempdir()
    removed = 0
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(_SOCKET_DIR_PREFIX):
            continue
        pid_text = name[len(_SOCKET_DIR_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or _pid_alive(int(pid_text)):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
            entries = os.listdir(path)
            if st.st_uid != os.getuid() or not all(
                _is_socket(os.path.join(path, e)) for e in entries
            ):
                continue
            shutil.rmtree(path)
            removed += 1
        except OSError:
            continue  # raced with another sweeper, or not ours to remove
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _is_socket(path: str) -> bool:
    return stat.S_ISSOCK(os.lstat(path).st_mode)


#: How long a member of a dynamic group with no token looks for the token its host made up.
_LOCAL_TOKEN_WAIT = 10.0


class Agent:
    """State and services of one worker.

    Args:
        name: validated worker name.
        rank: worker id (in [0, world_size) in a fixed group); None: a worker joining a dynamic
            group whose host assigns its rank (the services are built once it has one).
        world_size: number of workers; 0 for a dynamic group (``init_rpc`` without a world
            size: workers join and leave while it runs, see ``cluster.membership``).
        options: backend options.
    """

    def __init__(
        self, name: str, rank: int | None, world_size: int, options: GrpcRpcBackendOptions
    ) -> None:
        self.name = name
        #: Asks the group's host for a rank at join (``rank`` None); until then -1.
        self.assign_rank = rank is None
        self.rank = -1 if rank is None else rank
        stem = "joining" if rank is None else str(rank)
        self.world_size = world_size
        self.options = options
        self.policy = options.policy()
        if self.policy.guarded:
            guard.install()  # the audit hook, once per process (docs/security.md)
        if not self.policy.trust_everything:
            _note_unreviewed_numpy()
        self.plan = plan(options.init_method, self.rank, world_size, options.listen_address)
        #: A worker that enters the shutdown barrier as soon as it joined, to serve until the
        #: job ends (gradwire-worker --until job), reports SERVING to health checks while it
        #: waits there; any other shutdown reports NOT_SERVING from its start.
        self.serving_until_job = False
        self.table = PeerTable(DeviceMaps(name, options.device_maps), world_size)
        self.ctx = WorkerContext(name, self.rank, world_size, options, self.policy, self.table)
        self.events = ClusterEvents()
        self.control_events = ControlEvents()
        self.session = ""
        self.address = ""
        #: TCP port of the fast lane (gradwire.server.fast_lane), 0 without one.
        self.call_port = 0
        #: "unix:/path" this worker also serves on (same-host peers dial it), or "".
        self.local_address = self._unix_listener(stem)
        #: "unix:/path" of the fast lane (gradwire.server.fast_lane), or "".
        self.local_call_address = (
            f"unix:{os.path.join(self._unix_dir, f'{stem}.call.sock')}"
            if self.local_address
            else ""
        )
        #: Token expected from and sent to peers; None: no authentication.
        self.token: str | None = options.token
        #: True when rank 0 made the token up (a Join without it is then answered while the
        #: rendezvous waits for its rank; see serve_join).
        self.token_generated = False
        #: The file where the host of a dynamic group keeps the token it made up ("": none).
        self._local_token_file = ""
        self.rendezvous: RendezvousHost | None = None
        self.barriers: BarrierHost | None = None
        self.control_handlers: dict[str, Callable[..., Any]] = {}
        #: The bulk lane (large tensors over plain TCP), None when off or under TLS.
        self.bulk_lane = (
            BulkLane(self.ctx, self.events, lambda: self.token)
            if options.bulk_transfer and not options.tls_enabled
            else None
        )
        self._ready = asyncio.Event()
        self._ready_flag = threading.Event()  # the same, for threads (the fast lane)
        self._state_lock = threading.Lock()
        self._barrier_gen = itertools.count()
        self._stop_server: Callable[[float], None] | None = None
        self._check_security()
        # Rank-independent, used by the server from its start (the fast lane's executor) and
        # by the Join; the services, which know their rank, are built once it is known.
        self.pool = ServingPool(self.options.num_worker_threads, name=f"gradwire-{self.name}")
        self.transport = Transport(self.options, self.rank)
        self.transport.lane = self.bulk_lane
        self._built = False
        if not self.assign_rank:
            self._build()
        if self.rank == HOST_RANK:
            # Set up before the server starts, so that the first Join finds them.
            if self.token is None:
                self.token, self.token_generated = secrets.token_hex(16), True
            if not self.ctx.dynamic:  # a dynamic group is hosted by self.membership
                self.rendezvous = RendezvousHost(
                    world_size, uuid.uuid4().hex, self.token if self.token_generated else ""
                )

    def _build(self) -> None:
        """Build the services, each from what it uses, and wire them together."""
        ctx, events, control = self.ctx, self.events, self.control_events
        self._built = True
        self.rref = RRefService(ctx, self.transport, self.pool, events, control)
        self.rref.calls = RRefCalls(self.rref)
        self.rref.fetch = RRefFetch(self.rref)
        self.caller = Caller(ctx, self.transport, self.pool, events, self.rref.abandon_payload)
        self.callee = Callee(ctx, self.pool, self.rref, self._serving)
        self.autograd = DistAutogradService(ctx, self.transport, self.pool, control, events.is_lost)
        self.liveness = Liveness(ctx, self.transport, events, control)
        self.shm_routes = ShmRoutes(ctx, events)
        self.transport.fallback_of = self._fast_lane_fallback
        self.transport.is_fast_lane = self._is_fast_lane
        self.membership = Membership(ctx, self.transport, events, control)
        for handlers in (self.rref.handlers, self.autograd.handlers, self.membership.handlers):
            for method, handler in handlers.items():
                self.register_control_handler(method, handler)
        # A lost peer: its pending calls fail first (naming it), then its channels close
        # (cancelling what still waits on them), its dist-autograd contexts are reclaimed,
        # the shutdown barriers stop waiting for it, and the RRef service gives up on it.
        events.on_peer_lost(self._fail_calls_to)
        events.on_peer_lost(self._drop_channels)
        events.on_peer_lost(lambda peer, _why: self.autograd.on_peer_lost(peer.id))
        events.on_peer_lost(self._barriers_forget)
        events.on_peer_lost(lambda peer, _why: self.rref.on_peer_lost(peer.id))
        events.on_peer_lost(lambda peer, _why: self.membership.forget_lost(peer))
        # ... and one that answers again (a healed partition) is waited for again.
        events.on_peer_back(self._barriers_back)
        events.on_peer_back(lambda peer: self.autograd.on_peer_back(peer.id))
        events.on_peer_back(lambda peer: self.rref.on_peer_back(peer.id))
        events.on_peer_back(self.membership.remember_back)
        # Dynamic groups: a member that joined is watched and reachable at once; one that left
        # is departed: calls to it fail at once naming it so, its dist-autograd contexts are
        # released, the RRef service stops waiting for it. Calls already sent to it are not
        # failed: it answers them before it stops (what is still pending when its connection
        # closes fails then).
        events.on_peer_joined(self._welcome)
        events.on_peer_left(self._farewell)

    def _fast_lane_fallback(self, address: str) -> str:
        """The main address of the peer whose fast lane over TCP is ``address``, else ""."""
        if address.startswith("unix:"):
            return ""
        for peer in list(self.by_name.values()):
            if peer.call_dial == address and peer.dial != address:
                return peer.dial
        return ""

    def _is_fast_lane(self, address: str) -> bool:
        """Whether ``address`` is a peer's fast lane (its own server, not its main one)."""
        return any(p.call_dial == address != p.dial for p in list(self.by_name.values()))

    def _serving(self) -> bool:
        return self.events.state not in (AgentState.SHUTDOWN, AgentState.UNINITIALIZED)

    def _fail_calls_to(self, peer: Peer, why: str) -> None:
        self.caller.fail_peer(peer.id, f"worker {peer.name!r} is lost: {why}")

    def _drop_channels(self, peer: Peer, _why: str) -> None:
        if self.bulk_lane is not None:  # a call waiting on a lane connection fails at once
            self.bulk_lane.drop_peer(peer.name)
        self.transport.drop(peer.dial)
        if peer.call_dial != peer.dial:
            self.transport.drop(peer.call_dial)

    def _welcome(self, peer: Peer) -> None:
        set_departed(peer.name, False)
        self.liveness.watch(peer)

    def _farewell(self, peer: Peer) -> None:
        set_departed(peer.name, True)
        self.autograd.on_peer_lost(peer.id)
        self.rref.on_peer_lost(peer.id)
        self.liveness.watch_departure(peer, self._departed_gone)

    def _departed_gone(self, peer: Peer) -> None:
        """A departed worker's connection closed: it answers nothing more."""
        if peer.id in self.table and self.table[peer.id] == peer:
            return  # it came back (a new worker under its rank)
        self.caller.fail_peer(
            peer.id,
            f"worker {peer.name!r} has departed (it left the group with shutdown())",
            WorkerDepartedError,
        )
        if all(p.dial != peer.dial for p in self.peers):
            self._drop_channels(peer, "departed")

    def _barriers_forget(self, peer: Peer, _why: str) -> None:
        if self.barriers is not None:  # rank 0: the shutdown barriers stop waiting for it
            io_loop().call_soon_threadsafe(self.barriers.mark_gone, peer.id)

    def _barriers_back(self, peer: Peer) -> None:
        if self.barriers is not None:  # rank 0: a healed peer is waited for again
            io_loop().call_soon_threadsafe(self.barriers.mark_back, peer.id)

    # -- identity and peers (read by the servers and the public API) ---------------------------

    @property
    def state(self) -> AgentState:
        return self.events.state

    @property
    def peers(self) -> list[Peer]:
        return self.table.all

    @property
    def by_name(self) -> dict[str, Peer]:
        return self.table.by_name

    @property
    def device_maps(self) -> DeviceMaps:
        return self.table.device_maps

    # -- state ---------------------------------------------------------------------------------

    def _check_security(self) -> None:
        host = self.plan.listen.rpartition(":")[0]
        secured = self.token or self.options.tls_require_client_auth
        if not is_loopback(host) and not secured and not self.options.allow_insecure:
            raise RpcInitError(
                f"worker {self.name!r} would listen on {self.plan.listen} (not loopback) without "
                "authentication: set GRADWIRE_TOKEN (or rpc_backend_options token=...), use "
                "mutual TLS, or pass allow_insecure=True on a closed network"
            )

    def _unix_listener(self, stem: str) -> str:
        if (
            not self.options.use_unix_socket
            or self.options.tls_enabled
            or not hasattr(socket, "AF_UNIX")
        ):
            return ""
        # A private directory: only this user can connect (the token is still checked). Its
        # name carries our pid, so that the directories of killed workers can be swept.
        sweep_socket_dirs()
        self._unix_dir = tempfile.mkdtemp(prefix=f"{_SOCKET_DIR_PREFIX}{os.getpid()}-")
        return f"unix:{os.path.join(self._unix_dir, f'{stem}.sock')}"

    def _set_state(self, state: AgentState) -> None:
        with self._state_lock:
            self.events.state = state
        self.events.state_changed(state)

    def add_state_listener(self, listener: Callable[[AgentState], None]) -> None:
        """Call ``listener(state)`` on every state change (from any thread)."""
        self.events.on_state(listener)

    def attach_server(self, port: int, stop: Callable[[float], None]) -> None:
        """Record the bound port of this worker's server and how to stop it."""
        host = self.plan.listen.rpartition(":")[0].strip("[]")
        if host in ("0.0.0.0", "::", ""):
            host = route_to(self.plan.master.rpartition(":")[0])
        self.address = self.options.advertise_address or f"{host}:{port}"
        self._stop_server = stop

    def _call_address(self) -> str:
        """The fast lane's TCP address to advertise ("" without one)."""
        if not self.call_port or not self.address or self.address.startswith("unix:"):
            return ""
        return f"{self.address.rpartition(':')[0]}:{self.call_port}"

    def _listen_bulk(self) -> str:
        """Start the bulk lane's listener on the gRPC server's host; the address to advertise
        ("" without one)."""
        if self.bulk_lane is None or not self.address or self.address.startswith("unix:"):
            return ""
        return self.bulk_lane.listen(
            self.plan.listen.rpartition(":")[0], self.address.rpartition(":")[0]
        )

    def is_ready(self) -> bool:
        """True once the rendezvous completed."""
        return self._ready.is_set()

    def wait_ready_blocking(self, timeout: float) -> bool:
        """On a thread: wait until the rendezvous completed (True) or ``timeout``."""
        return self._ready_flag.wait(timeout)

    async def wait_ready(self, timeout: float) -> bool:
        """On the I/O loop: wait until the rendezvous completed (True) or ``timeout``."""
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def peer_name(self, worker_id: int) -> str:
        """Name of worker ``worker_id`` (or ``"#id"`` if unknown)."""
        return self.table.name_of(worker_id)

    def resolve(self, to: Any) -> Peer:
        """Destination (name, WorkerInfo or rank) -> Peer.

        In a dynamic group a destination not known here is looked up at the host first (it
        may have joined a moment ago).

        Raises:
            WorkerDepartedError: it left the group.
            UnknownWorkerError: no member has that name or rank.
        """
        try:
            return self.table.resolve(to)
        except WorkerDepartedError:
            raise
        except UnknownWorkerError:
            if not self.ctx.dynamic or not isinstance(to, (str, int, WorkerInfo)):
                raise
            if not self.membership.lookup(min(5.0, self.options.rpc_timeout or 5.0)):
                raise
        return self.table.resolve(to)

    def is_member(self, worker_id: int) -> bool:
        """Whether ``worker_id`` names a member (what a caller id in metadata may be)."""
        if not self.ctx.dynamic:
            return 0 <= worker_id < self.world_size
        # Before its table is filled a joining worker can be called already (the host told
        # the members first); the token was checked, so a caller's id is believed then.
        return worker_id in self.table or (worker_id >= 0 and not self.is_ready())

    def timeout_of(self, timeout: float) -> float | None:
        """A verb's timeout argument -> seconds or None (-1: the default, 0: none)."""
        return self.ctx.timeout_of(timeout)

    @property
    def info(self) -> WorkerInfo:
        return WorkerInfo(self.name, self.rank)

    # -- rendezvous ----------------------------------------------------------------------------

    def join(self) -> None:
        """Rendezvous with every rank; RUNNING on return.

        Raises:
            RpcInitError: the rendezvous failed or timed out (the message says why).
        """
        self._set_state(AgentState.JOINING)
        me = pb.WorkerInfo(
            name=self.name,
            id=self.rank,
            address=self.address,
            host_id=host_id(),
            local_address=self.local_address,
            local_call_address=self.local_call_address,
            bulk_address=self._listen_bulk(),
            call_address=self._call_address(),
        )
        # Its lane serves pipes when it serves calls (the fast lane's server installs both).
        me.lane_pipe = bool(me.bulk_address) and self.options.lane_calls
        me.lane_plain = me.lane_pipe
        publish_devices(me, self.options.device_maps, self.options.devices)
        timeout = self.options.init_timeout
        if self.plan.store_file:
            self._file_rendezvous(timeout)
        if self.rank == HOST_RANK and self.ctx.dynamic:
            if self.token_generated:  # members of this user on this machine read it there
                port = int(self.address.rpartition(":")[2])
                self._local_token_file = publish_local_token(port, self.token or "")
            problems = validate_device_maps([me], dynamic=True)
            if problems:
                raise RpcInitError("invalid device maps: " + "; ".join(problems) + " (docs/gpu.md)")
            reply = pb.JoinReply(workers=[me], session=uuid.uuid4().hex)
        elif self.rank == HOST_RANK:
            assert self.rendezvous is not None
            run_sync(self._add_self(me), timeout)
            try:
                reply = run_sync(self.rendezvous.wait(timeout), timeout + 5)
            except TimeoutError as exc:
                raise RpcInitError(f"rendezvous timed out after {timeout} s") from exc
            except RpcInitError:
                # Ranks still to come learn why it failed (as in PyTorch, every rank raises
                # the reason: a duplicate name "is not unique"), not that rank 0 is gone.
                if self.rendezvous.error:
                    grace = min(timeout, _JOIN_FAILURE_GRACE)
                    run_sync(self.rendezvous.linger(grace), grace + 5)
                raise
        else:
            started = time.monotonic()
            self._local_token(timeout)
            try:
                reply = self.transport.control(
                    self.plan.master,
                    "Join",
                    pb.JoinRequest(
                        worker=me, world_size=self.world_size, assign_rank=self.assign_rank
                    ),
                    pb.JoinReply,
                    timeout,
                    wait_for_ready=True,
                )
            except grpc.RpcError as exc:
                err = map_rpc_error(exc, f"rank 0 at {self.plan.master}", "Join", started, timeout)
                raise RpcInitError(f"rendezvous failed: {err}") from exc
            if reply.token:
                if self.options.token:
                    raise RpcInitError(
                        "this worker has a token (GRADWIRE_TOKEN) but rank 0 has none; configure "
                        "the same token on every worker"
                    )
                self.token = reply.token
            if self.assign_rank:
                self._take_rank(reply.rank)
        self.transport.set_token(self.token, self.rank)
        self.session = reply.session
        self.table.fill(
            [peer_from(w, me.host_id) for w in reply.workers],
            DeviceMaps(self.name, self.options.device_maps, reply.workers),
        )
        self.membership.start(list(reply.workers), me.host_id)
        if self.rank == HOST_RANK and not self.ctx.dynamic:
            self.barriers = BarrierHost({p.id: p.name for p in self.peers})
        self.liveness.start()
        # RUNNING before ready: a peer's call admitted by the ready gate may at once ask for
        # the current agent (get_worker_info() in the called function), which needs RUNNING.
        self._set_state(AgentState.RUNNING)
        io_loop().call_soon_threadsafe(self._ready.set)
        self._ready_flag.set()
        log.info("worker %s (rank %d) joined session %s", self.name, self.rank, self.session)

    def _local_token(self, timeout: float) -> None:
        """A member of a dynamic group with no token joins a host on this machine with the
        token that host made up and left for this user (a Join without it is refused)."""
        host, _, port = self.plan.master.rpartition(":")
        if not (self.ctx.dynamic and self.token is None and is_loopback(host) and port.isdigit()):
            return
        # The host may start a little later; a host with a configured token writes no file,
        # and its refusal (a Join without the token) then says why, after a short wait only.
        token = read_local_token(int(port), min(timeout, _LOCAL_TOKEN_WAIT))
        if token:
            self.token = token
            self.transport.set_token(token, self.rank)

    def _take_rank(self, rank: int) -> None:
        """The group's host assigned this worker ``rank``: build the services with it."""
        validate_rank(rank, f"the rank the host assigned to {self.name!r}")
        self.rank = rank
        self.ctx = dataclasses.replace(self.ctx, rank=rank)
        self._build()
        log.info("worker %s was assigned rank %d by the group's host", self.name, rank)

    def _file_rendezvous(self, timeout: float) -> None:
        """``file://``: rank 0 writes its address to the file; the others read it (their
        master) before they join, only from a file of their own user that only it may write,
        and with a configured token only an address that carries its proof."""
        if self.rank == HOST_RANK:
            publish_address(self.plan.store_file, self.address, self.options.token)
        else:
            master = read_address(self.plan.store_file, timeout, self.options.token)
            self.plan = dataclasses.replace(self.plan, master=master)

    async def _add_self(self, me: pb.WorkerInfo) -> None:
        assert self.rendezvous is not None
        self.rendezvous.add(me, self.world_size)

    async def serve_join(self, request: pb.JoinRequest, authenticated: bool) -> pb.JoinReply:
        """Rank 0's Join handler (on the I/O loop).

        Args:
            request: the Join.
            authenticated: the call carried the cluster token. Without it (a token rank 0 made
                up), only a rank the rendezvous still waits for may join: it learns the token
                from the reply. Once every rank joined, or for a rank that already did, such a
                Join is refused, so no reply to an unauthenticated caller carries the token.

        Raises:
            RpcInitError: the Join does not fit the group.
            AuthenticationError: a Join without the token that the rendezvous does not wait for.
        """
        who = request.worker.name
        if request.world_size == 0 and not self.ctx.dynamic and self.rank == HOST_RANK:
            raise RpcInitError(
                f"worker {who!r} joins without a world size (a dynamic group), but rank 0 "
                f"({self.name!r}) hosts a fixed group of {self.world_size} workers; give it "
                f"world_size={self.world_size}"
            )
        if request.world_size != 0 and self.ctx.dynamic and self.rank == HOST_RANK:
            raise RpcInitError(
                f"worker {who!r} expects world_size {request.world_size}, but rank 0 "
                f"({self.name!r}) hosts a dynamic group (started without a world size); start "
                "it without world_size to join"
            )
        if self.ctx.dynamic and self.rank == HOST_RANK:
            if not authenticated:  # members come at any time: each brings the token
                raise AuthenticationError(
                    f"worker {self.name!r} hosts a dynamic group: a Join must carry its cluster "
                    "token (GRADWIRE_TOKEN; a host started without one made one up, which only "
                    "members of the same user on the same machine can read)"
                )
            if not await self.wait_ready(self.options.init_timeout):
                raise RpcInitError(f"the group's host {self.name!r} has not started yet")
            workers, rank = await self.membership.serve_join(request.worker, request.assign_rank)
            return pb.JoinReply(
                workers=workers,
                rank=rank,
                session=self.session,
                token=self.token if self.token_generated and self.token else "",
            )
        if self.rendezvous is None:
            raise RpcInitError(
                f"worker {self.name!r} (rank {self.rank}) does not host the rendezvous"
            )
        if not authenticated and not self.rendezvous.waits_for(request.worker.id):
            raise AuthenticationError(
                f"worker {self.name!r}: a Join for rank {request.worker.id} without the cluster "
                "token, but the rendezvous no longer waits for that rank (every rank joined, or "
                "this one already did); a worker that joins later needs the token "
                "(GRADWIRE_TOKEN), and the token is never sent to a caller without it"
            )
        if request.assign_rank:
            raise RpcInitError(
                f"worker {who!r} asks for a rank, but rank 0 ({self.name!r}) hosts a fixed "
                f"group of {self.world_size} workers, where each worker brings its rank"
            )
        self.rendezvous.add(request.worker, request.world_size)
        reply = await self.rendezvous.wait(self.options.init_timeout)
        reply.rank = request.worker.id
        return reply

    # -- barrier and shutdown --------------------------------------------------------------------

    def barrier(self, name: str, timeout: float) -> pb.BarrierReply:
        """Wait until every worker reached barrier ``name`` (generation counted per agent)."""
        request = pb.BarrierRequest(
            name=name, worker_id=self.rank, generation=next(self._barrier_gen)
        )
        if self.rank == 0:
            assert self.barriers is not None
            return run_sync(
                self.barriers.arrive(request.name, request.generation, self.rank, timeout),
                timeout + 5,
            )
        started = time.monotonic()
        try:
            return self.transport.control(
                self.peers[0].dial, "Barrier", request, pb.BarrierReply, timeout + 5
            )
        except grpc.RpcError as exc:
            raise map_rpc_error(
                exc, self.peers[0].name, "shutdown barrier", started, timeout
            ) from exc

    def shutdown(
        self,
        graceful: bool,
        timeout: float,
        drain_rrefs: Callable[[float], object] | None = None,
        leak_check: str | None = None,
        meet_peers: Callable[[float], object] | None = None,
    ) -> None:
        """Stop this agent. Graceful: drain own calls, meet every peer at a barrier, then stop.

        Args:
            graceful: drain and meet the peers first.
            timeout: seconds for the graceful part.
            drain_rrefs: called with the deadline (monotonic) to settle the RRef protocol and
                delete every UserRRef (default ``self.rref.drain``; PyTorch's tests replace
                it through ``rpc.api._delete_all_user_and_unforked_owner_rrefs``).
            leak_check: "error", "warn" or "off" instead of the ``rref_leak_check`` option.
            meet_peers: called with the deadline (monotonic) to meet every worker once this
                one has no call of its own pending (default: the "shutdown" barrier; the rpc
                api passes PyTorch's ``rpc.api._wait_all_workers`` gather).

        Raises:
            RpcTimeoutError: graceful shutdown did not complete in ``timeout`` (the agent is
                stopped anyway).
            WorkerUnavailableError: rank 0 was unreachable for the barrier (stopped anyway).
        """
        with self._state_lock:
            if self.state in (AgentState.SHUTTING_DOWN, AgentState.SHUTDOWN):
                return
        self._set_state(AgentState.SHUTTING_DOWN)
        deadline = time.monotonic() + timeout
        problem: Exception | None = None
        if graceful:
            try:
                if not self.caller.wait_pending(deadline):
                    raise RpcTimeoutError(
                        f"shutdown of {self.name!r}: own calls still pending after {timeout} s",
                        self.name,
                        timeout,
                    )
                if self.ctx.dynamic:  # the others go on: leave without meeting them
                    problem = self._leave(deadline, drain_rrefs, leak_check)
                else:
                    problem = self._meet_all(deadline, timeout, drain_rrefs, leak_check, meet_peers)
            except (RpcTimeoutError, WorkerUnavailableError) as exc:
                problem = exc
            except Exception as exc:  # stop anyway, report
                problem = exc
        self._stop(grace=max(0.0, min(2.0, deadline - time.monotonic())) if graceful else 0.0)
        if problem is not None:
            raise problem

    def _meet_all(
        self,
        deadline: float,
        timeout: float,
        drain_rrefs: Callable[[float], object] | None,
        leak_check: str | None,
        meet_peers: Callable[[float], object] | None,
    ) -> Exception | None:
        """Stop a fixed group together (own calls are answered); the leak check's error."""
        if meet_peers is None:
            self._meet("shutdown", deadline, timeout)
        else:
            meet_peers(deadline)
        # Every user call is answered now, so no new fork can arrive: settle the RRef
        # confirmations, send the deletes of every UserRRef and have them answered;
        # once every worker did (a second barrier), owners hold only what leaked.
        (drain_rrefs or self.rref.drain)(deadline)
        self._meet("rref-drain", deadline, timeout)
        self.callee.wait_idle(deadline - time.monotonic())
        return self.rref.check_leaks(leak_check)

    def _leave(
        self,
        deadline: float,
        drain_rrefs: Callable[[float], object] | None,
        leak_check: str | None,
    ) -> Exception | None:
        """Leave a dynamic group (own calls are answered): settle this worker's RRefs (forks
        confirmed, every UserRRef deleted, the forks of its OwnerRRefs given back by their
        holders, until ``deadline``), tell the group, finish serving; the leak check's error."""
        drain = drain_rrefs or self.rref.drain
        drain(deadline)
        self._wait_owned_released(deadline)
        self.membership.leave(max(0.5, deadline - time.monotonic()))
        self.callee.wait_idle(deadline - time.monotonic())
        # Calls served while leaving may have brought forks: delete them too, and give their
        # holders a moment for the forks of this worker's RRefs they were sent meanwhile.
        drain(deadline)
        self._wait_owned_released(min(deadline, time.monotonic() + 2.0))
        return self.rref.check_leaks(leak_check)

    def _wait_owned_released(self, deadline: float) -> None:
        said = False
        while any(leak.forks for leak in self.rref.protocol.leaked_owner_rrefs()):
            if not said:
                log.info("%s leaves once other workers delete its RRefs", self.name)
                said = True
            if time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def _meet(self, name: str, deadline: float, timeout: float) -> None:
        reply = self.barrier(name, max(0.001, deadline - time.monotonic()))
        if not reply.ok:
            raise RpcTimeoutError(
                f"{name} barrier timed out after {timeout} s; workers that never "
                f"arrived: {', '.join(reply.missing)}",
                self.name,
                timeout,
            )

    def _stop(self, grace: float) -> None:
        if self.plan.store_file and self.rank == HOST_RANK and self.address:
            withdraw_address(self.plan.store_file, self.address)
        if self._local_token_file and self.token:
            withdraw_address(self._local_token_file, self.token)
        if not self._built:  # the Join failed before the host assigned a rank
            self._close(grace)
            return
        self.liveness.stop()
        for peer in self.table.departed.values():
            set_departed(peer.name, False)
        self.autograd.close()
        self.rref.close()
        self.caller.fail_all(f"RPC agent of {self.name!r} shut down while the call was pending")
        self._close(grace)

    def _close(self, grace: float) -> None:
        """Stop the server, the transport and the pool; SHUTDOWN."""
        self.transport.close_streams()
        if self._stop_server is not None:
            try:
                self._stop_server(grace)
            except Exception:
                log.exception("stopping the server of %s failed", self.name)
        self.transport.close()
        self.pool.close()
        if self.local_address:
            shutil.rmtree(self._unix_dir, ignore_errors=True)
        self._set_state(AgentState.SHUTDOWN)

    # -- extension points ------------------------------------------------------------------------

    def register_control_handler(self, method: str, handler: Callable[..., Any]) -> None:
        """Serve Worker method ``method`` with ``handler`` (runs on the serving pool).

        Unary methods (ForkRequest, ChildAck, RRefDelete, ReleaseContext) call
        ``handler(request, caller_id)``; framed ones (RemoteCall, PropagateGradients) call
        ``handler(message, caller_id)`` with the assembled ``framing.Message``; FetchRRef calls
        ``handler(request, caller_id)`` and expects a ``callee.Reply`` (first header, buffers).
        The handler returns the response, or a gradwire Future of it (awaited without a thread).
        """
        self.control_handlers[method] = handler

    def emit_control_event(self, event: pb.ControlEvent) -> None:
        """Publish a control event to WatchControl subscribers (thread-safe)."""
        self.control_events.emit(event)

    def add_watcher(self, queue: asyncio.Queue[pb.ControlEvent]) -> None:
        self.control_events.add_watcher(queue)

    def remove_watcher(self, queue: asyncio.Queue[pb.ControlEvent]) -> None:
        self.control_events.remove_watcher(queue)

    # -- inspection ----------------------------------------------------------------------------

    def debug_info(self) -> dict[str, Any]:
        """Counters, state and per-peer channel state of this worker."""
        states = self.transport.channel_states()
        return {
            "worker": self.name,
            "worker_id": self.rank,
            "state": self.state.value,
            "session": self.session,
            "calls_served": self.callee.served,
            "calls_in_flight": self.callee.in_flight,
            "calls_failed": self.callee.failed,
            "calls_served_fast_lane": self.callee.served_fast_lane,
            "calls_pending": len(self.caller.pending),
            "serving_threads": self.pool.num_threads,
            **self.autograd.debug_info(),
            **self.rref.debug_info(),
            **self.liveness.debug_info(),
            **self.shm_routes.debug_info(),
            **(self.bulk_lane.debug_info() if self.bulk_lane is not None else {}),
            "peers": [
                {
                    "name": p.name,
                    "id": p.id,
                    "address": p.dial,
                    "channel_state": states.get(p.dial, "IDLE"),
                    # The second ports this worker uses to reach it ("" when it has none).
                    "fast_lane_address": p.call_dial if p.call_dial != p.dial else "",
                    "bulk_address": p.bulk_address,
                }
                for p in self.peers
            ],
        }
