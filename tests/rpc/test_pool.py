"""The serving pool: bounded runnable threads, slots released while a thread blocks."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from typing import Any

import pytest
from gradwire._runtime.calls.pool import ServingPool
from gradwire.futures import Future


def test_runs_at_most_n_at_once() -> None:
    pool = ServingPool(2)
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def work() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1

    futs = [pool.submit(work) for _ in range(10)]
    for f in futs:
        f.result(5)
    assert peak[0] == 2
    pool.close()


def test_a_blocked_handler_gives_its_slot_to_queued_work() -> None:
    pool = ServingPool(1)
    gate: Future[str] = Future()
    # The only slot is taken by a task that waits for a second task to open the gate.
    waiting = pool.submit(gate.wait)
    opener = pool.submit(lambda: gate.set_result("open"))
    assert waiting.result(5) == "open"
    opener.result(5)
    pool.close()


def test_nested_waits_many_levels_deep() -> None:
    pool = ServingPool(1)

    def level(n: int) -> int:
        if n == 0:
            return 0
        inner = pool.submit(level, n - 1)
        f: Future[int] = Future()
        inner.add_done_callback(lambda c: f.set_result(c.result()))
        return f.wait() + 1

    assert pool.submit(level, 30).result(10) == 30
    pool.close()


def test_closed_pool_refuses_work() -> None:
    pool = ServingPool(1)
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(print)


def test_exceptions_reach_the_future() -> None:
    pool = ServingPool(1)
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 // 0).result(5)
    pool.close()


def test_many_concurrent_nested_waits_complete() -> None:
    pool = ServingPool(2)
    running = [0]
    peak = [0]
    lock = threading.Lock()

    def leaf(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.001)
        with lock:
            running[0] -= 1
        return i

    def parent(i: int) -> int:
        inner = [pool.submit(leaf, i * 10 + k) for k in range(3)]
        gathered: list[Future[int]] = []
        for c in inner:
            f: Future[int] = Future()
            c.add_done_callback(lambda c, f=f: f.set_result(c.result()))
            gathered.append(f)
        return sum(f.wait() for f in gathered)

    futs = [pool.submit(parent, i) for i in range(200)]
    assert [f.result(30) for f in futs] == [30 * i + 3 for i in range(200)]
    assert peak[0] <= 2  # never more runnable leaves than slots
    pool.close()


def test_a_thread_back_from_a_wait_runs_before_queued_work() -> None:
    pool = ServingPool(1)
    gate: Future[None] = Future()
    order: list[str] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        gate.wait()  # gives the only slot back
        order.append("waiter resumed")

    def opener() -> None:
        gate.set_result(None)  # the waiter now wants its slot back...
        time.sleep(0.05)  # ...while this task still holds it and another is queued
        order.append("opener")

    first = pool.submit(waiter)
    assert started.wait(5)
    second = pool.submit(opener)
    third = pool.submit(lambda: order.append("queued"))
    for f in (first, second, third):
        f.result(5)
    assert order == ["opener", "waiter resumed", "queued"]
    pool.close()


def test_close_lets_idle_threads_exit() -> None:
    pool = ServingPool(3, name="close-test")
    futs = [pool.submit(time.sleep, 0.01) for _ in range(3)]
    for f in futs:
        f.result(5)
    assert pool.num_threads >= 1
    names = {t.name for t in threading.enumerate() if t.name.startswith("close-test-")}
    pool.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        t.name in names and t.is_alive() for t in threading.enumerate()
    ):
        time.sleep(0.01)
    assert not [t for t in threading.enumerate() if t.name in names and t.is_alive()]
    assert pool.num_threads == 0


def test_parked_threads_keep_no_reference_to_finished_tasks() -> None:
    class Arg:
        pass

    pool = ServingPool(2, name="ref-test")
    refs = []
    for _ in range(6):  # first tasks of new threads and tasks handed to parked ones
        arg = Arg()
        refs.append(weakref.ref(arg))
        pool.submit(lambda a: None, arg).result(5)
        del arg
    time.sleep(0.05)  # let the threads park
    gc.collect()
    assert [r() for r in refs] == [None] * 6
    pool.close()


def test_knows_its_own_threads() -> None:
    pool, other = ServingPool(2), ServingPool(1)
    try:
        assert not pool.on_pool_thread()  # the test's thread
        assert pool.submit(pool.on_pool_thread).result(5) is True
        assert other.submit(pool.on_pool_thread).result(5) is False
    finally:
        pool.close()
        other.close()


def test_an_adopted_thread_serves_under_the_pool_slots() -> None:
    """The bulk lane's reader serves calls on its own thread: adopted, it takes a slot for a
    call (queued work waits for it), and gives it back while it blocks inside."""
    pool = ServingPool(1)
    ran: list[str] = []
    in_slot = threading.Event()
    release = threading.Event()
    gate: Future[None] = Future()

    def lane_thread() -> None:
        pool.adopt()
        pool.adopt()  # idempotent
        assert pool.on_pool_thread()
        with pool.slot():
            in_slot.set()
            release.wait(5)
            ran.append("lane, first part")
            gate.wait(5)  # a blocking wait: the slot goes to queued work meanwhile
            ran.append("lane, after the wait")

    t = threading.Thread(target=lane_thread)
    t.start()
    assert in_slot.wait(5)
    queued = pool.submit(lambda: ran.append("queued"))
    time.sleep(0.1)
    assert ran == []  # the only slot is the lane thread's
    release.set()
    queued.result(5)  # ran while the lane thread waited in gate.wait
    assert ran == ["lane, first part", "queued"]
    gate.set_result(None)
    t.join(5)
    assert ran[-1] == "lane, after the wait"
    assert pool.submit(lambda: "free again").result(5) == "free again"  # the slot came back
    pool.close()


def test_run_serves_work_no_one_waits_for_and_logs_what_it_raises(caplog: Any) -> None:
    pool = ServingPool(1)  # one thread: the failing task is over before the next runs
    done = threading.Event()
    results: list[int] = []

    def boom() -> None:
        raise ValueError("boom in the pool")

    with caplog.at_level(logging.ERROR, logger="gradwire._runtime.calls.pool"):
        assert pool.run(boom) is None
        pool.run(lambda: (results.append(7), done.set()))
        assert done.wait(5), "the pool stopped serving after a task raised"
    assert results == [7]
    assert any(r.exc_info and "boom in the pool" in str(r.exc_info[1]) for r in caplog.records)
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(print)


def test_settle_completes_a_future_once_and_says_whether_it_did() -> None:
    fut: Future[int] = Future()
    ran: list[int] = []
    fut.add_done_callback(lambda f: ran.append(f.value()))
    assert fut._settle(True, 5)
    assert fut.wait(1) == 5 and ran == [5]
    assert not fut._settle(False, ValueError("late"))  # done already: nothing changes
    assert fut.wait(1) == 5 and ran == [5]
