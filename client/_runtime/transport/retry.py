"""Retry with exponential backoff, for idempotent control messages only (never user calls)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from ...errors import RpcTimeoutError, WorkerUnavailableError

__all__ = ["retry_with_backoff", "TRANSIENT"]

log = logging.getLogger(__name__)
T = TypeVar("T")
#: Errors worth retrying: the peer is (maybe momentarily) unreachable, or the attempt timed out.
TRANSIENT: tuple[type[BaseException], ...] = (WorkerUnavailableError, RpcTimeoutError)


def retry_with_backoff(
    attempt: Callable[[float], T],
    deadline: float,
    *,
    first_delay: float = 0.05,
    max_delay: float = 2.0,
    attempt_timeout: float = 10.0,
    transient: tuple[type[BaseException], ...] = TRANSIENT,
    what: str = "control message",
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``attempt(timeout)`` until it succeeds, a non-transient error, or ``deadline``.

    Args:
        attempt: one try; receives the seconds it may take.
        deadline: ``time.monotonic()`` value after which the last error is raised.
        first_delay, max_delay: backoff bounds (full jitter, doubling).
        attempt_timeout: upper bound of one try.
        transient: exception types that are retried.
        what: description for logs.

    Returns:
        What the successful attempt returned.

    Raises:
        The last transient error once ``deadline`` passes; any other error at once.
    """
    delay = first_delay
    tries = 0
    while True:
        tries += 1
        left = deadline - clock()
        try:
            return attempt(max(0.001, min(attempt_timeout, left)))
        except transient as exc:
            left = deadline - clock()
            if left <= 0:
                raise
            pause = min(random.uniform(0, delay), left)
            log.debug("%s failed (try %d: %s); retrying in %.3f s", what, tries, exc, pause)
            sleep(pause)
            delay = min(max_delay, delay * 2)
