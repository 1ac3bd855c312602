"""The bulk lane's inbox (gradwire._wire.bulk.Inbox) in one process, no sockets: a transfer is
taken once, in either order with its arrival; refusals, failures, shutdown and a transfer that
never came wake a waiting take with the reason; bytes held are given back on every path. Last,
``pack`` and the Assembler through an installed lane whose sender writes into an inbox."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
from gradwire._proto import worker_pb2 as pb
from gradwire._wire import bulk, tensors
from gradwire._wire.framing import Assembler, split
from gradwire.errors import SerializationError

PEER = "sender"
#: Long enough that no test here meets it: a stale drop is asked for explicitly.
NEVER_STALE = 600.0


def _inbox(
    limit: int = 1 << 20, max_transfer: int = 1 << 20, stale: float = NEVER_STALE
) -> bulk.Inbox:
    """An inbox with one connection open from PEER (as after its handshake)."""
    inbox = bulk.Inbox(limit, max_transfer, stale)
    inbox.connected(PEER)
    return inbox


def _deliver(inbox: bulk.Inbox, transfer_id: int, data: bytes, peer: str = PEER) -> None:
    """What the lane's reader does with one transfer that arrives whole."""
    buf = inbox.begin(peer, transfer_id, len(data))
    assert buf is not None, "the inbox refused a transfer it should take"
    buf[:] = np.frombuffer(data, dtype=np.uint8)
    inbox.progress(peer, transfer_id)
    inbox.complete(peer, transfer_id)


def _held(inbox: bulk.Inbox) -> int:
    return int(inbox.info()["held_bytes"])


def _counted(what: str) -> int:
    return bulk.stats().get(what, 0)


@pytest.fixture
def takes() -> Iterator[ThreadPoolExecutor]:
    """Threads for takes that wait (each test's takes end before it does)."""
    with ThreadPoolExecutor(4) as pool:
        yield pool


def _waiting_take(
    pool: ThreadPoolExecutor, inbox: bulk.Inbox, transfer_id: int, nbytes: int
) -> Future[np.ndarray]:
    """A take started in another thread, returned once it waits in the inbox."""
    before = inbox.info()["waiting"]
    fut = pool.submit(inbox.take, PEER, transfer_id, nbytes)
    deadline = time.monotonic() + 5
    while inbox.info()["waiting"] == before and not fut.done():
        assert time.monotonic() < deadline, "the take never registered in the inbox"
        time.sleep(0.005)
    assert not fut.done(), fut.exception()
    return fut


def test_a_take_before_the_transfer_and_one_after_both_get_its_bytes(
    takes: ThreadPoolExecutor,
) -> None:
    inbox = _inbox()
    early = _waiting_take(takes, inbox, 1, 5)
    _deliver(inbox, 1, b"early")
    assert bytes(early.result(timeout=5)) == b"early"

    _deliver(inbox, 2, b"late!")
    assert _held(inbox) == 5
    got = inbox.take(PEER, 2, 5)
    assert bytes(got) == b"late!" and got.dtype == np.uint8 and got.flags.writeable
    assert _held(inbox) == 0
    assert inbox.info()["waiting"] == 0


def test_the_same_id_from_another_sender_is_another_transfer() -> None:
    inbox = _inbox()
    _deliver(inbox, 7, b"from a", peer="a")
    _deliver(inbox, 7, b"from b", peer="b")
    assert bytes(inbox.take("b", 7, 6)) == b"from b"
    assert bytes(inbox.take("a", 7, 6)) == b"from a"


def test_a_second_take_of_the_same_transfer_fails_at_once() -> None:
    inbox = _inbox()
    _deliver(inbox, 3, b"once")
    inbox.take(PEER, 3, 4)
    started = time.monotonic()
    with pytest.raises(SerializationError, match="taken already"):
        inbox.take(PEER, 3, 4)
    assert time.monotonic() - started < 0.5
    assert inbox.info()["waiting"] == 0


def test_a_transfer_id_used_twice_is_refused() -> None:
    inbox = _inbox()
    _deliver(inbox, 4, b"first")
    assert bytes(inbox.take(PEER, 4, 5)) == b"first"
    assert inbox.begin(PEER, 4, 5) is None  # taken already
    # Arrived and not taken yet: which bytes the message meant cannot be told, so neither go.
    _deliver(inbox, 5, b"first")
    assert inbox.begin(PEER, 5, 5) is None
    with pytest.raises(SerializationError, match="transfer id 5 was used twice"):
        inbox.take(PEER, 5, 5)
    assert _held(inbox) == 0


