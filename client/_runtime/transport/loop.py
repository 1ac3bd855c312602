"""The process's I/O event loop: one daemon thread running asyncio, home of the gRPC server.

It lives for the whole process (gRPC's asyncio layer binds to one loop) and is reused by every
``init_rpc``; idle, it sleeps in epoll and uses no CPU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["io_loop", "run_sync", "in_loop_thread"]

T = TypeVar("T")
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_lock = threading.Lock()


def io_loop() -> asyncio.AbstractEventLoop:
    """Return the I/O loop, starting its thread on first use."""
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            _thread = threading.Thread(target=run, name="gradwire-io", daemon=True)
            _thread.start()
            ready.wait()
            _loop = loop
        return _loop


def in_loop_thread() -> bool:
    """True when called from the I/O loop's thread (where blocking is forbidden)."""
    return _thread is not None and threading.current_thread() is _thread


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """Run ``coro`` on the I/O loop and wait for it at most ``timeout`` seconds.

    Raises:
        TimeoutError: the coroutine did not finish in time (it is cancelled).
    """
    fut = asyncio.run_coroutine_threadsafe(coro, io_loop())
    try:
        return fut.result(timeout)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise TimeoutError(f"operation did not complete within {timeout} s") from None
