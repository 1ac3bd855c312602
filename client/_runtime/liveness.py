"""Failure detection: notice a dead peer and act on it at once instead of at the timeouts.

Triggers, both event driven:

- the failure of an in-flight call: every caller-side gRPC failure goes through
  ``transport.map_rpc_error``; an UNAVAILABLE or DEADLINE_EXCEEDED there makes the peer a
  *suspect*;
- a channel state subscription (``grpc.Channel.subscribe``) on the channel to every peer,
  opened at the rendezvous: a connection that drops (READY -> IDLE / TRANSIENT_FAILURE: the
  peer's process closed it, e.g. it was killed) makes the peer a suspect even when this
  worker has no call in flight to it (it may hold contexts the peer created).

A suspect is probed with the standard health check over its channel, with backoff, until it
answers or ``peer_lost_seconds`` pass:

- SERVING or NOT_SERVING (shutting down gracefully): alive, nothing happens;
- unreachable for ``peer_lost_seconds``: the peer is *lost*. Then, in this order:
  every pending call to it fails with WorkerUnavailableError naming the peer and why
  (``Caller.fail_peer``); its channel is closed, which cancels the gRPC calls still blocked on
  it (a new channel is made on the next call, so a healed partition recovers); the
  dist-autograd contexts it created are reclaimed (``autograd.on_peer_lost``); on rank 0 the
  shutdown barriers stop waiting for it (``BarrierHost.mark_gone``); the RRef service is told
  (``rref.on_peer_lost``, when it has one); a ``PeerLost`` control event is published.

The detector runs while the agent is RUNNING or SHUTTING_DOWN, so a peer killed during a
graceful shutdown does not hold the survivors at the barrier until its timeout.

A refused connection (the peer's process is gone, its port closed) is "unreachable" like a
black hole; only the grace period tells a partition that heals from a death. A peer that
answers again after being declared lost is simply reachable again (logged).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from .._proto import worker_pb2 as pb
from . import loop as io
from . import transport

if TYPE_CHECKING:
    from .agent import Agent
    from .workers import Peer

__all__ = ["Liveness"]

log = logging.getLogger(__name__)
_SUSPICIOUS = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
#: Running, or shutting down (a peer dying then must not hold the shutdown barriers).
_WATCHED_STATES = ("RUNNING", "SHUTTING_DOWN")
_DROPPED = (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.TRANSIENT_FAILURE)


class Liveness:
    """The failure detector of one agent (started after the rendezvous, stopped with it)."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._probing: dict[int, threading.Thread] = {}
        #: worker id -> (time.time() when declared lost, reason)
        self.lost: dict[int, tuple[float, str]] = {}
        self._subscriptions: list[tuple[grpc.Channel, Callable[..., None]]] = []

    def start(self) -> None:
        """Listen for failed calls and watch the channel to every peer."""
        transport.add_failure_observer(self.report)
        agent = self._agent
        for peer in agent.peers:
            if peer.id == agent.rank:
                continue
            try:
                channel = agent.transport.channel(peer.dial)
            except Exception:  # noqa: BLE001 - shutting down already
                return
            watch = self._watcher(peer)
            channel.subscribe(watch, try_to_connect=True)
            self._subscriptions.append((channel, watch))

    def _watcher(self, peer: Peer) -> Callable[[grpc.ChannelConnectivity], None]:
        last = [grpc.ChannelConnectivity.IDLE]

        def on_state(state: grpc.ChannelConnectivity) -> None:
            before, last[0] = last[0], state
            if before == grpc.ChannelConnectivity.READY and state in _DROPPED:
                self.report(peer.name, grpc.StatusCode.UNAVAILABLE)

        return on_state

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening; wait (bounded) for running probes to notice."""
        transport.remove_failure_observer(self.report)
        self._stopped.set()
        for channel, watch in self._subscriptions:
            try:
                channel.unsubscribe(watch)
            except Exception:  # noqa: BLE001 - the channel may be closed already
                pass
        self._subscriptions.clear()
        for worker_id in list(self.lost):
            transport.set_lost(self._agent.peer_name(worker_id), None)
        with self._lock:
            threads = list(self._probing.values())
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def report(self, peer_name: str, code: grpc.StatusCode) -> None:
        """A call to ``peer_name`` failed with ``code`` (any thread; returns at once)."""
        if code not in _SUSPICIOUS or self._stopped.is_set():
            return
        agent = self._agent
        peer = agent.by_name.get(peer_name)
        if peer is None or peer.id == agent.rank or agent.state.value not in _WATCHED_STATES:
            return
        with self._lock:
            if peer.id in self._probing or self._stopped.is_set():
                return
            t = threading.Thread(
                target=self._probe, args=(peer,), name=f"gradwire-liveness-{peer.name}", daemon=True
            )
            self._probing[peer.id] = t
            t.start()  # under the lock: stop() never joins a thread not started yet
        log.debug("%s: %s suspect after %s", agent.name, peer.name, code.name)

    def _probe(self, peer: Peer) -> None:
        agent = self._agent
        grace = agent.options.peer_lost_seconds
        started = time.monotonic()
        delay, why = 0.05, ""
        try:
            while not self._stopped.is_set():
                left = started + grace - time.monotonic()
                try:
                    agent.transport.health(peer.dial, max(0.05, min(1.0, left)))
                    if peer.id in self.lost:
                        log.warning("%s: worker %r answers again", agent.name, peer.name)
                        del self.lost[peer.id]
                        transport.set_lost(peer.name, None)
                    return
                except grpc.RpcError as exc:
                    if exc.code() not in _SUSPICIOUS:
                        return  # it answered something: the process is there
                    why = f"{exc.code().name}: {exc.details()}"
                left = started + grace - time.monotonic()
                if left <= 0:
                    self._declare_lost(peer, f"unreachable for {grace:g} s ({why})")
                    return
                self._stopped.wait(min(delay, left))
                delay = min(1.0, delay * 2)
        except Exception:  # a detector bug must not take the worker down
            log.exception("%s: probing %s failed", agent.name, peer.name)
        finally:
            with self._lock:
                self._probing.pop(peer.id, None)

    def _declare_lost(self, peer: Peer, why: str) -> None:
        agent = self._agent
        if agent.state.value not in _WATCHED_STATES:
            return
        self.lost[peer.id] = (time.time(), why)
        transport.set_lost(peer.name, why)  # later failures to reach it say it is lost
        log.warning("%s: worker %r is lost: %s", agent.name, peer.name, why)
        agent.caller.fail_peer(peer.id, f"worker {peer.name!r} is lost: {why}")
        agent.transport.drop(peer.dial)
        if peer.call_dial != peer.dial:
            agent.transport.drop(peer.call_dial)
        agent.autograd.on_peer_lost(peer.id)
        if agent.barriers is not None:  # rank 0: the shutdown barriers stop waiting for it
            io.io_loop().call_soon_threadsafe(agent.barriers.mark_gone, peer.id)
        on_lost = getattr(agent.rref, "on_peer_lost", None)
        if on_lost is not None:
            on_lost(peer.id)
        agent.emit_control_event(
            pb.ControlEvent(kind="PeerLost", direction="received", peer=peer.name, time=time.time())
        )

    def debug_info(self) -> dict[str, object]:
        """``peers_lost``: names of the peers declared lost (and still not answering)."""
        return {"peers_lost": [self._agent.peer_name(i) for i in sorted(self.lost)]}
