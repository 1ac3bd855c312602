"""What services learn from each other without holding each other: the agent's state changes,
a peer declared lost (or answering again), a member that joined or left a dynamic group, and
the control events of WatchControl.

The failure detector publishes "peer lost"; the agent subscribes the services that act on it
(fail the calls pending to it, drop its channels, reclaim its dist-autograd contexts, stop
waiting for it at the barriers, tell the RRef service). Subscribers run on the publishing
thread, in the order they subscribed, and must not block.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable

from ..._proto import worker_pb2 as pb
from ..transport.loop import io_loop
from .workers import Peer

__all__ = ["AgentState", "ClusterEvents", "ControlEvents"]

log = logging.getLogger(__name__)


class AgentState(enum.Enum):
    """Lifecycle of an agent."""

    #: Created; the server may run but the rendezvous has not started.
    UNINITIALIZED = "UNINITIALIZED"
    #: Serving and waiting for every rank at the rendezvous.
    JOINING = "JOINING"
    #: Joined: calls flow in both directions.
    RUNNING = "RUNNING"
    #: shutdown() started: still serving peers, draining, at the barrier.
    SHUTTING_DOWN = "SHUTTING_DOWN"
    #: Stopped; a new init_rpc may create another agent in this process.
    SHUTDOWN = "SHUTDOWN"


class ClusterEvents:
    """The agent's state changes and the peers declared lost, for the services that react."""

    def __init__(self) -> None:
        self.state = AgentState.UNINITIALIZED
        #: worker id -> (time.time() when declared lost, reason), while it does not answer.
        self.lost: dict[int, tuple[float, str]] = {}
        #: worker id -> time.time() when it left the (dynamic) group with shutdown().
        self.departed: dict[int, float] = {}
        self._on_state: list[Callable[[AgentState], None]] = []
        self._on_peer_lost: list[Callable[[Peer, str], None]] = []
        self._on_peer_back: list[Callable[[Peer], None]] = []
        self._on_peer_joined: list[Callable[[Peer], None]] = []
        self._on_peer_left: list[Callable[[Peer], None]] = []

    def on_state(self, listener: Callable[[AgentState], None]) -> None:
        """Call ``listener(state)`` on every later state change."""
        self._on_state.append(listener)

    def on_peer_lost(self, listener: Callable[[Peer, str], None]) -> None:
        """Call ``listener(peer, why)`` when a peer is declared lost."""
        self._on_peer_lost.append(listener)

    def on_peer_joined(self, listener: Callable[[Peer], None]) -> None:
        """Call ``listener(peer)`` when a member joins (dynamic group)."""
        self._on_peer_joined.append(listener)

    def on_peer_left(self, listener: Callable[[Peer], None]) -> None:
        """Call ``listener(peer)`` when a member leaves with shutdown() (dynamic group)."""
        self._on_peer_left.append(listener)

    def state_changed(self, state: AgentState) -> None:
        self.state = state
        for listener in list(self._on_state):
            try:
                listener(state)
            except Exception:
                log.exception("agent state listener failed")

    def peer_lost(self, peer: Peer, why: str) -> None:
        """``peer`` stopped answering for ``peer_lost_seconds``: tell every subscriber."""
        self.lost[peer.id] = (time.time(), why)
        for listener in list(self._on_peer_lost):
            try:
                listener(peer, why)
            except Exception:
                log.exception("peer-lost listener failed")

    def on_peer_back(self, listener: Callable[[Peer], None]) -> None:
        """Call ``listener(peer)`` when a peer declared lost answers again."""
        self._on_peer_back.append(listener)

    def peer_back(self, peer: Peer) -> None:
        """A peer declared lost answers again: tell every subscriber."""
        if self.lost.pop(peer.id, None) is not None:
            self._publish(self._on_peer_back, peer, "peer-back")

    def peer_joined(self, peer: Peer) -> None:
        """``peer`` joined the group: tell every subscriber."""
        self.departed.pop(peer.id, None)
        self.lost.pop(peer.id, None)  # a new worker under a rank once lost
        self._publish(self._on_peer_joined, peer, "peer-joined")

    def peer_left(self, peer: Peer) -> None:
        """``peer`` left the group with shutdown(): tell every subscriber."""
        self.departed[peer.id] = time.time()
        self._publish(self._on_peer_left, peer, "peer-left")

    @staticmethod
    def _publish(listeners: list[Callable[[Peer], None]], peer: Peer, what: str) -> None:
        for listener in list(listeners):
            try:
                listener(peer)
            except Exception:
                log.exception("%s listener failed", what)

    def is_lost(self, worker_id: int) -> bool:
        """Lost, or departed: nothing will reach it any more (messages stop retrying)."""
        return worker_id in self.lost or worker_id in self.departed


class ControlEvents:
    """The WatchControl subscribers: each one an asyncio queue on the I/O loop."""

    def __init__(self) -> None:
        self._watchers: list[asyncio.Queue[pb.ControlEvent]] = []

    @property
    def listening(self) -> bool:
        """Whether anyone watches (so that an event need not be built at all)."""
        return bool(self._watchers)

    def emit(self, event: pb.ControlEvent) -> None:
        """Publish ``event`` to every subscriber (thread-safe)."""
        loop = io_loop()
        for q in list(self._watchers):
            loop.call_soon_threadsafe(q.put_nowait, event)

    def add_watcher(self, queue: asyncio.Queue[pb.ControlEvent]) -> None:
        self._watchers.append(queue)

    def remove_watcher(self, queue: asyncio.Queue[pb.ControlEvent]) -> None:
        if queue in self._watchers:
            self._watchers.remove(queue)
