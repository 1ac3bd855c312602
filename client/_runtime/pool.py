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
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[Callable[[], Any], ConcurrentFuture[Any]]] = (
            collections.deque()
        )
        self._running = 0  # threads holding a slot
        self._idle = 0  # threads waiting for work
        self._resuming = 0  # threads back from a blocking wait, waiting for a slot (served first)
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
        with self._cond:
            if self._closed:
                raise RuntimeError("serving pool is closed")
            self._queue.append(((lambda: fn(*args)), fut))
            self._wake_or_spawn()
        return fut

    def _can_start(self) -> bool:
        return bool(self._queue) and self._running < self._limit and not self._resuming

    def _wake_or_spawn(self) -> None:
        # Called with the lock held, whenever a slot may have become free.
        if self._resuming or self._idle > 0:
            self._cond.notify_all()
        if not self._can_start():
            return
        if self._idle == 0:
            self._threads += 1
            self._counter += 1
            threading.Thread(
                target=self._work, name=f"{self._name}-{self._counter}", daemon=True
            ).start()

    def _work(self) -> None:
        _futures.set_blocking_hook(self.blocking)
        while True:
            with self._cond:
                self._idle += 1
                while not self._closed and not self._can_start():
                    extra = self._threads > self._limit
                    if not self._cond.wait(_IDLE_EXIT_SECONDS if extra else None) and extra:
                        break
                self._idle -= 1
                if self._closed or not self._can_start():
                    self._threads -= 1
                    return
                task, fut = self._queue.popleft()
                self._running += 1
            try:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(task())
                    except BaseException as exc:  # noqa: BLE001 - delivered to the future
                        fut.set_exception(exc)
            finally:
                with self._cond:
                    self._running -= 1
                    self._wake_or_spawn()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Give the calling thread's slot back while it blocks; take one again afterwards."""
        if getattr(self._local, "released", False):  # nested blocking region: already released
            yield
            return
        self._local.released = True
        with self._cond:
            self._running -= 1
            self._wake_or_spawn()
        try:
            yield
        finally:
            with self._cond:
                self._resuming += 1
                while self._running >= self._limit and not self._closed:
                    self._cond.wait()
                self._resuming -= 1
                self._running += 1
                self._local.released = False
                self._wake_or_spawn()

    def close(self) -> None:
        """Stop accepting work, cancel what is queued and let idle threads exit."""
        with self._cond:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for _, fut in queued:
            fut.cancel()