@pytest.mark.parametrize(
    ("first", "second", "reason"),
    [
        (0, 1001, "over the 1000-byte limit"),  # one transfer past max_transfer_bytes
        (900, 900, "would pass the bulk lane's 1500-byte limit"),  # held bytes past the limit
    ],
    ids=["over_max_transfer", "over_inbox_limit"],
)
def test_a_refused_transfer_fails_its_waiting_take_at_once_with_the_reason(
    takes: ThreadPoolExecutor, first: int, second: int, reason: str
) -> None:
    inbox = _inbox(limit=1500, max_transfer=1000)
    if first:
        _deliver(inbox, 1, bytes(first))
    refused_before = _counted("refused")
    waiting = _waiting_take(takes, inbox, 2, second)
    assert inbox.begin(PEER, 2, second) is None
    with pytest.raises(SerializationError, match=reason) as info:
        waiting.result(timeout=0.9)  # before the take's own 1 s poll: woken by the refusal
    assert "refused a transfer from 'sender'" in str(info.value)
    assert _counted("refused") == refused_before + 1
    assert _held(inbox) == first  # nothing was allocated for the refused one
    if first:
        assert len(inbox.take(PEER, 1, first)) == first
    assert _held(inbox) == 0


def test_a_failed_transfer_makes_its_take_raise(takes: ThreadPoolExecutor) -> None:
    inbox = _inbox()
    waiting = _waiting_take(takes, inbox, 5, 100)
    buf = inbox.begin(PEER, 5, 100)
    assert buf is not None and _held(inbox) == 100
    buf[:40] = 1
    inbox.progress(PEER, 5)
    inbox.fail(PEER, 5, "connection closed after 40 of 100 bytes")
    with pytest.raises(SerializationError, match="failed: connection closed after 40 of 100"):
        waiting.result(timeout=0.9)
    assert _held(inbox) == 0

    # Failed before its take came: the take raises as well.
    assert inbox.begin(PEER, 6, 10) is not None
    inbox.fail(PEER, 6, "reset by peer")
    with pytest.raises(SerializationError, match="reset by peer"):
        inbox.take(PEER, 6, 10)
    assert _held(inbox) == 0


def test_a_transfer_of_another_length_than_its_message_announced_raises() -> None:
    inbox = _inbox()
    _deliver(inbox, 8, b"ten bytes!")
    with pytest.raises(SerializationError, match="carries 10 bytes, its message announced 12"):
        inbox.take(PEER, 8, 12)
    assert _held(inbox) == 0


def test_close_wakes_every_waiting_take_and_refuses_what_comes_next(
    takes: ThreadPoolExecutor,
) -> None:
    inbox = _inbox()
    not_started = _waiting_take(takes, inbox, 1, 8)
    coming = _waiting_take(takes, inbox, 2, 8)
    assert inbox.begin(PEER, 2, 8) is not None  # its bytes are coming
    _deliver(inbox, 3, b"untaken!")
    assert _held(inbox) == 16
    inbox.close()
    for fut in (not_started, coming):
        with pytest.raises(SerializationError, match="shut down before the transfer was taken"):
            fut.result(timeout=0.9)
    assert inbox.info() == {"waiting": 0, "held_bytes": 0, "limit": 1 << 20}
    assert inbox.begin(PEER, 4, 8) is None  # refused: shutting down
    assert _held(inbox) == 0
    with pytest.raises(SerializationError, match="bulk-lane transfer 3"):
        inbox.take(PEER, 3, 8)  # its bytes were freed: it cannot be taken any more


def test_a_cancelled_transfer_is_dropped_whether_its_bytes_came_before_during_or_after() -> None:
    inbox = _inbox()
    _deliver(inbox, 1, b"x" * 1000)  # before: dropped at once
    inbox.cancel(PEER, 1)
    assert _held(inbox) == 0 and inbox.info()["waiting"] == 0

    buf = inbox.begin(PEER, 2, 1000)  # during: dropped when its bytes are in
    assert buf is not None
    inbox.cancel(PEER, 2)
    assert _held(inbox) == 1000
    inbox.complete(PEER, 2)
    assert _held(inbox) == 0 and inbox.info()["waiting"] == 0

    inbox.cancel(PEER, 3)  # after: its bytes are read and dropped, never held
    assert inbox.begin(PEER, 3, 1000) is None
    assert _held(inbox) == 0 and inbox.info()["waiting"] == 0
    _deliver(inbox, 4, b"y" * 10)  # the next transfer is taken as usual
    assert bytes(inbox.take(PEER, 4, 10)) == b"y" * 10


