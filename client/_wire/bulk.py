"""The bulk lane's wire half: a large tensor's bytes travel over a plain TCP connection, its
reference (``TensorMeta.bulk``) in the message.

Over TCP, gRPC costs a MiB-scale message about twice what it costs PyTorch's TensorPipe
(HTTP/2 framing, gRPC's own copies, the asyncio server's hops: docs/architecture.md, "Where a
call's time goes"). So a tensor of at least ``bulk_threshold_bytes`` for a peer on another host
(or any peer without shared memory) is written, while its message is encoded, straight from its
array onto one of this worker's connections to the peer's bulk lane, and the message carries
only its transfer id; the receiver's lane reads the bytes into a fresh array as they come, and
the :class:`~gradwire._wire.framing.Assembler` takes that array (:func:`receive`) instead of
copying bytes out of frames. The sender writes the bytes before the message goes, so the
receiver usually has them when the message is decoded.

The runtime (``gradwire._runtime.transport.bulk_lane``) owns the sockets: it installs the
sending side and the receiving side, an :class:`Inbox`, with :func:`install`. Without them every tensor streams in the frames, as before.

By value, as every other path: the bytes are written before ``pack`` returns, so later writes
to the sender's tensor do not travel, and the receiver's array is its own.

What a peer can make the receiver do is bounded (docs/security.md): one transfer is at most
``MAX_TRANSFER_BYTES`` and ``max_message_bytes``; bytes received and not taken yet are at most
the inbox's limit (a transfer past it is refused: its bytes are read and dropped); a transfer
nobody takes is dropped after ``stale_seconds``, one its sender cancelled at once; a take fails
at once when no connection from the sender is open and the transfer is not here, waits at most
``HEADER_WAIT_SECONDS`` for a transfer whose first bytes have not come, and at most
``STALL_SECONDS`` without progress for one that is coming.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .._proto import worker_pb2 as pb
from ..errors import SerializationError

__all__ = [
    "Send",
    "Inbox",
    "install",
    "uninstall",
    "cancel",
    "offer",
    "takes",
    "receive",
    "stats",
    "count",
    "MAX_TRANSFER_BYTES",
    "HEADER_WAIT_SECONDS",
    "STALL_SECONDS",
]

#: Largest tensor that takes the bulk lane (larger ones stream in frames, as before).
MAX_TRANSFER_BYTES = 2 << 30
#: How long a take waits for the first bytes of its transfer (the sender wrote them before the
#: message, so they are normally there already).
HEADER_WAIT_SECONDS = 20.0
#: How long a take (or the lane's reader) waits while a transfer makes no progress.
STALL_SECONDS = 30.0
#: How often a waiting take looks at its bounds (its sender's connections, the waits above).
_TICK = 0.25
#: Transfer ids already taken, remembered so that a message delivered twice fails at once.
_TAKEN_MEMORY = 4096

#: ``send(arr) -> transfer id``, or None when the bytes did not go (stream them instead).
Send = Callable[[np.ndarray], "int | None"]
#: ``route(peer_name, nbytes) -> send`` or None: the runtime's sending side.
Route = Callable[[str, int], "Send | None"]
#: ``cancel(peer_name, transfer ids)``: tell the peer its transfers will not be named.
Cancel = Callable[[str, list[int]], None]

_route: Route | None = None
_cancel: Cancel | None = None
_inbox: Inbox | None = None
_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()


def install(route: Route, cancel: Cancel, inbox: Inbox) -> None:
    """Install the running worker's sending side and its inbox."""
    global _route, _cancel, _inbox
    _route, _cancel, _inbox = route, cancel, inbox


def uninstall(inbox: Inbox) -> None:
    """Remove what :func:`install` put in place with ``inbox`` (every tensor streams again)."""
    global _route, _cancel, _inbox
    if _inbox is inbox:
        _route, _cancel, _inbox = None, None, None


def cancel(peer: str, metas: Iterable[pb.TensorMeta]) -> None:
    """The message carrying ``metas`` will not be sent (its encoding failed): tell ``peer`` to
    drop their transfers now rather than hold them until they are stale."""
    ids = [meta.bulk.transfer_id for meta in metas if meta.HasField("bulk")]
    send = _cancel
    if ids and send is not None and peer:
        send(peer, ids)


