"""Sending one RemoteCall without holding a thread: gRPC futures, retried with backoff.

A remote() returns at once and its RemoteCall may wait for a long function on the owner, so
a blocked thread per remote() would cost a thread per call in flight. Each attempt is a gRPC
future instead; a transient failure (UNAVAILABLE, DEADLINE_EXCEEDED) schedules the next
attempt on the I/O loop after a jittered, doubling pause, until the deadline. The outcome is
handed to the serving pool (never run on gRPC's callback thread).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from .._proto import worker_pb2 as pb
from . import loop as io
from .retry import TRANSIENT
from .transport import map_rpc_error
from .workers import Peer

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["RemoteSend"]

#: Upper bound of one attempt: a retry re-asks for the ack of a call still running.
ATTEMPT_SECONDS = 10.0
_FIRST_PAUSE, _MAX_PAUSE = 0.05, 2.0

Done = Callable[[pb.RemoteAck | None, BaseException | None], None]


class RemoteSend:
    """One RemoteCall: ``start()`` it; ``on_done(ack, None)`` or ``on_done(None, error)`` runs
    on the serving pool exactly once.

    Args:
        agent: the caller's agent.
        peer: the owner.
        frames: the encoded call (one frame when ``single``: the unary ``Remote`` method).
        deadline: ``time.monotonic()`` after which the last error is final.
        on_done: the outcome.
        on_attempt: called before each attempt (WatchControl).
    """

    def __init__(
        self,
        agent: Agent,
        peer: Peer,
        frames: list[Any],
        single: bool,
        deadline: float,
        on_done: Done,
        on_attempt: Callable[[], None],
    ) -> None:
        self._agent = agent
        self._peer = peer
        self._frames = frames
        self._single = single
        self._deadline = deadline
        self._on_done = on_done
        self._on_attempt = on_attempt
        self._started = time.monotonic()
        self._pause = _FIRST_PAUSE

    def start(self) -> None:
        """Send the first attempt (non-blocking)."""
        self._attempt()

    def _attempt(self) -> None:
        left = self._deadline - time.monotonic()
        timeout = max(0.001, min(ATTEMPT_SECONDS, left))
        self._on_attempt()
        transport = self._agent.transport
        try:
            if self._single:
                transport.remote_future(self._peer.dial, self._frames[0], timeout, self._settled)
            else:
                transport.framed_control_future(
                    self._peer.dial,
                    "RemoteCall",
                    self._frames,
                    pb.RemoteAck,
                    timeout,
                    self._settled,
                )
        except BaseException as exc:  # noqa: BLE001 - e.g. the transport is closed
            self._finish(None, exc)

    def _settled(self, gfut: Any) -> None:
        # On gRPC's callback thread: decide, never run the outcome here.
        exc = gfut.exception()
        if exc is None:
            self._finish(gfut.result(), None)
            return
        if isinstance(exc, grpc.RpcError):
            exc = map_rpc_error(exc, self._peer.name, "RemoteCall", self._started, None)
        left = self._deadline - time.monotonic()
        if isinstance(exc, TRANSIENT) and left > 0:
            pause = min(random.uniform(0, self._pause), left)
            self._pause = min(_MAX_PAUSE, self._pause * 2)
            loop = io.io_loop()
            loop.call_soon_threadsafe(loop.call_later, pause, self._attempt)
            return
        self._finish(None, exc)

    def _finish(self, ack: pb.RemoteAck | None, error: BaseException | None) -> None:
        try:
            self._agent.pool.submit(self._on_done, ack, error)
        except RuntimeError:  # pool closed: the agent is stopping
            self._on_done(ack, error)