def test_a_cancel_wakes_a_take_that_waits_for_it(takes: ThreadPoolExecutor) -> None:
    inbox = _inbox()
    fut = _waiting_take(takes, inbox, 5, 100)
    inbox.cancel(PEER, 5)
    with pytest.raises(SerializationError, match="cancelled"):
        fut.result(5)


def test_a_take_after_close_fails_at_once() -> None:
    inbox = _inbox()
    inbox.close()
    started = time.monotonic()
    with pytest.raises(SerializationError, match="shutting down"):
        inbox.take(PEER, 1, 10)
    assert time.monotonic() - started < 0.5


def test_a_take_from_a_sender_without_a_connection_fails_at_once() -> None:
    inbox = _inbox()
    started = time.monotonic()
    with pytest.raises(SerializationError, match="no bulk-lane connection"):
        inbox.take("stranger", 1, 10)
    assert time.monotonic() - started < 0.5
    _deliver(inbox, 2, b"a" * 10)  # what came before its connection ended is still taken
    inbox.disconnected(PEER)
    assert bytes(inbox.take(PEER, 2, 10)) == b"a" * 10


def test_a_waiting_take_fails_when_its_senders_last_connection_ends(
    takes: ThreadPoolExecutor,
) -> None:
    inbox = _inbox()
    fut = _waiting_take(takes, inbox, 3, 10)
    inbox.disconnected(PEER)
    started = time.monotonic()
    with pytest.raises(SerializationError, match="never came"):
        fut.result(5)
    assert time.monotonic() - started < 2.5  # one tick, not the header wait


def test_a_transfer_that_never_came_fails_its_take_within_the_header_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bulk, "HEADER_WAIT_SECONDS", 0.2)
    inbox = _inbox()
    started = time.monotonic()
    with pytest.raises(SerializationError, match="transfer 9 from 'sender' never came"):
        inbox.take(PEER, 9, 100)
    assert 0.2 <= time.monotonic() - started < 2.5  # the take looks at its bounds every 0.25 s
    assert inbox.info()["waiting"] == 0  # its entry went with it


def test_a_transfer_making_no_progress_fails_its_take_as_stalled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bulk, "STALL_SECONDS", 0.2)
    inbox = _inbox()
    assert inbox.begin(PEER, 10, 100) is not None
    with pytest.raises(SerializationError, match="transfer 10 from 'sender' stalled"):
        inbox.take(PEER, 10, 100)


def test_transfers_nobody_took_are_dropped_once_stale() -> None:
    inbox = _inbox(stale=0.05)
    dropped_before = _counted("dropped_stale")
    _deliver(inbox, 1, bytes(300))
    refused = inbox.begin(PEER, 2, 1 << 30)  # a refusal leaves an entry too
    assert refused is None
    assert inbox.info()["waiting"] == 2 and _held(inbox) == 300
    time.sleep(0.1)  # let both age past stale_seconds (the sweep runs at the next begin)
    _deliver(inbox, 3, bytes(50))
    assert inbox.info() == {"waiting": 1, "held_bytes": 50, "limit": 1 << 20}
    assert _counted("dropped_stale") == dropped_before + 2
    assert len(inbox.take(PEER, 3, 50)) == 50
    assert _held(inbox) == 0


def test_a_transfer_being_read_is_not_dropped_as_stale() -> None:
    inbox = _inbox(stale=0.05)
    buf = inbox.begin(PEER, 1, 4)
    assert buf is not None
    time.sleep(0.1)
    _deliver(inbox, 2, b"next")  # sweeps: the unfinished transfer stays
    buf[:] = np.frombuffer(b"slow", dtype=np.uint8)
    inbox.complete(PEER, 1)
    assert bytes(inbox.take(PEER, 1, 4)) == b"slow"
    assert bytes(inbox.take(PEER, 2, 4)) == b"next"
    assert _held(inbox) == 0


def test_held_bytes_follow_every_path_back_to_zero() -> None:
    inbox = _inbox(limit=1000, max_transfer=1000)
    _deliver(inbox, 1, bytes(400))
    _deliver(inbox, 2, bytes(400))
    assert _held(inbox) == 800
    assert inbox.begin(PEER, 3, 400) is None  # past the limit: refused, nothing held
    inbox.take(PEER, 1, 400)
    assert _held(inbox) == 400
    assert inbox.begin(PEER, 4, 600) is not None  # fits again
    assert _held(inbox) == 1000
    inbox.fail(PEER, 4, "cut")
    with pytest.raises(SerializationError, match="announced 399"):
        inbox.take(PEER, 2, 399)
    with pytest.raises(SerializationError, match="refused"):
        inbox.take(PEER, 3, 400)
    assert _held(inbox) == 0
    _deliver(inbox, 6, bytes(1000))  # the whole limit is free again
    assert _held(inbox) == 1000
    inbox.close()
    assert _held(inbox) == 0