def count(what: str, nbytes: int = 0) -> None:
    """Add one to counter ``what`` (and ``nbytes`` to ``what``_bytes) of :func:`stats`."""
    with _counts_lock:
        _counts[what] += 1
        if nbytes:
            _counts[what + "_bytes"] += nbytes


def stats() -> dict[str, int]:
    """This process' counters: transfers and bytes sent, received, taken, ``fallback`` (the lane
    could not send: the bytes streamed), ``refused`` and ``failed``; calls answered on the
    lane (``calls``) and served there (``calls_served``), calls served on a lane pipe
    (``pipe_calls_served``); remote() answers left parked
    (``parked``), calls sent right behind one (``behind``), and parked answers handed to a
    reader thread (``handed_over``)."""
    with _counts_lock:
        return dict(_counts)


def takes(peer: str, nbytes: int) -> bool:
    """Whether a tensor of ``nbytes`` for ``peer`` would be offered to its bulk lane."""
    route = _route
    return (
        route is not None
        and bool(peer)
        and nbytes <= MAX_TRANSFER_BYTES
        and (route(peer, nbytes) is not None)
    )


def offer(peer: str, arr: np.ndarray) -> pb.BulkRef | None:
    """Send ``arr``'s bytes to ``peer``'s bulk lane if the route says so.

    Args:
        peer: destination worker name.
        arr: a C-contiguous host array (its bytes are written before this returns).

    Returns:
        The reference for ``TensorMeta.bulk``, or None to stream the bytes in the frames.
    """
    route = _route
    if route is None or not peer or arr.nbytes > MAX_TRANSFER_BYTES:
        return None
    send = route(peer, arr.nbytes)
    if send is None:
        return None
    transfer_id = send(arr)
    if transfer_id is None:
        count("fallback")
        return None
    count("sent", arr.nbytes)
    return pb.BulkRef(transfer_id=transfer_id)


def receive(meta: pb.TensorMeta, peer: str, dtype: np.dtype) -> np.ndarray:
    """The array of the transfer ``meta.bulk`` names, from ``peer`` (waits for its bytes).

    Args:
        meta: a TensorMeta whose dtype, shape and nbytes were already checked.
        peer: the sender's name (the transfer ids are the sender's).
        dtype: ``meta.dtype`` as a NumPy dtype.

    Raises:
        SerializationError: no bulk lane here, the transfer failed, was refused, was taken
            already, has another length, or did not come in time.
    """
    inbox = _inbox
    if inbox is None or not peer:
        raise SerializationError(
            "a message names a bulk-lane transfer but this worker has no bulk lane"
        )
    buf = inbox.take(peer, meta.bulk.transfer_id, meta.nbytes)
    return buf.view(dtype).reshape(tuple(meta.shape))


class _Entry:
    """One transfer: its buffer once its header came, and whether it ended (``done``: every
    byte came, or it failed, was refused or cancelled; set under the inbox's lock, which a
    waiting take sleeps on)."""

    __slots__ = ("buf", "done", "error", "arrived", "progress", "born", "cancelled")

    def __init__(self) -> None:
        self.buf: np.ndarray | None = None
        self.done = False
        self.error = ""
        self.arrived = False  # its header came (the reader owns it until done)
        self.progress = time.monotonic()  # last time bytes came
        self.born = self.progress
        self.cancelled = False  # its sender cancelled it while its bytes came: drop at the end


