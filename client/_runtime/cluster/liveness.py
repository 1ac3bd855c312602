"""Failure detection: notice a dead peer and act on it at once instead of at the timeouts.

Triggers, both event driven:

- the failure of an in-flight call: every caller-side gRPC failure goes through
  ``transport.map_rpc_error``; an UNAVAILABLE or DEADLINE_EXCEEDED there makes the peer a
  *suspect*;
- the connectivity of the channel to every peer, opened at the rendezvous and read by one
  thread every ``WATCH_SECONDS`` for all peers (about a microsecond a channel; gRPC's
  ``Channel.subscribe`` would keep a thread per peer waking five times a second): a
  connection that drops (READY -> IDLE / TRANSIENT_FAILURE: the peer's process closed it,
  e.g. it was killed) makes the peer a suspect even when this worker has no call in flight
  to it (it may hold contexts the peer created).

A suspect is probed with the standard health check over its channel, with backoff, until it
answers or ``peer_lost_seconds`` pass (one probe may wait for what is left of them: on a
machine running dozens of workers on a few cores, a live peer answers late):

- SERVING or NOT_SERVING (shutting down gracefully): alive, nothing happens;
- no answer, but a call or a reply from the peer arrived within ``peer_lost_seconds``
  (``PeerTable.heard``): alive, only slow;
- on an overloaded machine (a load average of more than ``OVERLOADED_PER_CPU`` per CPU) the
  grace grows with the load, up to the ``rpc_timeout`` (``_grace``);
- unreachable for ``peer_lost_seconds``: the peer is *lost*: the detector publishes it
  (``ClusterEvents.peer_lost``) and a ``PeerLost`` control event. The agent subscribed, in
  this order: every pending call to it fails with WorkerUnavailableError naming the peer and
  why (``Caller.fail_peer``); its channels are closed, which cancels the gRPC calls still
  blocked on them (a new channel is made on the next call, so a healed partition recovers);
  the dist-autograd contexts it created are reclaimed (``on_peer_lost`` of the dist-autograd
  service); on rank 0 the shutdown barriers stop waiting for it (``BarrierHost.mark_gone``);
  the RRef service is told (``on_peer_lost``).

The detector runs while the agent is RUNNING or SHUTTING_DOWN, so a peer killed during a
graceful shutdown does not hold the survivors at the barrier until its timeout.

A refused connection (the peer's process is gone, its port closed) is "unreachable" like a
black hole; only the grace period tells a partition that heals from a death. So a lost peer
is probed on, every ``RECOVERY_PROBE_SECONDS`` at most (one thread per *lost* peer, none for
the healthy ones): once it answers, it is alive again (``ClusterEvents.peer_back``, a
``PeerBack`` control event): its lost mark goes, the shutdown barriers wait for it again and its
channel is watched again. What was released when it was lost stays released (its calls failed,
its contexts and RRefs were reclaimed on both sides), so nothing stale is left.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import grpc

from ..._proto import worker_pb2 as pb
from ..transport import transport
from ..transport.transport import Transport, connectivity
from .context import WorkerContext
from .events import AgentState, ClusterEvents, ControlEvents
from .workers import Peer

__all__ = ["Liveness"]

log = logging.getLogger(__name__)
_SUSPICIOUS = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
#: Running, or shutting down (a peer dying then must not hold the shutdown barriers).
_WATCHED_STATES = (AgentState.RUNNING, AgentState.SHUTTING_DOWN)
_DROPPED = (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.TRANSIENT_FAILURE)
#: The longest pause between two probes of a lost peer (they start at 0.25 s and double).
RECOVERY_PROBE_SECONDS = 2.0
#: How often the channels' connectivity is read (a dropped connection is seen this late).
WATCH_SECONDS = 1.0
#: Runnable threads per CPU (the load average) past which this machine counts as overloaded:
#: the grace before a silent peer is lost then grows with the load (``Liveness._grace``).
OVERLOADED_PER_CPU = 8.0


def _load() -> float | None:
    """Runnable threads on this machine: the larger of the one-minute load average and the
    threads runnable right now (the average lags a minute behind a cluster that just started;
    Linux's ``/proc/loadavg``, else ``os.getloadavg``). None where neither exists."""
    try:
        with open("/proc/loadavg") as f:
            fields = f.read().split()
        return max(float(fields[0]), float(fields[3].split("/")[0]))
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _dropped(before: grpc.ChannelConnectivity, now: grpc.ChannelConnectivity) -> bool:
    """Whether a watched channel's change from ``before`` to ``now`` means its connection
    dropped: from READY to IDLE or TRANSIENT_FAILURE, or from CONNECTING to IDLE (it connected
    and closed between two readings). A first connection that fails (CONNECTING to
    TRANSIENT_FAILURE) is not one: dozens of workers connecting at once overflow a listener's
    backlog, and gRPC tries again; a call that cannot reach the peer makes it a suspect."""
    if now == grpc.ChannelConnectivity.IDLE:
        return before in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.CONNECTING)
    return before == grpc.ChannelConnectivity.READY and now in _DROPPED


