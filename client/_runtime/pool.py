"""The serving pool: at most N threads *running* user code, any number parked in waits.

A thread of the pool that blocks in ``Future.wait`` (or a blocking RPC) gives its slot back for
the duration (``blocking``); the pool then starts another thread if work is queued. So a handler
waiting on a nested call never holds a serving slot, and chains like A->B->C->A cannot deadlock
however small ``num_worker_threads`` is, while CPU-bound handlers still run at most N at a time.
Idle threads block on a condition variable (no polling); extra threads exit after a while.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future as ConcurrentFuture
from typing import Any

from .. import futures as _futures

__all__ = ["ServingPool"]

log = logging.getLogger(__name__)
_IDLE_EXIT_SECONDS = 30.0


class ServingPool:
    """Runs callables with at most ``num_threads`` of them runnable at once.

    Args:
        num_threads: number of slots (``num_worker_threads``).
        name: thread name prefix.
    """

    def __init__(self, num_threads: int, name: str = "gradwire-serve") -> None:
        if num_threads < 1:
            raise ValueError(f"num_worker_threads must be at least 1, got {num_threads}")
        self._limit = num_threads
        self._name = name
        self._lock = threading.Lock()
        # Idle workers wait on _work, threads back from a blocking wait on _resume; each freed
        # slot wakes exactly one thread (no thundering herd), resuming threads first.
        self._work = threading.Condition(self._lock)
        self._resume = threading.Condition(self._lock)
        self._queue: collections.deque[tuple[Callable[[], Any], ConcurrentFuture[Any]]] = (
            collections.deque()
        )
        self._running = 0  # threads holding a slot
        self._idle = 0  # workers waiting for work
        self._woken = 0  # idle workers notified but not yet running
        self._starting = 0  # threads started but not yet looking for work
        self._resuming = 0  # threads back from a blocking wait, waiting for a slot
        self._threads = 0
        self._closed = False
        self._counter = 0
        self._local = threading.local()

    @property
    def num_threads(self) -> int:
        return self._threads

    def submit(self, fn: Callable[..., Any], *args: Any) -> ConcurrentFuture[Any]:
        """Queue ``fn(*args)``; return a concurrent.futures.Future of its result.

        Raises:
            RuntimeError: the pool is closed.
        """
        fut: ConcurrentFuture[Any] = ConcurrentFuture()
        with self._lock:
            if self._closed:
                raise RuntimeError("serving pool is closed")
            self._queue.append(((lambda: fn(*args)), fut))
            self._dispatch()
        return fut

    def _free_slots(self) -> int:
        return self._limit - self._running

    def _dispatch(self) -> None:
        # With the lock held, whenever work arrived or a slot may have become free.
        if self._free_slots() <= 0:
            return
        if self._resuming:
            self._resume.notify()
            return
        on_the_way = self._woken + self._starting  # workers about to take a task and a slot
        if len(self._queue) <= on_the_way or self._free_slots() <= on_the_way:
            return
        if self._idle - self._woken > 0:
            self._woken += 1
            self._work.notify()
        else:
            self._starting += 1
            self._threads += 1
            self._counter += 1
            threading.Thread(
                target=self._loop, name=f"{self._name}-{self._counter}", daemon=True
            ).start()

    def _take(self) -> tuple[Callable[[], Any], ConcurrentFuture[Any]] | None:
        # With the lock held: wait for a task and a slot; None when this thread should exit.
        self._idle += 1
        try:
            while not self._closed and not (
                self._queue and self._free_slots() > 0 and not self._resuming
            ):
                extra = self._threads > self._limit
                notified = self._work.wait(_IDLE_EXIT_SECONDS if extra else None)
                if notified and self._woken:
                    self._woken -= 1
                if not notified and extra:
                    break
            if self._closed or not self._queue or self._free_slots() <= 0 or self._resuming:
                self._threads -= 1
                return None
            self._running += 1
            return self._queue.popleft()
        finally:
            self._idle -= 1

    def _loop(self) -> None:
        _futures.set_blocking_hook(self.blocking)
        with self._lock:
            self._starting -= 1
        while True:
            with self._lock:
                item = self._take()
            if item is None:
                return
            task, fut = item
            try:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(task())
                    except BaseException as exc:  # noqa: BLE001 - delivered to the future
                        fut.set_exception(exc)
            finally:
                with self._lock:
                    self._running -= 1
                    self._dispatch()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Give the calling thread's slot back while it blocks; take one again afterwards."""
        if getattr(self._local, "released", False):  # nested blocking region: already released
            yield
            return
        self._local.released = True
        with self._lock:
            self._running -= 1
            self._dispatch()
        try:
            yield
        finally:
            with self._lock:
                self._resuming += 1
                while self._free_slots() <= 0 and not self._closed:
                    self._resume.wait()
                self._resuming -= 1
                self._running += 1
                self._local.released = False
                self._dispatch()

    def close(self) -> None:
        """Stop accepting work, cancel what is queued and let idle threads exit."""
        with self._lock:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            self._work.notify_all()
            self._resume.notify_all()
        for _, fut in queued:
            fut.cancel()
