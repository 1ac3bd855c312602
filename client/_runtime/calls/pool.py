"""The serving pool: at most N threads *running* user code, any number parked in waits.

A thread of the pool that blocks in ``Future.wait`` (or a blocking RPC) gives its slot back for
the duration (``blocking``); the pool then starts another thread if work is queued. So a handler
waiting on a nested call never holds a serving slot, and chains like A->B->C->A cannot deadlock
however small ``num_worker_threads`` is, while CPU-bound handlers still run at most N at a time.

Work is handed to a thread directly: an idle thread sleeps on its own parking lock, and
``submit`` takes a slot for the task, gives the task to that thread and releases its lock, after
leaving the pool's lock. The woken thread runs the task without touching the pool's lock, so a
hand-off costs one wake-up. (With a shared condition variable, the woken thread first had to
take the lock the submitting thread still held: a second sleep and wake-up per call, ~30-45 us
of the fast lane's round trip on the development machine, where every cross-core wake-up is a
VM exit.) A thread that finishes a task takes the next queued one itself. Idle threads block
(no polling); threads beyond N exit after a while.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future as ConcurrentFuture
from types import TracebackType
from typing import Any

from ... import futures as _futures

__all__ = ["ServingPool"]

log = logging.getLogger(__name__)
_IDLE_EXIT_SECONDS = 30.0

_Task = tuple[Callable[..., Any], tuple[Any, ...], ConcurrentFuture[Any] | None]


class _Worker:
    """One pool thread's parking place: ``park`` is held while the thread waits for a task."""

    __slots__ = ("park", "task")

    def __init__(self) -> None:
        self.park = threading.Lock()
        self.park.acquire()
        self.task: _Task | None = None


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
        #: Threads back from a blocking wait sleep here until a slot is granted to them.
        self._resume = threading.Condition(self._lock)
        self._queue: collections.deque[_Task] = collections.deque()
        self._idle: list[_Worker] = []  # parked threads, the most recent last (warm caches)
        self._running = 0  # slots taken (granted resumers included)
        self._resuming = 0  # threads back from a blocking wait, waiting for a slot
        self._grants = 0  # slots granted to resuming threads that have not woken yet
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
        self._put((fn, args, fut))
        return fut

    def run(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` when no one waits for its result (a call's serving, a reply's
        completion): no Future is made or completed. What it raises is logged.

        Raises:
            RuntimeError: the pool is closed.
        """
        self._put((fn, args, None))

    def _put(self, task: _Task) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("serving pool is closed")
            if self._slot_for_new_work():
                self._running += 1
                worker = self._assign(task)
            else:
                self._queue.append(task)
                worker = None
        if worker is not None:
            worker.park.release()

    def on_pool_thread(self) -> bool:
        """Whether the calling thread is one of this pool's."""
        return getattr(self._local, "member", False)

    def _slot_for_new_work(self) -> bool:
        # With the lock held: a slot is free and no thread back from a wait is owed one.
        return self._running < self._limit and self._resuming <= self._grants

    def _grant_to_resumer(self) -> bool:
        # With the lock held, a slot free: hand it to a thread back from a blocking wait, if
        # one is still waiting without a grant.
        if self._resuming <= self._grants:
            return False
        self._grants += 1
        self._running += 1
        self._resume.notify()
        return True

    def _assign(self, task: _Task) -> _Worker | None:
        # With the lock held and a slot taken for ``task``: give it to an idle thread (returned:
        # the caller wakes it after leaving the lock) or to a new thread.
        if self._idle:
            worker = self._idle.pop()
            worker.task = task
            return worker
        self._threads += 1
        self._counter += 1
        worker = _Worker()
        worker.task = task  # not a Thread argument: Thread keeps its arguments until it exits
        threading.Thread(
            target=self._loop, args=(worker,), name=f"{self._name}-{self._counter}", daemon=True
        ).start()
        return None

    def _slot_freed(self) -> _Worker | None:
        # With the lock held, after ``_running`` went down: resuming threads get the slot
        # first, then queued work. Returns a parked thread to wake after leaving the lock.
        if self._running >= self._limit or self._grant_to_resumer():
            return None
        if self._queue:
            self._running += 1
            return self._assign(self._queue.popleft())
        return None

    def _loop(self, me: _Worker) -> None:
        _futures.set_blocking_hook(self.blocking)
        self._local.member = True
        task, me.task = me.task, None
        while task is not None:
            fn, args, fut = task
            if fut is None:
                try:
                    fn(*args)
                except BaseException:  # noqa: BLE001 - no one waits for it: it is logged
                    log.exception("serving pool: %r failed", fn)
            elif fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - delivered to the future
                    fut.set_exception(exc)
            # Drop every reference to the finished task before parking: a parked thread must not
            # keep its last task's arguments alive (an RRef among them would never be released).
            del fn, args, fut
            task = None
            task = self._next(me)

    def _next(self, me: _Worker) -> _Task | None:
        # After a task: take the next queued one, or park until one is handed over; None when
        # this thread should exit.
        with self._lock:
            self._running -= 1
            if self._running < self._limit:
                self._grant_to_resumer()
            if self._queue and self._running < self._limit and not self._closed:
                self._running += 1
                return self._queue.popleft()
            if self._closed:
                self._threads -= 1
                return None
            me.task = None
            self._idle.append(me)
            extra = self._threads > self._limit
        if not me.park.acquire(timeout=_IDLE_EXIT_SECONDS if extra else -1):
            with self._lock:
                if me in self._idle:  # nobody handed it a task meanwhile: an extra thread exits
                    self._idle.remove(me)
                    self._threads -= 1
                    return None
            me.park.acquire()  # a task was handed over just as the wait timed out
        task, me.task = me.task, None  # None: woken by close()
        return task

    def adopt(self) -> None:
        """Make the calling thread, not one of the pool's, serve under the pool's slots (the
        bulk lane's reader serves calls where they arrive): it holds no slot until it enters
        :meth:`slot`, and a blocking wait inside gives the slot back as a pool thread's does."""
        local = self._local
        if getattr(local, "member", False):
            return
        _futures.set_blocking_hook(self.blocking)
        local.member = True
        local.released = True

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """On an adopted thread: take a slot for the block (waiting, ahead of queued work, as
        a thread back from a blocking wait does), give it back at its end."""
        self._take_slot()
        try:
            yield
        finally:
            self._release_slot()

    def try_slot(self) -> bool:
        """On an adopted thread: take a slot if one is free now (never waits: False when all
        are taken, or the pool is closed); give it back with :meth:`release_slot`."""
        with self._lock:
            if self._closed or not self._slot_for_new_work():
                return False
            self._running += 1
        self._local.released = False
        return True

    def release_slot(self) -> None:
        """Give back the slot :meth:`try_slot` took."""
        self._release_slot()

    def blocking(self) -> _Blocking:
        """Give the calling thread's slot back while it blocks; take one again afterwards."""
        return _Blocking(self)

    def _release_slot(self) -> bool:
        # Entering a blocking region; False when the thread already gave its slot back.
        local = self._local
        if getattr(local, "released", False):
            return False
        local.released = True
        with self._lock:
            self._running -= 1
            worker = self._slot_freed()
        if worker is not None:
            worker.park.release()
        return True

    def _take_slot(self) -> None:
        # Leaving a blocking region: wait for a slot granted by a finishing thread (or a free
        # one), ahead of queued work.
        with self._lock:
            if self._slot_for_new_work():
                self._running += 1
            else:
                self._resuming += 1
                while not self._grants and not self._closed:
                    self._resume.wait()
                self._resuming -= 1
                if self._grants:
                    self._grants -= 1  # ``_running`` was counted when the slot was granted
                else:  # closed: run on, the pool is going away
                    self._running += 1
        self._local.released = False

    def close(self) -> None:
        """Stop accepting work, cancel what is queued and let idle threads exit."""
        with self._lock:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            idle, self._idle = self._idle, []
            self._threads -= len(idle)
            self._resume.notify_all()
        for worker in idle:
            worker.task = None
            worker.park.release()
        for _, _, fut in queued:
            if fut is not None:
                fut.cancel()


class _Blocking:
    """The context manager of :meth:`ServingPool.blocking` (a class: it is entered per call)."""

    __slots__ = ("_pool", "_released")

    def __init__(self, pool: ServingPool) -> None:
        self._pool = pool
        self._released = False

    def __enter__(self) -> None:
        self._released = self._pool._release_slot()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._released:
            self._pool._take_slot()