def test_a_transfer_that_cannot_be_allocated_gives_its_bytes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An allocation failure must not keep its size counted against the inbox's limit."""
    real_empty = np.empty

    def no_memory_for_999(shape: object, *args: object, **kwargs: object) -> np.ndarray:
        if shape == 999:
            raise MemoryError
        return real_empty(shape, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(bulk.np, "empty", no_memory_for_999)
    inbox = _inbox(limit=1000, max_transfer=1000)
    assert inbox.begin(PEER, 1, 999) is None
    with pytest.raises(SerializationError, match="cannot allocate 999 bytes"):
        inbox.take(PEER, 1, 999)
    assert _held(inbox) == 0
    _deliver(inbox, 2, bytes(1000))  # the limit is whole again
    assert _held(inbox) == 1000


# -- pack and the Assembler through an installed lane ------------------------------------------


@pytest.fixture
def lane() -> Iterator[tuple[bulk.Inbox, list[int]]]:
    """A lane installed in this process whose sender delivers into an inbox at once: the
    inbox, and the sizes of the transfers the route sent (the route says 1 KiB and more)."""
    inbox = _inbox()
    sent: list[int] = []
    ids = iter(range(100, 200))

    def route(peer: str, nbytes: int) -> bulk.Send | None:
        if nbytes < 1024:
            return None

        def send(arr: np.ndarray) -> int:
            transfer_id = next(ids)
            _deliver(inbox, transfer_id, arr.tobytes(), peer=peer)
            sent.append(arr.nbytes)
            return transfer_id

        return send

    def cancel(peer: str, transfer_ids: list[int]) -> None:
        for transfer_id in transfer_ids:
            inbox.cancel(peer, transfer_id)

    bulk.install(route, cancel, inbox)
    try:
        yield inbox, sent
    finally:
        bulk.uninstall(inbox)


def _through_frames(
    arrays: list[np.ndarray], peer: str = PEER, receiver: str = PEER
) -> tuple[list[pb.TensorMeta], list[np.ndarray]]:
    """Pack ``arrays`` for ``peer``, frame them, and assemble what ``receiver`` would decode."""
    packed = [tensors.pack(a, tensors.KIND_NDARRAY, peer) for a in arrays]
    metas = [p[0] for p in packed if p is not None]
    payload = pb.Payload(pickle_nbytes=0, tensors=metas)
    first = pb.FrameHeader(call=pb.CallHeader(message_id=1, function="m:f"), payload=payload)
    asm = Assembler(1 << 30, receiver)
    for frame in split(first, [b"", *(p[1] for p in packed if p is not None)], 1 << 16):
        asm.feed(frame)
    assert asm.message is not None
    return metas, asm.message.arrays


def test_pack_sends_large_arrays_over_the_lane_and_the_assembler_takes_them(
    lane: tuple[bulk.Inbox, list[int]],
) -> None:
    inbox, sent = lane
    sent_before = _counted("sent")
    big = np.arange(4096, dtype=np.float64).reshape(64, 64)
    strided = np.arange(8192, dtype=np.int32).reshape(64, 128)[:, ::2]  # travels as a copy
    small = np.arange(10, dtype=np.float32)
    metas, arrays = _through_frames([big, strided, small])
    assert [m.HasField("bulk") for m in metas] == [True, True, False]
    assert sent == [big.nbytes, strided.nbytes]
    assert _counted("sent") == sent_before + 2
    for got, want in zip(arrays, [big, strided, small], strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert _held(inbox) == 0


def test_a_self_call_or_an_unnamed_peer_keeps_its_bytes_in_the_frames(
    lane: tuple[bulk.Inbox, list[int]],
) -> None:
    _, sent = lane
    metas, arrays = _through_frames([np.ones(1024)], peer="")
    assert not metas[0].HasField("bulk") and sent == []
    np.testing.assert_array_equal(arrays[0], np.ones(1024))


def test_a_bulk_reference_without_a_lane_here_is_a_clear_error() -> None:
    meta = pb.TensorMeta(dtype="float64", shape=[4], nbytes=32, bulk=pb.BulkRef(transfer_id=1))
    with pytest.raises(SerializationError, match="this worker has no bulk lane"):
        bulk.receive(meta, PEER, np.dtype(np.float64))
