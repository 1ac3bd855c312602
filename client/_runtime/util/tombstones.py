"""Tombstones: ids the owner has deleted, remembered long enough to ignore stale duplicates.

A control message can reach the owner long after it was sent: an attempt that timed out at the
sender may still be processed after a retry of it succeeded. If the owner forgot an RRef (or a
fork) as soon as it deleted it, such a stale ForkRequest would re-create the fork and keep the
RRef alive forever, and a stale RemoteCall would re-run a user function. The owner therefore
keeps a tombstone per deleted id for ``ttl`` seconds, which must exceed the longest time one
attempt of a message can stay in flight (its deadline), not the whole retry budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["Tombstones"]

K = TypeVar("K", bound=Hashable)


class Tombstones(Generic[K]):
    """A set whose members expire ``ttl`` seconds after they were added (None: never).

    Members are kept in insertion order, which is also expiry order because the ttl is constant
    and the clock monotonic, so pruning only ever looks at the oldest members.
    """

    __slots__ = ("_ttl", "_clock", "_expiry", "_peak")

    def __init__(self, ttl: float | None, clock: Callable[[], float]) -> None:
        self._ttl = ttl
        self._clock = clock
        self._expiry: dict[K, float] = {}
        self._peak = 0

    def add(self, key: K) -> None:
        """Remember ``key`` (again, restarting its lifetime) and forget expired members."""
        self._expiry.pop(key, None)
        self._expiry[key] = math.inf if self._ttl is None else self._clock() + self._ttl
        self._peak = max(self._peak, len(self._expiry))
        self.prune()

    def prune(self) -> None:
        """Forget members whose lifetime is over."""
        if self._ttl is None:
            return
        now = self._clock()
        while self._expiry:
            oldest = next(iter(self._expiry))
            if self._expiry[oldest] > now:
                break
            del self._expiry[oldest]
        if len(self._expiry) * 4 < self._peak:
            # A dict never shrinks its table on deletion; after a burst of deletes (100,000
            # remote() calls) copy it so the memory goes back.
            self._expiry = dict(self._expiry)
            self._peak = len(self._expiry)

    def __contains__(self, key: object) -> bool:
        return key in self._expiry

    def __len__(self) -> int:
        return len(self._expiry)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._expiry))