class _Watch:
    """One watched channel: the connectivity read last, and ``gone`` for a departed member
    (called once its connection drops) or None for a member (a drop makes it a suspect)."""

    __slots__ = ("peer", "channel", "gone", "last")

    def __init__(self, peer: Peer, channel: grpc.Channel, gone: Callable[[Peer], None] | None):
        self.peer = peer
        self.channel = channel
        self.gone = gone
        self.last = grpc.ChannelConnectivity.CONNECTING


class Liveness:
    """The failure detector of one worker (started after the rendezvous, stopped with it).

    Args:
        ctx: the worker's identity, options and peers.
        transport: the channels it watches and probes.
        events: where it reads the agent's state and publishes the peers it declares lost.
        control: the WatchControl events (``PeerLost``).
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
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._probing: dict[int, threading.Thread] = {}
        #: worker id -> (time.time() when declared lost, reason)
        self.lost = events.lost
        #: worker id -> its channel as watched
        self._watched: dict[int, _Watch] = {}
        self._overload_logged = False
        self._poller = threading.Thread(
            target=self._poll, name=f"gradwire-liveness-{ctx.name}", daemon=True
        )

    def start(self) -> None:
        """Listen for failed calls and watch the channel to every peer."""
        transport.add_failure_observer(self.report)
        for peer in self._ctx.peers:
            self.watch(peer)
        self._poller.start()

    def watch(self, peer: Peer) -> None:
        """Watch the channel to ``peer`` (at the start, and when it joins a dynamic group)."""
        if peer.id == self._ctx.rank or self._stopped.is_set():
            return
        transport.set_lost(peer.name, None)  # a worker joining under a name once lost
        self.forget(peer)
        try:
            channel = self._transport.channel(peer.dial)
        except Exception:  # noqa: BLE001 - shutting down already
            return
        connectivity(channel, connect=True)  # connect now: a drop is seen only once READY
        with self._lock:
            self._watched[peer.id] = _Watch(peer, channel, None)

    def watch_departure(self, peer: Peer, gone: Callable[[Peer], None]) -> None:
        """``peer`` left its dynamic group: call ``gone(peer)`` once its connection closes
        (it stopped serving; what is still pending to it will never be answered)."""
        self.forget(peer)
        if self._stopped.is_set():
            return
        try:
            channel = self._transport.channel(peer.dial)
        except Exception:  # noqa: BLE001 - shutting down already
            return
        with self._lock:
            self._watched[peer.id] = _Watch(peer, channel, gone)

    def forget(self, peer: Peer) -> None:
        """Stop watching ``peer`` (it left a dynamic group: its going away is no failure)."""
        with self._lock:
            self._watched.pop(peer.id, None)

    def _poll(self) -> None:
        """Read the connectivity of every watched channel each ``WATCH_SECONDS`` (one thread
        for all peers, about a microsecond a channel; gRPC's ``subscribe`` would keep a
        thread per channel waking five times a second)."""
        while not self._stopped.wait(WATCH_SECONDS):
            with self._lock:
                watched = list(self._watched.values())
            for w in watched:
                state = connectivity(w.channel)
                if state is None:
                    continue  # closed (being replaced): the next watch() brings the new one
                before, w.last = w.last, state
                if w.gone is not None:
                    if state in _DROPPED:
                        self._departed(w)
                elif _dropped(before, state):
                    self.report(w.peer.name, grpc.StatusCode.UNAVAILABLE)

    def _departed(self, w: _Watch) -> None:
        with self._lock:
            if self._watched.get(w.peer.id) is not w:
                return
            del self._watched[w.peer.id]
        gone = w.gone
        assert gone is not None
        # Off the poller's thread: ``gone`` may close this channel and take its time.
        threading.Thread(
            target=gone, args=(w.peer,), name=f"gradwire-departed-{w.peer.name}", daemon=True
        ).start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening; wait (bounded) for running probes to notice."""
        transport.remove_failure_observer(self.report)
        self._stopped.set()
        with self._lock:
            self._watched.clear()
        for worker_id in list(self.lost):
            transport.set_lost(self._ctx.peer_name(worker_id), None)
        with self._lock:
            threads = list(self._probing.values())
        if self._poller.is_alive():
            threads.append(self._poller)
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def report(self, peer_name: str, code: grpc.StatusCode) -> None:
        """A call to ``peer_name`` failed with ``code`` (any thread; returns at once)."""
        if code not in _SUSPICIOUS or self._stopped.is_set():
            return
        ctx = self._ctx
        peer = ctx.peers.by_name.get(peer_name)
        if peer is None or peer.id == ctx.rank or self._events.state not in _WATCHED_STATES:
            return
        with self._lock:
            if peer.id in self._probing or self._stopped.is_set():
                return
            t = threading.Thread(
                target=self._probe, args=(peer,), name=f"gradwire-liveness-{peer.name}", daemon=True
            )
            self._probing[peer.id] = t
            t.start()  # under the lock: stop() never joins a thread not started yet
        log.debug("%s: %s suspect after %s", ctx.name, peer.name, code.name)

    def _probe(self, peer: Peer) -> None:
        ctx = self._ctx
        grace = self._grace()
        started = time.monotonic()
        delay, why = 0.05, ""
        try:
            while not self._stopped.is_set():
                left = started + grace - time.monotonic()
                # One probe may take what is left of the grace: a loaded machine's peer that
                # answers late is alive (a refused connection fails at once and is retried).
                failure = self._probe_once(peer, max(0.05, left))
                if failure is None:
                    self._back(peer)
                    return
                why = failure
                left = started + grace - time.monotonic()
                if left <= 0:
                    heard = ctx.peers.heard.get(peer.id)
                    if heard is not None and time.monotonic() - heard < grace:
                        # It sent a call or a reply within the grace: alive, only slow to
                        # answer the health check (dozens of workers on a few cores).
                        log.info("%s: %s answers slowly but is heard from", ctx.name, peer.name)
                        self._back(peer)
                        return
                    if self._declare_lost(peer, f"unreachable for {grace:g} s ({why})"):
                        self._watch_lost(peer)
                    return
                self._stopped.wait(min(delay, left))
                delay = min(1.0, delay * 2)
        except Exception:  # a detector bug must not take the worker down
            log.exception("%s: probing %s failed", ctx.name, peer.name)
        finally:
            with self._lock:
                self._probing.pop(peer.id, None)

    def _grace(self) -> float:
        """``peer_lost_seconds``, longer on an overloaded machine: with dozens of runnable
        threads per CPU (64 workers on 2 cores) a live peer, or this worker itself, may not run
        for seconds, and a frozen peer looks the same as a starved one until more time passed.
        Past ``OVERLOADED_PER_CPU`` the grace grows in proportion to the load, up to the
        ``rpc_timeout`` (a call would have failed by then anyway)."""
        base = self._ctx.options.peer_lost_seconds
        load = _load()
        if load is None:
            return base
        per_cpu = load / (os.cpu_count() or 1)
        if per_cpu <= OVERLOADED_PER_CPU:
            return base
        grace = min(max(base, self._ctx.options.rpc_timeout), base * per_cpu / OVERLOADED_PER_CPU)
        if not self._overload_logged:
            self._overload_logged = True
            log.warning(
                "%s: this machine is overloaded (load average %.0f on %d CPUs): a silent peer "
                "counts as lost after %.0f s instead of peer_lost_seconds=%g",
                self._ctx.name,
                per_cpu * (os.cpu_count() or 1),
                os.cpu_count() or 1,
                grace,
                base,
            )
        return grace

    def _probe_once(self, peer: Peer, seconds: float) -> str | None:
        """One health probe: None when the process answered (anything but unreachable), else
        what the failure said."""
        try:
            self._transport.health(peer.dial, seconds)
            return None
        except grpc.RpcError as exc:
            if exc.code() not in _SUSPICIOUS:
                return None  # it answered something: the process is there
            return f"{exc.code().name}: {exc.details()}"

    def _watch_lost(self, peer: Peer) -> None:
        """A lost peer is probed on (every ``RECOVERY_PROBE_SECONDS`` at most, on this probe's
        thread, only while it is lost) so that a healed partition heals: once it answers, it
        is marked alive again."""
        delay = 0.25
        while not self._stopped.is_set() and peer.id in self.lost:
            if self._ctx.peers.by_id.get(peer.id) != peer:
                return  # it left its dynamic group, or another worker took its rank
            if self._probe_once(peer, 1.0) is None:
                self._back(peer)
                return
            self._stopped.wait(delay)
            delay = min(RECOVERY_PROBE_SECONDS, delay * 2)

    def _back(self, peer: Peer) -> None:
        if peer.id not in self.lost:
            return
        log.warning("%s: worker %r answers again: alive", self._ctx.name, peer.name)
        transport.set_lost(peer.name, None)
        self._events.peer_back(peer)
        self._control.emit(
            pb.ControlEvent(kind="PeerBack", direction="received", peer=peer.name, time=time.time())
        )
        if not self._stopped.is_set():
            self.watch(peer)  # its old channel was closed when it was lost

    def _declare_lost(self, peer: Peer, why: str) -> bool:
        """Publish ``peer`` as lost (True), unless this worker stopped watching or the peer
        left (False)."""
        if self._events.state not in _WATCHED_STATES:
            return False
        if self._ctx.peers.by_id.get(peer.id) != peer:
            return False  # it left its dynamic group (or another worker took its rank)
        transport.set_lost(peer.name, why)  # later failures to reach it say it is lost
        log.warning("%s: worker %r is lost: %s", self._ctx.name, peer.name, why)
        self._events.peer_lost(peer, why)
        self._control.emit(
            pb.ControlEvent(kind="PeerLost", direction="received", peer=peer.name, time=time.time())
        )
        return True

    def debug_info(self) -> dict[str, object]:
        """``peers_lost``: names of the peers declared lost (and still not answering)."""
        return {"peers_lost": [self._ctx.peer_name(i) for i in sorted(self.lost)]}