class Inbox:
    """The transfers a worker received and has not taken yet, keyed by (sender, transfer id).

    The lane's reader threads call :meth:`begin`, then :meth:`progress` as bytes come, then
    :meth:`complete` or :meth:`fail`; the Assembler calls :meth:`take` (through
    :func:`receive`), in either order.

    Args:
        limit_bytes: most bytes received and not taken yet.
        max_transfer_bytes: largest transfer accepted (``max_message_bytes``).
        stale_seconds: a transfer not taken after this long is dropped.
    """

    def __init__(self, limit_bytes: int, max_transfer_bytes: int, stale_seconds: float) -> None:
        self._limit = limit_bytes
        self._max = min(max_transfer_bytes, MAX_TRANSFER_BYTES)
        self._stale = stale_seconds
        self._lock = threading.Lock()
        #: Notified (under ``_lock``) when a transfer ends: the takes waiting for it wake.
        self._ended = threading.Condition(self._lock)
        self._entries: dict[tuple[str, int], _Entry] = {}
        self._taken: OrderedDict[tuple[str, int], None] = OrderedDict()
        #: Cancelled before their bytes came: dropped when they come.
        self._cancelled: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._held = 0  # bytes of arrived transfers not taken yet
        self._closed = False
        #: Authenticated connections open from each sender: a take for a sender with none
        #: and no transfer of that id fails at once (its bytes cannot be on their way).
        self._live: Counter[str] = Counter()

    # -- the reader's side ---------------------------------------------------------------------

    def connected(self, peer: str) -> None:
        """A connection from ``peer`` passed the handshake (before it is told so)."""
        with self._lock:
            self._live[peer] += 1

    def disconnected(self, peer: str) -> None:
        """A connection from ``peer`` ended (after its last transfer was read)."""
        with self._lock:
            self._live[peer] -= 1
            if self._live[peer] <= 0:
                del self._live[peer]

    def begin(self, peer: str, transfer_id: int, nbytes: int) -> np.ndarray | None:
        """A transfer's header came: the array to read its bytes into, or None when its bytes
        are to be read and dropped: refused (too large, over the limit, or a transfer id
        already used; a waiting take then fails at once with the reason) or cancelled."""
        key = (peer, transfer_id)
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            if key in self._cancelled:  # its sender gave up on it: read and drop
                del self._cancelled[key]
                return None
            entry = self._entries.get(key)
            reason = ""
            if self._closed:
                reason = "the worker is shutting down"
            elif nbytes < 0 or nbytes > self._max:
                reason = f"a transfer of {nbytes} bytes is over the {self._max}-byte limit"
            elif (entry is not None and entry.arrived) or key in self._taken:
                reason = f"transfer id {transfer_id} was used twice"
            elif self._held + nbytes > self._limit:
                reason = (
                    f"{self._held} bytes received and not taken yet, {nbytes} more would pass "
                    f"the bulk lane's {self._limit}-byte limit"
                )
            if entry is None:
                entry = self._entries[key] = _Entry()
            if reason:
                entry.arrived = True
                entry.error = f"the bulk lane refused a transfer from {peer!r}: {reason}"
                self._end(entry)
                count("refused")
                return None
            entry.arrived = True
            entry.progress = now
            self._held += nbytes
        try:
            buf = np.empty(nbytes, dtype=np.uint8)
        except MemoryError:
            with self._lock:  # counted above, and fail() only gives back an allocated buffer
                if self._entries.get(key) is entry:
                    self._held -= nbytes
            self.fail(peer, transfer_id, f"cannot allocate {nbytes} bytes")
            return None
        entry.buf = buf
        return buf

    def progress(self, peer: str, transfer_id: int) -> None:
        """Bytes of the transfer came (a take keeps waiting while they do)."""
        entry = self._entries.get((peer, transfer_id))
        if entry is not None:
            entry.progress = time.monotonic()

    def complete(self, peer: str, transfer_id: int) -> None:
        """Every byte of the transfer came."""
        key = (peer, transfer_id)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            nbytes = 0 if entry.buf is None else entry.buf.nbytes
            if entry.cancelled:
                del self._entries[key]
                self._release(entry)
            self._end(entry)
        count("received", nbytes)

    def cancel(self, peer: str, transfer_id: int) -> None:
        """The sender will never name the transfer: drop it (now, or when its bytes came)."""
        key = (peer, transfer_id)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                if key not in self._taken:
                    self._cancelled[key] = None
                    while len(self._cancelled) > _TAKEN_MEMORY:
                        self._cancelled.popitem(last=False)
                return
            count("cancelled")
            if not entry.arrived:  # a take waits for it: it will not come
                entry.arrived = True
                entry.error = f"the bulk-lane transfer {transfer_id} from {peer!r} was cancelled"
                self._end(entry)
                return
            if not entry.done:
                entry.cancelled = True  # its reader drops it when the bytes are in
                return
            del self._entries[key]
            self._release(entry)

    def fail(self, peer: str, transfer_id: int, why: str) -> None:
        """The transfer will not complete (its connection broke): a take fails with ``why``."""
        with self._lock:
            entry = self._entries.get((peer, transfer_id))
            if entry is None:
                return
            self._release(entry)
            entry.error = f"the bulk-lane transfer from {peer!r} failed: {why}"
            self._end(entry)
        count("failed")

    # -- the Assembler's side ------------------------------------------------------------------

    def take(self, peer: str, transfer_id: int, nbytes: int) -> np.ndarray:
        """The transfer's bytes, once (waits for them within the bounds of the module doc).

        Raises:
            SerializationError: see :func:`receive`.
        """
        key = (peer, transfer_id)
        with self._lock:
            if self._closed:
                raise SerializationError(
                    f"bulk-lane transfer {transfer_id} from {peer!r}: this worker is shutting down"
                )
            if key in self._taken:
                raise SerializationError(
                    f"bulk-lane transfer {transfer_id} from {peer!r} was taken already (a "
                    "message delivered twice)"
                )
            entry = self._entries.get(key)
            if entry is None:
                if not self._live[peer]:
                    raise SerializationError(
                        f"bulk-lane transfer {transfer_id} from {peer!r} is not here and no "
                        "bulk-lane connection from that worker is open: its bytes cannot come"
                    )
                entry = self._entries[key] = _Entry()
            # (Usually done already: the sender wrote the bytes before the message.)
            while not entry.done:
                self._ended.wait(_TICK)
                if entry.done:
                    break
                now = time.monotonic()
                if entry.arrived:
                    late = now - entry.progress > STALL_SECONDS
                else:  # not started: its sender's connections ended without it, or too long
                    late = not self._live[peer] or now - entry.born > HEADER_WAIT_SECONDS
                if late or self._closed:
                    if self._entries.get(key) is entry and not entry.arrived:
                        del self._entries[key]
                    what = "stalled" if entry.arrived else "never came"
                    raise SerializationError(
                        f"bulk-lane transfer {transfer_id} from {peer!r} {what}: its sender may "
                        "have failed, or the network between the workers dropped it"
                    )
            if self._entries.get(key) is entry:
                del self._entries[key]
            buf = self._release(entry)
            self._remember(key)
        if entry.error or buf is None:
            raise SerializationError(entry.error or "bulk-lane transfer without data")
        if buf.nbytes != nbytes:
            raise SerializationError(
                f"bulk-lane transfer {transfer_id} from {peer!r} carries {buf.nbytes} bytes, "
                f"its message announced {nbytes}"
            )
        count("taken", nbytes)
        return buf

    # -- upkeep --------------------------------------------------------------------------------

    def _remember(self, key: tuple[str, int]) -> None:
        self._taken[key] = None
        while len(self._taken) > _TAKEN_MEMORY:
            self._taken.popitem(last=False)

    def _end(self, entry: _Entry) -> None:
        # With the lock held: the transfer ended; wake the takes.
        entry.done = True
        self._ended.notify_all()

    def _release(self, entry: _Entry) -> np.ndarray | None:
        # With the lock held: the entry's buffer, no longer counted as held nor kept by it.
        buf, entry.buf = entry.buf, None
        if buf is not None:
            self._held -= buf.nbytes
        return buf

    def _sweep(self, now: float) -> None:
        # With the lock held: drop what nobody took in time (its message never came).
        for key in [k for k, e in self._entries.items() if e.done and now - e.born > self._stale]:
            self._release(self._entries.pop(key))
            count("dropped_stale")

    def close(self) -> None:
        """Refuse what comes next, free what was not taken, and wake every take."""
        with self._lock:
            self._closed = True
            entries, self._entries = list(self._entries.values()), {}
            self._held = 0
            for entry in entries:
                entry.buf = None
                entry.error = entry.error or "the worker shut down before the transfer was taken"
                self._end(entry)

    def info(self) -> dict[str, Any]:
        """Transfers waiting and bytes held (for ``Agent.debug_info``)."""
        with self._lock:
            return {"waiting": len(self._entries), "held_bytes": self._held, "limit": self._limit}
