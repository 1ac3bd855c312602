"""gradwire.futures without any networking."""

from __future__ import annotations

import pickle
import threading
import time

import pytest
from gradwire.errors import FuturePicklingError, InvalidFutureStateError
from gradwire.futures import Future, collect_all, wait_all


def _later(fut: Future[int], value: int | BaseException, delay: float) -> None:
    def run() -> None:
        time.sleep(delay)
        if isinstance(value, BaseException):
            fut.set_exception(value)
        else:
            fut.set_result(value)

    threading.Thread(target=run, daemon=True).start()


def test_result_wait_value_done() -> None:
    fut: Future[int] = Future()
    assert not fut.done()
    with pytest.raises(InvalidFutureStateError, match="before the future completed"):
        fut.value()
    _later(fut, 5, 0.01)
    assert fut.wait() == 5
    assert fut.done() and fut.value() == 5 and fut.exception() is None


def test_exception_is_raised_by_wait_and_value() -> None:
    fut: Future[int] = Future()
    fut.set_exception(ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        fut.wait()
    with pytest.raises(ValueError, match="bad"):
        fut.value()
    with pytest.raises(TypeError, match="exception instance"):
        Future().set_exception("not an exception")  # type: ignore[arg-type]


def test_completing_twice_is_an_error() -> None:
    fut: Future[int] = Future()
    fut.set_result(1)
    with pytest.raises(InvalidFutureStateError, match="already completed"):
        fut.set_result(2)
    with pytest.raises(InvalidFutureStateError):
        fut.set_exception(RuntimeError())
    assert fut.value() == 1


def test_wait_timeout() -> None:
    with pytest.raises(TimeoutError):
        Future().wait(0.01)


def test_many_waiting_threads_all_wake_and_a_timed_out_one_leaves_no_trace() -> None:
    fut: Future[int] = Future()
    with pytest.raises(TimeoutError):
        fut.wait(0.01)
    assert fut._waiters == []  # the timed-out waiter took itself off
    got: list[int] = []
    lock = threading.Lock()

    def waiter() -> None:
        value = fut.wait(5.0)
        with lock:
            got.append(value)

    threads = [threading.Thread(target=waiter) for _ in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5.0
    while len(fut._waiters) < 6 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(fut._waiters) == 6  # all six are parked, none spins
    fut.set_result(7)
    for t in threads:
        t.join(5.0)
    assert got == [7] * 6 and fut._waiters == []
    assert fut.wait(0) == 7  # a completed future answers at once, even with no time left


def test_then_chains_values_and_errors() -> None:
    fut: Future[int] = Future()
    doubled = fut.then(lambda f: f.value() * 2)
    failed = fut.then(lambda f: 1 // 0)
    fut.set_result(21)
    assert doubled.wait() == 42
    with pytest.raises(ZeroDivisionError):
        failed.wait()
    err: Future[int] = Future()
    passed_on = err.then(lambda f: f.value())
    err.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        passed_on.wait()


def test_callbacks_run_once_in_order_and_a_failing_one_is_isolated() -> None:
    seen: list[str] = []
    fut: Future[int] = Future()
    fut.add_done_callback(lambda f: seen.append("a"))
    fut.add_done_callback(lambda f: 1 // 0)
    fut.add_done_callback(lambda f: seen.append("b"))
    fut.set_result(1)
    fut.add_done_callback(lambda f: seen.append("late"))  # already done: runs at once
    assert seen == ["a", "b", "late"]


def test_pickling_a_future_is_a_clear_error() -> None:
    with pytest.raises(FuturePicklingError, match="cannot be pickled"):
        pickle.dumps(Future())


def test_collect_all_completes_with_the_futures_or_fails_with_the_first_error() -> None:
    a: Future[int] = Future()
    b: Future[int] = Future()
    both = collect_all([a, b])
    a.set_result(1)
    assert not both.done()
    b.set_result(2)
    assert both.wait() == [a, b] and [f.value() for f in both.wait()] == [1, 2]
    # PyTorch semantics: the first failure fails the combined future at once
    c: Future[int] = Future()
    d: Future[int] = Future()
    e: Future[int] = Future()
    failed = collect_all([c, d, e])
    d.set_exception(ValueError("d broke"))
    assert failed.done()
    with pytest.raises(ValueError, match="d broke"):
        failed.wait()
    c.set_exception(KeyError("later"))  # a later failure changes nothing
    e.set_result(3)
    assert isinstance(failed.exception(), ValueError)
    assert collect_all([]).wait() == []


def test_wait_all_returns_values_in_order() -> None:
    futs: list[Future[int]] = [Future() for _ in range(3)]
    for i, f in enumerate(futs):
        _later(f, i, 0.01 * (3 - i))
    assert wait_all(futs) == [0, 1, 2]


def test_wait_all_raises_first_error_without_waiting_for_slow_ones() -> None:
    slow: Future[int] = Future()
    bad: Future[int] = Future()
    _later(slow, 1, 5.0)
    _later(bad, RuntimeError("first"), 0.01)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="first"):
        wait_all([slow, bad])
    assert time.monotonic() - started < 1.0
