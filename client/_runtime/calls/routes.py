"""The routes a call can take to its callee, and the one place that chooses among them.

A call is sent one of three ways, each a :class:`Route`:

- ``PIPE``: one frame among many in flight on the address's ``CallPipe`` stream, sent in
  batches with the other calls waiting to go and answered in batches, in any order
  (``pipe``); no thread of either side waits for the reply: ``rpc_async``. (The caller sends
  the first two such calls in flight to a peer on its bulk lane instead, when a connection
  there is idle and the reply cannot come later: ``Caller._start_async``.)
- ``CALL_STREAM``: one frame sent and answered on the calling thread: on the peer's bulk lane
  when it has one (``Transport.call``, ``BulkLane.exchange``), else on one of the address's
  open ``CallStream`` streams (``streams``), a unary ``Call`` when every stream is busy:
  ``rpc_sync``.
- ``FRAMED_STREAM``: the message in chunks over a ``PythonCall`` stream, answered in chunks: any
  call too large for one frame (``single_frame_bytes``).

and reaches one of the callee's two servers: its fast lane (``gradwire.server.fast_lane``, a
synchronous server on a second Unix socket for peers on the same host, and on a second TCP port
for the others: ``Peer.call_dial``) or its asyncio server (``Peer.dial``). ``choose_route`` decides both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cluster.workers import Peer

__all__ = ["Route", "Choice", "PIPE", "CALL_STREAM", "FRAMED_STREAM", "choose_route"]


@dataclass(frozen=True)
class Route:
    """One way a call travels (see the module docstring)."""

    #: For logs and tests: "pipe", "call stream", "framed stream".
    name: str
    #: The request is a stream of chunks, not one frame.
    framed: bool
    #: A thread waits for the reply (the caller's, or a serving-pool thread for rpc_async);
    #: otherwise a gRPC future completes the call.
    waits: bool
    #: Whether it may go to the callee's fast lane (the fast lane serves one-frame calls).
    fast_lane_ok: bool

    def __repr__(self) -> str:
        return f"<route {self.name}>"


PIPE = Route("pipe", framed=False, waits=False, fast_lane_ok=False)
CALL_STREAM = Route("call stream", framed=False, waits=True, fast_lane_ok=True)
FRAMED_STREAM = Route("framed stream", framed=True, waits=True, fast_lane_ok=False)


@dataclass(frozen=True)
class Choice:
    """A chosen route and the address it goes to."""

    route: Route
    address: str
    #: The address is the callee's fast lane.
    fast_lane: bool


def choose_route(peer: Peer, *, one_frame: bool, blocking: bool, reply_later: bool) -> Choice:
    """The route of a call to ``peer``, and the server it reaches.

    ========= ======== =========== ================= ==========================================
    one frame blocking reply later route             server
    ========= ======== =========== ================= ==========================================
    no        any      any         ``FRAMED_STREAM`` asyncio server (``peer.dial``)
    yes       yes      no          ``CALL_STREAM``   fast lane, if any (``peer.call_dial``)
    yes       yes      yes         ``CALL_STREAM``   asyncio server
    yes       no       any         ``PIPE``          asyncio server
    ========= ======== =========== ================= ==========================================

    "Reply later": the function is ``@async_execution`` or its arguments carry RRefs (which run
    once their owners confirmed them). The fast lane serves a call on a serving-pool thread and
    would park such a reply to be fetched in a second round trip; the asyncio server sends it
    when it is there, holding no thread on either side. A peer without a fast lane (TLS) has
    ``call_dial == dial``. The pipe is served by the asyncio server, which answers each
    call of a batch when it is done without holding a thread while it waits.

    Args:
        peer: the destination.
        one_frame: the whole message fits in one frame (``single_frame_bytes``).
        blocking: the caller waits on its thread (``rpc_sync``).
        reply_later: the reply may come after the function returns (see above).

    Returns:
        The route and the address to send to.

    Example:
        >>> choose_route(peer, one_frame=True, blocking=True, reply_later=False).route.name
        'call stream'
    """
    if not one_frame:
        route = FRAMED_STREAM
    elif blocking:
        route = CALL_STREAM
    else:
        route = PIPE
    if route.fast_lane_ok and not reply_later:
        return Choice(route, peer.call_dial, peer.call_dial != peer.dial)
    return Choice(route, peer.dial, False)
